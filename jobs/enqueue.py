"""Enqueueing, cancelling and retrying jobs; reading their progress.

A job is (model, checkpoint, measurement config, layers). Its key is a hash of those,
so enqueueing the same work again finds the existing job instead of redoing it
(``force`` recomputes it). Work the catalog already holds (stored by ``ncat catalog``,
or by an earlier job under another key) becomes a job that is done at once. Everything
is validated before anything is written or queued: unknown models or checkpoints,
operand ranges beyond the tokenizer's single-token limit, unknown operators, empty or
out-of-range layer sets.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from catalog.config import CATALOG_VERSION, ScienceConfig
from schema import jobs as jobdb
from schema import reads, store
from schema.database import first_line
from schema.jobs import Status


class QueuedWithoutBroker(RuntimeError):
    """The jobs are committed, but the broker failed while their messages were sent: a
    worker's reconciler sends what is missing. ``jobs`` is what was queued."""

    def __init__(self, jobs: list, cause: BaseException) -> None:
        first = first_line(cause)
        super().__init__(
            f"the jobs are queued in the database, but the job broker failed while their "
            f"messages were sent ({type(cause).__name__}: {first}); a running worker's "
            "reconciler sends them within NCAT_STALE_SECONDS, or `ncat retry JOB` once the "
            "broker is back")
        self.jobs = jobs


class EnqueueError(ValueError):
    """A request that cannot be queued; the message says what to change."""


@dataclass
class Planned:
    model: str
    step: int | None
    layers: list[int]
    shape: object = field(default=None, compare=False, repr=False)  # its ModelShape


def parse_checkpoints(model: str, spec: str | list | None) -> list[int | None]:
    """None (final weights), a list, 'all', '0,512,3000' or 'start:stop:step' (stop inclusive)."""
    if spec is None:
        return [None]
    if isinstance(spec, list | tuple):
        out = list(spec)
    elif spec == "all":
        from catalog.sources import list_checkpoints

        steps = list_checkpoints(model)
        if not steps:
            raise EnqueueError(f"{model!r} has no checkpoints to catalog ('all' found none)")
        out = steps
    elif ":" in spec:
        try:
            start, stop, step = (int(x) for x in spec.split(":"))
        except ValueError:
            raise EnqueueError(f"checkpoint range must be start:stop:step, got {spec!r}") from None
        if step <= 0 or stop < start:
            raise EnqueueError(f"checkpoint range {spec!r} is empty; use start:stop:step with "
                               "stop >= start and step > 0")
        out = list(range(start, stop + 1, step))
    else:
        try:
            out = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise EnqueueError(f"checkpoints must be 'all', a list like 0,512,3000 or a range "
                               f"start:stop:step; got {spec!r}") from None
    if not out:
        raise EnqueueError("the checkpoint list is empty")
    if any(s is not None and s < 0 for s in out):
        raise EnqueueError(f"checkpoint steps must be >= 0, got {out}")
    return out


def validate_request(model: str, checkpoints, config: ScienceConfig,
                     layers: list[int] | None) -> list[Planned]:
    """Validate a request completely; raises EnqueueError naming what is wrong."""
    # imported here: loading transformer_lens takes seconds, and status, cancel and retry
    # (which share this module) need none of it
    from catalog.labels.families import check_names
    from catalog.measuring.prompts import check_context, longest_prompt
    from catalog.sources import ModelSourceError, canonical_name, inspect_model

    if not model:
        raise EnqueueError("model name is empty")
    try:
        check_names(config.families)
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None
    try:
        model = canonical_name(model)
        steps = parse_checkpoints(model, checkpoints)
        out = []
        checked: set = set()
        for step in steps:
            shape = inspect_model(model, step)
            config.check_tokens(shape.numbers)
            if shape.tokenizer is not None and shape.n_ctx not in checked:
                # every checkpoint of a model has the same tokenizer and context
                check_context(longest_prompt(shape.tokenizer, shape.numbers, config),
                              shape.n_ctx, config, model)
                checked.add(shape.n_ctx)
            todo = list(range(shape.n_layers)) if layers is None else sorted(set(layers))
            if not todo:
                raise EnqueueError("the layer set is empty; give at least one layer")
            bad = [x for x in todo if not 0 <= x < shape.n_layers]
            if bad:
                raise EnqueueError(f"layers {bad} do not exist; {model} has layers "
                                   f"0..{shape.n_layers - 1}")
            out.append(Planned(model, step, todo, shape))
        return out
    except ModelSourceError as exc:
        raise EnqueueError(str(exc)) from None
    except EnqueueError:
        raise
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None


