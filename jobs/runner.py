"""What a worker does for one (job, layer), and the job's final step. No Celery here.

The science is a ``catalog.run.checkpoint.CheckpointRun``; this module only locks, records progress
and stores. Each layer is computed at most once at a time: the worker holds a
PostgreSQL session-level advisory lock on (job, layer) while it works, which the server
releases when the worker's connection dies, so a redelivered task after a crash can
take over while a duplicate delivery to a live worker is skipped. A layer is written in
one transaction (schema.store.write_layer), so no partial layer is ever visible, and a
layer already stored is not recomputed (unless the job was forced). The worker that
stores a job's last layer claims the job's final step (summary, view refresh) with an
atomic status update.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from enum import StrEnum

import psycopg

from catalog.config.settings import Settings, get_settings
from catalog.run.results import LayerDigest
from jobs import store_results
from jobs.locks import layer_lock_key, summary_lock_key
from schema import jobs as jobdb
from schema import reads, store
from schema.jobs import JobRow, Status
from schema.sketch import GridGeometry

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Loaded:
    """This process's model and run for one (model, checkpoint, config, device), kept
    for the next task on the same checkpoint, with the results of the layers this
    process computed (when one worker did every layer, the summary reads nothing back)."""

    key: tuple
    lm: object
    run: object
    ids: object
    results: dict[int, LayerDigest]


_CURRENT: _Loaded | None = None

def execution_for(job: JobRow, settings: Settings | None = None):
    """This worker's execution settings: the job's device, and the batch sizes and
    activation budget of its environment (they change no stored number)."""
    from catalog.config import ExecutionConfig

    s = settings or get_settings()
    changes: dict = {"device": job.device, "activation_budget": s.ncat_activation_budget}
    if s.ncat_batch_size is not None:
        changes["batch_size"] = s.ncat_batch_size
    if s.ncat_patch_chunk is not None:
        changes["patch_chunk"] = s.ncat_patch_chunk
    return ExecutionConfig(**changes)


def fit_memory(job: JobRow, config, execution, settings: Settings):
    """The execution sized to THIS worker's memory budget (NCAT_MEMORY_BUDGET, else the
    memory available here), before the job's model is loaded: the machine that enqueued or
    planned the job may not be the one running it. A smaller patch chunk, or one layer's
    activations at a time, where that fits; MemoryBudgetError where nothing does (the
    layer and its job fail with the need and the budget in the message instead of the
    process being killed for memory, which the queue would retry NCAT_MAX_ATTEMPTS times)."""
    from catalog.measuring.memory import fit_request
    from catalog.sources import inspect_model

    shape = inspect_model(job.model_name, job.step, cache_root=settings.builtin_root)
    fitted = fit_request(shape, config, execution, len(job.layers),
                         f"job {job.id} ({job.model_name}, {len(job.layers)} layers) on "
                         "this worker")
    if fitted.note:
        log.warning("%s", fitted.note)
    return fitted.execution


def _loaded(conn, job: JobRow) -> _Loaded:
    """The model, prepared run and catalog ids of the job, cached per process."""
    global _CURRENT
    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    # a config's id names it within its catalog (its rows are never changed): the config
    # is read and parsed only when this process has not prepared the run already
    info = conn.info
    key = (info.host, info.port, info.dbname, job.model_name, job.step, job.device,
           job.config_id)
    if _CURRENT is None or _CURRENT.key != key:
        _CURRENT = None  # free the previous model first
        began = time.monotonic()
        config = ScienceConfig.from_dict(jobdb.job_config(conn, job.config_id))
        settings = get_settings()
        execution = fit_memory(job, config, execution_for(job, settings), settings)
        lm = load_model(job.model_name, job.step, device=job.device,
                        dtype=config.torch_dtype(), cache_root=settings.builtin_root,
                        progress=False)  # a worker logs; bars would fill its log
        run = CheckpointRun(lm.model, lm.tokenizer, config, execution, layers=None).prepare()
        ids = store_results.register(conn, lm, config)
        store_results.write_layouts(conn, run, ids)
        _CURRENT = _Loaded(key, lm, run, ids, {})
        log.info("job %s: %s step %s prepared in process %s (%.1f s)", job.id,
                 job.model_name, job.step, os.getpid(), time.monotonic() - began)
    return _CURRENT


class Outcome(StrEnum):
    """What one delivery of a layer did."""

    UNKNOWN_JOB = "unknown job"
    SKIPPED = "skipped"  # the job is done, failed or cancelled
    BUSY = "busy"  # another session holds the layer: the task is to be sent again later
    ALREADY_DONE = "already done"
    COMPUTED = "computed"
    ALREADY_STORED = "already stored"
    FULL_GRIDS = "full grids"
    FAILED = "failed"


class Transient(Exception):
    """The layer hit a dropped database connection; it is queued again (``retry_in``).
    ``unrecorded``: the loss the database could not be told about (it was unreachable),
    for the next delivery to count ({"attempt": the start that lost it, "cause": ...})."""

    def __init__(self, message: str, retry_in: float, unrecorded: dict | None = None) -> None:
        super().__init__(message)
        self.retry_in = retry_in
        self.unrecorded = unrecorded


TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError)


class Heartbeat(threading.Thread):
    """Writes ``job_layer.heartbeat_at`` every NCAT_HEARTBEAT_SECONDS from a connection of
    its own while a layer (or a job's final step, layer None) is being worked on."""

    def __init__(self, url: str, job_id: int, layer: int | None, every: float) -> None:
        super().__init__(name=f"ncat-heartbeat-{job_id}-{layer}", daemon=True)
        self.url, self.job_id, self.layer, self.every = url, job_id, layer, every
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                with store.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                    jobdb.beat(conn, self.job_id, self.layer)
            except psycopg.Error as exc:  # the next beat tries again
                log.warning("heartbeat of job %s layer %s: %s", self.job_id, self.layer, exc)

    def __enter__(self) -> Heartbeat:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()


def process_layer(url: str, job_id: int, layer: int, worker: str,
                  lost: dict | None = None) -> Outcome:
    """Compute and store one layer of a job, then the job's layers that no one has
    started (``rest_of_job``); returns what happened to the layer asked for.

    Raises Transient when the database connection dropped: the layer was put back in the
    queue through a fresh connection (or, when the database is still away, the loss rides
    on the task sent again: ``Transient.unrecorded``, given back here as ``lost``), and the
    task should be sent again after ``retry_in`` seconds.
    """
    began = time.monotonic()
    outcome = _deliver(url, job_id, layer, worker, lost)
    if outcome is Outcome.COMPUTED:
        rest_of_job(url, job_id, worker, began)
    return outcome


def rest_of_job(url: str, job_id: int, worker: str, began: float) -> None:
    """Layer affinity: this process has the job's checkpoint prepared (the model loaded,
    every layer's grid pass run), so it goes on with the job's layers no one has started,
    each under its own lock as its own delivery would (one another session holds is left
    to it); their messages then find them done. Two processes on the two layers of one
    checkpoint each prepared it (``jobs.enqueue.send_order`` deals out every job's first
    layer before the others). It stops past half the visibility timeout (the broker
    would deliver the task again) and where the database connection drops."""
    limit = get_settings().ncat_visibility_timeout / 2
    try:
        with store.connect(url, autocommit=True) as conn:
            todo = jobdb.queued_layers(conn, job_id)
    except TRANSIENT as exc:  # the layer asked for is stored; the others have messages
        log.warning("job %s: its other layers left to their own messages (%s)", job_id, exc)
        return
    for layer in todo:
        if time.monotonic() - began > limit:
            return
        try:
            outcome = _deliver(url, job_id, layer, worker, None)
        except Transient as exc:
            log.warning("job %s layer %s: left to its own message (%s)", job_id, layer, exc)
            return
        log.info("job %s layer %s: %s (taken on with its checkpoint prepared here)",
                 job_id, layer, outcome)


def _deliver(url: str, job_id: int, layer: int, worker: str, lost: dict | None) -> Outcome:
    """One delivery of the layer (``process_layer`` without the rest of its job)."""
    started: dict = {}  # the start (attempt number) this delivery made, once it made one
    try:
        return _process(url, job_id, layer, worker, lost, started)
    except TRANSIENT as exc:
        message = f"{type(exc).__name__}: {exc}".strip()
        log.warning("job %s layer %s: database connection lost (%s)", job_id, layer, message)
        return _after_lost_connection(url, job_id, layer, message, started.get("attempt"),
                                      carried=lost)


def _process(url: str, job_id: int, layer: int, worker: str, lost: dict | None,
             started: dict) -> Outcome:
    with store.connect(url, autocommit=True) as conn:
        job = jobdb.load_job(conn, job_id)
        if job is None:
            return Outcome.UNKNOWN_JOB
        if job.status in (Status.CANCELLED, Status.FAILED, Status.DONE):
            log.info("job %s is %s: layer %s skipped", job_id, job.status, layer)
            return Outcome.SKIPPED
        key = layer_lock_key(job_id, layer)
        if not jobdb.try_lock(conn, key):
            return Outcome.BUSY  # another session holds the layer: the task is sent again later
        try:
            with Heartbeat(url, job_id, layer, get_settings().ncat_heartbeat_seconds):
                return _process_locked(conn, url, job, layer, worker, lost, started)
        finally:
            if not conn.closed and not conn.broken:
                jobdb.unlock(conn, key)


def _after_lost_connection(url: str, job_id: int, layer: int, message: str,
                           attempt: int | None, carried: dict | None = None) -> Outcome:
    """Through a fresh connection: the layer back to queued, or its job failed once the
    layer has used up its attempts. Raises Transient to have the task sent again; when
    the database cannot be reached to record the loss, the loss of start ``attempt``
    rides on that task (``Transient.unrecorded``), so that the next delivery counts it as
    what it was instead of as a process that died; a delivery that lost the database
    before starting the layer (it may be another worker's to run) passes on the loss it
    was ``carried`` and touches nothing."""
    s = get_settings()
    if attempt is None:
        raise Transient(message, retry_in=5.0, unrecorded=carried)
    try:
        with store.connect(url, autocommit=True, connect_timeout=10) as conn:
            status, resends = jobdb.layer_losses(conn, job_id, layer)
            lost = resends + 1
            if status != Status.RUNNING:  # stored already (the final step lost it): again
                raise Transient(message, retry_in=5.0)
            if jobdb.lose_layer(conn, job_id, layer, resends=resends,
                                limit=s.ncat_max_attempts, then="resend",
                                cause=f"its database connection was lost ({message})",
                                kind="database unreachable"):
                return Outcome.FAILED
    except psycopg.Error as exc:
        log.warning("job %s layer %s: database still unreachable (%s); the layer is sent "
                    "again with its loss, to be counted once the database answers",
                    job_id, layer, exc)
        unrecorded = {
            "attempt": attempt,
            "cause": f"its database connection was lost ({message}) and the database "
                     f"could not be reached to record it ({type(exc).__name__})"}
        raise Transient(message, retry_in=5.0, unrecorded=unrecorded) from None
    raise Transient(message, retry_in=min(5.0 * 2 ** max(lost - 1, 0), 300.0))


def _process_locked(conn, url: str, job: JobRow, layer: int, worker: str,
                    lost: dict | None, started: dict) -> Outcome:
    state = jobdb.layer_state(conn, job.id, layer)
    if state is not None and state.status == Status.DONE:
        finalize_if_complete(conn, url, job.id)  # a retried job whose final step never ran
        return Outcome.ALREADY_DONE
    if state is not None and state.status == Status.RUNNING and _lost_before(conn, job.id,
                                                                             layer, state,
                                                                             lost):
        return Outcome.FAILED
    started["attempt"] = jobdb.start_layer(conn, job.id, layer, worker)
    try:
        here = _loaded(conn, job)
        jobdb.set_checkpoint(conn, job.id, here.ids.checkpoint_id)
        stored = reads.stored_layers(conn, checkpoint_id=here.ids.checkpoint_id,
                                     config_id=here.ids.config_id)
        if job.grid_neurons is not None:
            outcome = _fill_full_grids(conn, here, job, layer, stored)
        elif job.force or layer not in stored:
            result = store_results.store_layer(conn, here.run, here.ids, layer,
                                               here.lm.tokenizer, worker)
            here.run.release(layer)
            here.results[layer] = result.digest(here.run.config.rank_sign)
            outcome = Outcome.COMPUTED
        else:
            outcome = Outcome.ALREADY_STORED
    except TRANSIENT:
        raise
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        log.exception("job %s layer %s failed", job.id, layer)
        with store.connect(url, autocommit=True) as fresh:  # conn may be what failed
            jobdb.fail_layer(fresh, job.id, layer, message)
        return Outcome.FAILED
    jobdb.finish_layer(conn, job.id, layer, Status.DONE)
    finalize_if_complete(conn, url, job.id)
    return outcome


def _lost_before(conn, job_id: int, layer: int, state: jobdb.LayerState,
                 lost: dict | None) -> bool:
    """The layer is marked running, yet this delivery holds its lock: its last start was
    lost. If this task was sent again by the start that lost its database connection
    (``lost`` names that start, and no start came after it), the loss is counted as that;
    otherwise the start died without a word (``poisoned``). True if the layer failed."""
    if lost is not None and lost.get("attempt") == state.attempts:
        log.warning("job %s: layer %s lost (%s)", job_id, layer, lost["cause"])
        return jobdb.lose_layer(conn, job_id, layer, resends=state.resends,
                                limit=get_settings().ncat_max_attempts,
                                cause=str(lost["cause"]), then="count",
                                kind="database unreachable")
    return poisoned(conn, job_id, layer, state)


def poisoned(conn, job_id: int, layer: int, state: jobdb.LayerState) -> bool:
    """This delivery holds the layer's lock, yet the layer is still marked running: the
    start before it died without a word (its process killed, out of memory, a crash in a
    kernel), and Celery delivered the task again. Count the loss; once the layer has been
    lost NCAT_MAX_ATTEMPTS times (since a person last queued it), fail it and its job with
    the cause instead of starting it again. True if it failed."""
    cause = (f"the process running it (last on {state.worker or 'a worker'}) died without "
             f"an error (killed, out of memory or a crash), after {state.attempts} start(s)")
    log.warning("job %s: layer %s lost (%s)", job_id, layer, cause)
    return jobdb.lose_layer(conn, job_id, layer, resends=state.resends,
                            limit=get_settings().ncat_max_attempts, cause=cause, then="count",
                            kind="process died")


def _fill_full_grids(conn, here: _Loaded, job: JobRow, layer: int,
                     stored: list[int]) -> Outcome:
    """A full-grid job: the layer's grid pass, and the full grids of the job's neurons
    written over their sketches. The layer must be stored (its sketches exist)."""
    if layer not in stored:
        raise ValueError(f"layer {layer} of this checkpoint is not stored under the job's "
                         "config; catalog it before asking for its full grids")
    run = here.run
    neurons = sorted(set(job.grid_neurons or []))
    bad = [n for n in neurons if not 0 <= n < run.d_mlp]
    if bad:
        raise ValueError(f"neurons {bad} do not exist; layer {layer} has neurons "
                         f"0..{run.d_mlp - 1}")
    acts = run.activations(layer)
    ops = list(run.config.operators)
    grids = [acts[run.table.op_index(op)][:, neurons].T for op in ops]
    layouts = [GridGeometry(g.side, g.valid) for g in run.grid_layouts()]
    n = store.write_full_grids(conn, model_id=here.ids.model_id,
                               checkpoint_id=here.ids.checkpoint_id,
                               config_id=here.ids.config_id, layer=layer, neurons=neurons,
                               ops=ops, grids=grids, layouts=layouts)
    run.release(layer)
    log.info("job %s layer %s: full grids of %d neurons written", job.id, layer, n)
    return Outcome.FULL_GRIDS


def finalize_if_complete(conn, url: str, job_id: int) -> bool:
    """If every layer of the job is stored, claim and run its final step once. The
    claimer holds the job's summary lock while it works: the reconciler resumes a job
    left in 'summarizing' only when no one holds it."""
    key = summary_lock_key(job_id)
    if not jobdb.try_lock(conn, key):
        return False  # someone is at the final step
    try:
        if not jobdb.claim_summary(conn, job_id):
            return False
        job = jobdb.load_job(conn, job_id)
        assert job is not None
        try:
            with Heartbeat(url, job_id, None, get_settings().ncat_heartbeat_seconds):
                if job.grid_neurons is None:  # a full-grid job has no summary
                    _summarize(conn, job)
                    _fill_final_circuits(conn, job)
        except TRANSIENT:
            raise
        except Exception as exc:
            log.exception("job %s summary failed", job_id)
            with store.connect(url, autocommit=True) as fresh:
                jobdb.fail_job(fresh, job_id, f"summary: {type(exc).__name__}: {exc}", None)
            return False
        jobdb.mark_done(conn, job_id)
        return True
    finally:
        if not conn.closed and not conn.broken:
            jobdb.unlock(conn, key)


def _fill_final_circuits(conn, job: JobRow) -> None:
    """After a summary: if it was the model's final checkpoint under the config, measure its
    circuit at the earlier checkpoints summarized before it (jobs.final_circuits), before
    the job is marked done. A failure here is logged and does not fail the job (its own
    rows are written); ``ncat final-circuit`` fills the gap. Not while a later checkpoint
    of the model under the config is still queued or running: that one, summarized after
    this one, measures it at every earlier checkpoint, this one included (measured here
    too, it was measured once per checkpoint queued after it: 91 loads, preparations and
    curves for the demo's 14 checkpoints, queued in training order, in place of 13). A
    later job that then fails or is cancelled leaves the earlier checkpoints to
    ``ncat final-circuit``."""
    from jobs import final_circuits

    if jobdb.later_pending(conn, job):
        log.info("job %s: a later checkpoint of %s is still to measure; it measures the "
                 "final circuit at the earlier ones", job.id, job.model_name)
        return
    here = _loaded(conn, job)
    try:
        steps = final_circuits.fill(conn, model_id=here.ids.model_id,
                                    config_id=here.ids.config_id, execution=here.run.execution,
                                    cache_root=get_settings().builtin_root)
    except TRANSIENT:
        raise
    except Exception:
        log.exception("job %s: the final circuit at earlier checkpoints failed "
                      "(ncat final-circuit measures it)", job.id)
        return
    if steps:
        log.info("job %s: final circuit measured at steps %s", job.id, steps)


def _summarize(conn, job: JobRow) -> None:
    """Checkpoint summary from the layers' results (any worker may have written them)."""
    here = _loaded(conn, job)
    layers = sorted(job.layers)
    if set(layers) <= set(here.results):
        digests = {layer: here.results[layer] for layer in layers}
    else:
        digests = store_results.stored_digests(conn, here.ids, here.run.config, layers,
                                 here.lm.model.cfg.d_mlp)
    final = store_results.final_circuit(conn, here.ids, here.run.config, here.lm.model,
                                        here.lm.info.checkpoint)
    summary = here.run.summarize_digests(digests, final=final[0] if final else None)
    with conn.transaction():
        store_results.write_summary(conn, here.ids, summary, final[1] if final else None)
    store.refresh_views(conn, here.ids.model_id, here.ids.checkpoint_id, here.ids.config_id)