def latest_first(step: int | None) -> tuple[bool, int]:
    """A sort key of checkpoints, the latest step first (the final weights, no step,
    last): each earlier checkpoint's summary then finds its model's final checkpoint
    summarized and measures the final circuit in its own summary (catalog.circuits.final),
    where one summarized before it would have to be loaded and prepared again afterwards
    (jobs.final_circuits.fill)."""
    return step is None, -(step or 0)


def send_order(pending: list[tuple[int | None, int, int]]) -> list[tuple[int, int]]:
    """(job, layer) in the order their messages go out, from (step, job, layer): the
    latest checkpoint's layers first (``latest_first``), then the first layer of every
    other job, latest first, then their second layers, and so on. A process that computed
    a layer goes on with the rest of its job (``jobs.runner.rest_of_job``), so the next
    message a free process takes is another checkpoint's first layer rather than a layer
    of the checkpoint another process has prepared; the latest checkpoint's layers run
    side by side, so its summary comes first."""
    by_job: dict[int, list[int]] = {}  # job -> its layers, the jobs latest first
    for _, job, layer in sorted(pending, key=lambda x: latest_first(x[0])):
        by_job.setdefault(job, []).append(layer)
    if not by_job:
        return []
    (first, first_layers), *rest = [(job, sorted(v)) for job, v in by_job.items()]
    out = [(first, layer) for layer in first_layers]
    for i in range(max((len(v) for _, v in rest), default=0)):
        out += [(job, v[i]) for job, v in rest if i < len(v)]
    return out


def job_key(model: str, step: int | None, config: ScienceConfig, layers: list[int]) -> str:
    blob = json.dumps({"model": model, "step": step, "config": config.config_hash(),
                       "layers": sorted(layers)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Enqueued:
    job_id: int
    model: str
    step: int | None
    layers: list[int]
    created: bool  # False: the same job existed already
    stored: bool = False  # True: new, but the catalog held all of it, so nothing was queued
    note: str = ""  # what happened, in words (full-grid jobs)


def enqueue(url: str, model: str, checkpoints=None, config: ScienceConfig | None = None,
            layers: list[int] | None = None, device: str = "cpu", force: bool = False,
            send=None) -> list[Enqueued]:
    """Create (or find) one job per checkpoint and queue its layers, the latest checkpoint's
    first (``send_order``); the jobs are returned in the order asked for.

    ``send(job_id, layer)`` queues one task; by default through Celery.
    """
    config = config or ScienceConfig()
    planned = validate_request(model, checkpoints, config, layers)
    send = send or _broker_send(url)
    results, to_send = [], []
    with store.connect(url) as conn, conn.transaction():
        config_id = store.upsert_config(conn, config=config.as_dict(),
                                        config_hash=config.config_hash(),
                                        catalog_version=CATALOG_VERSION)
        for p in planned:
            key = job_key(p.model, p.step, config, p.layers)
            have = None if force else reads.find_stored(
                conn, model_name=p.model, step=p.step, config_hash=config.config_hash())
            done = have is not None and have.covers(p.layers)
            job_id = jobdb.insert_job(conn, key=key, model=p.model, step=p.step,
                                      config_id=config_id, layers=p.layers, device=device,
                                      force=force, done=done,
                                      checkpoint_id=have.checkpoint_id if have else None)
            if job_id is not None:
                if not done:
                    to_send += [(p.step, job_id, layer) for layer in p.layers]
                results.append(Enqueued(job_id, p.model, p.step, p.layers, True, stored=done))
                continue
            job_id = jobdb.job_id_by_key(conn, key)
            if force:
                jobdb.requeue(conn, job_id, only_unfinished=False, force=True)
                to_send += [(p.step, job_id, layer) for layer in p.layers]
            results.append(Enqueued(job_id, p.model, p.step, p.layers, False))
    # after commit: a worker must find the rows
    _send_all(send, send_order(to_send), results)
    return results


def enqueue_full_grid(url: str, model: str, step: int | None, config: ScienceConfig,
                      layer: int, neurons: list[int], device: str = "cpu",
                      send=None) -> Enqueued:
    """Queue a full-grid job: the full-resolution grids of ``neurons`` of one stored layer,
    written over their sketches (schema.sketch). Done at once when they are full already.
    The layer must be stored under ``config`` at that checkpoint."""
    from catalog.sources import ModelSourceError, canonical_name

    if not neurons:
        raise EnqueueError("no neurons given; name at least one neuron of the layer")
    neurons = sorted({int(n) for n in neurons})
    try:
        model = canonical_name(model)
    except (ModelSourceError, ValueError) as exc:
        raise EnqueueError(str(exc)) from None
    send = send or _broker_send(url)
    config_hash = config.config_hash()
    where = f"{model} step {step}" if step is not None else model
    with store.connect(url) as conn, conn.transaction():
        have = reads.find_stored(conn, model_name=model, step=step, config_hash=config_hash)
        if have is None or layer not in have.layers:
            raise EnqueueError(f"layer {layer} of {where} is not stored under this config; "
                               "catalog it first (ncat enqueue or ncat catalog)")
        config_id, stored, d_mlp = jobdb.grids_of(conn, have.checkpoint_id, config_hash,
                                                  layer, neurons)
        missing = [n for n in neurons if n not in stored]
        if missing:
            raise EnqueueError(f"neurons {missing} have no grids in layer {layer} of {where} "
                               f"(its neurons are 0..{d_mlp - 1})")
        done = not any(stored.values())
        key = hashlib.sha256(json.dumps({"full_grid": True, "model": model, "step": step,
                                         "config": config_hash, "layer": layer,
                                         "neurons": neurons}, sort_keys=True).encode()).hexdigest()
        job_id = jobdb.insert_job(conn, key=key, model=model, step=step, config_id=config_id,
                                  layers=[layer], device=device, force=False, done=done,
                                  checkpoint_id=have.checkpoint_id, grid_neurons=neurons)
        created = job_id is not None
        note = "already full, nothing queued" if done else "queued"
        if job_id is None:
            job_id = jobdb.job_id_by_key(conn, key)
            if not done and jobdb.job_status(conn, job_id) in (Status.DONE, Status.FAILED,
                                                               Status.CANCELLED):
                jobdb.requeue(conn, job_id, only_unfinished=False, force=False)
                note = "queued again"
            elif not done:
                done, note = True, "queued already"  # send nothing more
    result = Enqueued(job_id, model, step, [layer], created, stored=done and created, note=note)
    if not done:
        _send_all(send, [(job_id, layer)], [result])
    return result


class _BrokerSend:
    """The default sender, made once the broker has answered (nothing is written
    otherwise); ``verify`` after the last message raises ``BrokerRestarted`` if the broker
    restarted meanwhile (a restarted Redis without persistence has lost what it held)."""

    def __init__(self, database_url: str) -> None:
        from catalog.config.settings import get_settings
        from jobs.broker import check_broker, resolve_redis_url
        from schema.identity import identity_of

        self.url = resolve_redis_url(get_settings())
        self.run_id = check_broker(self.url)
        self.catalog = identity_of(database_url)  # every message names its catalog

    def __call__(self, job_id: int, layer: int) -> None:
        _celery_send(job_id, layer, self.catalog)

    def verify(self) -> None:
        from jobs.broker import BrokerRestarted, check_broker

        if check_broker(self.url) != self.run_id:
            raise BrokerRestarted()


def _broker_send(database_url: str):
    return _BrokerSend(database_url)


BROKER_ERRORS = ("redis", "kombu", "amqp", "celery")


def broker_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker's (a client library's error, or the connection's)."""
    return type(exc).__module__.split(".")[0] in BROKER_ERRORS or isinstance(
        exc, ConnectionError | OSError)


def _send_all(send, pairs: list[tuple[int, int]], results: list) -> None:
    """Send each (job, layer) after the rows committed; a broker failure part-way is
    QueuedWithoutBroker (the rows stand, and the reconciler sends the rest)."""
    try:
        for job_id, layer in pairs:
            send(job_id, layer)
        if pairs and hasattr(send, "verify"):
            send.verify()
    except Exception as exc:
        if broker_failed(exc):
            raise QueuedWithoutBroker(results, exc) from exc
        raise


def _celery_send(job_id: int, layer: int, catalog: str) -> None:
    from jobs.celery_app import send_layer

    send_layer(_app(), job_id, layer, catalog=catalog)


def celery_sender(settings, database_url: str):
    """A ``send(job_id, layer)`` through the broker and queue of ``settings``, for the
    catalog at ``database_url``."""
    from jobs.celery_app import make_app, send_layer
    from schema.identity import identity_of

    app = make_app(settings)
    catalog = identity_of(database_url)

    def send(job_id: int, layer: int) -> None:
        send_layer(app, job_id, layer, settings.ncat_queue, catalog=catalog)

    return send


_APP = None


def _app():
    global _APP
    if _APP is None:
        from jobs.celery_app import make_app

        _APP = make_app()
    return _APP


def cancel(url: str, job_id: int) -> str:
    """Stop a job: queued layers are skipped; layers already stored stay."""
    with store.connect(url) as conn, conn.transaction():
        status = jobdb.cancel(conn, job_id)
    if status is None:
        return "cancelled"
    if status == "missing":
        raise EnqueueError(f"there is no job {job_id}")
    raise EnqueueError(f"job {job_id} is {status}; only queued or running jobs can be "
                       "cancelled")


def retry(url: str, job_id: int, send=None) -> list[int]:
    """Queue again the unfinished layers of any job that is not done; returns them.

    That covers failed and cancelled jobs, and jobs whose messages were lost or whose
    worker died (queued, running, or stuck in summarizing). When every layer is stored
    already, one message goes out for the job's first layer: the worker finds it done
    and runs the missing final step (summary, view refresh).
    """
    send = send or _broker_send(url)
    with store.connect(url) as conn, conn.transaction():
        status = jobdb.job_status(conn, job_id)
        if status is None:
            raise EnqueueError(f"there is no job {job_id}")
        if status == Status.DONE:
            raise EnqueueError(f"job {job_id} is done; only failed or cancelled jobs "
                               "can be retried (and jobs that are stuck); `ncat enqueue "
                               "--force` recomputes a finished job")
        layers = jobdb.requeue(conn, job_id, only_unfinished=True, force=False)
        to_send = layers
        if not layers:
            jobdb.resume_summary(conn, job_id)
            to_send = [jobdb.first_layer(conn, job_id)]
    _send_all(send, [(job_id, layer) for layer in to_send], [job_id])
    return layers


JobStatus = jobdb.JobProgress


def job_statuses(url: str, job_ids: list[int] | None = None) -> list[JobStatus]:
    """Progress of jobs (all, or the given ones), newest last."""
    with store.connect(url) as conn:
        return jobdb.progress(conn, job_ids)
