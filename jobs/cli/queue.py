"""Commands of the job queue: enqueue, worker, status, cancel, retry."""

from __future__ import annotations

import sys
import time

from jobs.cli.common import (
    QUEUED_NOT_SENT,
    Report,
    checkpoints_option,
    database_option,
    database_url,
    execution_from,
    execution_options,
    fail,
    json_option,
    loads_model,
    parse_layers,
    science_from,
    science_options,
)
from jobs.cli.measuring import MODEL_HELP
from schema.jobs import at_checkpoint


def parse_full_grid(text: str) -> tuple[int, list[int]]:
    """'LAYER:N1,N2,...' of --full-grid."""
    layer, sep, rest = text.partition(":")
    try:
        if not sep:
            raise ValueError
        neurons = [int(x) for x in rest.split(",") if x.strip()]
        if not neurons:
            raise ValueError
        return int(layer), neurons
    except ValueError:
        raise ValueError(f"--full-grid takes LAYER:NEURON[,NEURON...], e.g. 3:17,250; "
                         f"got {text!r}") from None


def cmd_enqueue(args) -> int:
    from jobs.enqueue import (
        EnqueueError,
        QueuedWithoutBroker,
        enqueue,
        enqueue_full_grid,
        parse_checkpoints,
    )
    from schema.engine import SchemaBehind, require_current

    out = Report(args)
    try:
        config = science_from(args)
        url = require_current(database_url(args))
        if args.full_grid is not None:
            layer, neurons = parse_full_grid(args.full_grid)
            steps = parse_checkpoints(args.model, args.checkpoints)
            if len(steps) != 1:
                raise EnqueueError("--full-grid takes one checkpoint (--checkpoints STEP)")
            j = enqueue_full_grid(url, args.model, steps[0], config, layer, neurons,
                                  device=args.device or "cpu")
            out.say(f"job {j.job_id}: full grids of layer {layer} neurons "
                    f"{','.join(map(str, neurons))} of {at_checkpoint(j.model, j.step)}: "
                    f"{j.note}")
            out.put(jobs=[{"job": j.job_id, "model": j.model, "step": j.step,
                           "layer": layer, "neurons": neurons, "note": j.note}])
            out.emit()
            return 0
        _print_estimate(url, args, config, out)
        jobs = enqueue(url, args.model, args.checkpoints, config,
                       layers=parse_layers(args.layers), device=args.device or "cpu",
                       force=args.force)
    except (EnqueueError, ValueError, SchemaBehind) as exc:
        return fail(str(exc))
    except QueuedWithoutBroker as exc:
        _print_jobs(exc.jobs, args.force, out)
        print(f"warning: {exc}", file=sys.stderr)
        out.put(sent=False, warning=str(exc))
        out.emit()
        return QUEUED_NOT_SENT
    _print_jobs(jobs, args.force, out)
    out.put(sent=True)
    out.emit()
    return 0


def _print_jobs(jobs, force: bool, out: Report) -> None:
    for j in jobs:
        if j.stored:
            what = "already in the catalog, nothing queued (--force recomputes)"
        elif j.created:
            what = "queued"
        else:
            what = "queued again (--force)" if force else "exists already"
        out.say(f"job {j.job_id}: {at_checkpoint(j.model, j.step)}, {len(j.layers)} layers: "
                f"{what}")
        out.add("jobs", {"job": j.job_id, "model": j.model, "step": j.step,
                         "layers": list(j.layers), "state": what.split(",")[0]})


def _print_estimate(url: str, args, config, out: Report) -> None:
    """The cost estimate of an enqueue request, from a cached calibration (never
    calibrates: that loads the model; `ncat plan` does)."""
    from catalog.config import ExecutionConfig
    from jobs.plan import plan_request

    try:
        p = plan_request(url, args.model, args.checkpoints, config,
                         layers=parse_layers(args.layers),
                         execution=ExecutionConfig(device=args.device or "cpu"),
                         calibrate_if_missing=False)
    except ValueError:
        return  # the request itself is checked (and refused, saying why) by enqueue
    if p is None:
        out.say(f"(no cost estimate: run `ncat plan {args.model} ...` with the same flags "
                f"to calibrate this model on {args.device or 'cpu'})")
    else:
        out.say(p.render() + "\n")
    out.put(estimate=None if p is None else p.as_dict())


def cmd_plan(args) -> int:
    from jobs.enqueue import EnqueueError
    from jobs.plan import plan_request
    from jobs.signals import sigterm_exits
    from schema.engine import wait_for

    out = Report(args)
    try:
        config = science_from(args)
        url = database_url(args)  # its server hosts the calibration's scratch database
        wait_for(url, timeout=5)  # no server: exit 3 now, before the model is loaded
        execution = execution_from(args)
        # SIGTERM as Ctrl+C: the calibration's scratch databases are dropped in its finally
        with sigterm_exits():
            p = plan_request(url, args.model, args.checkpoints, config,
                             layers=parse_layers(args.layers), execution=execution,
                             recalibrate=args.recalibrate,
                             progress=None if args.quiet else out.say)
    except (EnqueueError, ValueError) as exc:
        return fail(str(exc))
    assert p is not None
    out.say(p.render())
    out.put(**p.as_dict())
    out.emit()
    return 0


def cmd_worker(args) -> int:
    import os

    from jobs.celery_app import app, queue_name

    argv = ["worker", "--loglevel", args.loglevel, "--concurrency", str(args.concurrency),
            "--queues", queue_name(), "--pool", args.pool]
    if args.pool == "prefork":  # each pool process takes its share of the cores (jobs.tasks)
        os.environ["NCAT_POOL_PROCESSES"] = str(max(1, args.concurrency))
    if args.hostname:
        argv += ["--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def cmd_status(args) -> int:
    from jobs.enqueue import job_statuses
    from schema.jobs import ACTIVE

    url = database_url(args)
    out = Report(args)  # with --watch and --json: one JSON object per refresh
    while True:
        rows = job_statuses(url, args.jobs or None)
        lines = [f"job {r.job_id:4d}  {at_checkpoint(r.model, r.step)}  "
                 f"{_bar(r.layers_done, r.layers_total)}  {r.status}"
                 + (f"  layer {r.failed_layer}: {r.error}" if r.error else "") for r in rows]
        out.say("\n".join(lines) if lines else "no jobs")
        out.put(jobs=rows)
        _print_reconciler(url, args.jobs or None, out)
        out.emit()
        if not args.watch or not any(r.status in ACTIVE for r in rows):
            return 0
        time.sleep(args.interval)
        out.say("")


def _print_reconciler(url: str, job_ids: list[int] | None, out: Report) -> None:
    """Stale layers (no live worker, quiet past NCAT_STALE_SECONDS: the reconciler will
    send them again) and the reconciler's latest actions."""
    from jobs.reconcile import stale_layers
    from schema import store
    from schema.jobs import recent_events

    with store.connect(url) as conn:
        stale = [r for r in stale_layers(conn) if job_ids is None or r[0] in job_ids]
        events = recent_events(conn, job_ids, limit=5)
    out.put(stale=[dict(zip(("job", "layer", "status", "worker", "quiet_s"), r, strict=True))
                   for r in stale],
            reconciler=[dict(zip(("at", "job", "layer", "action", "detail"), r, strict=True))
                        for r in events])
    if stale:
        out.say("stale (no live worker; the reconciler sends these again):")
        for job, layer, status, worker, quiet in stale:
            since = "never seen" if quiet is None else f"quiet {quiet:.0f} s"
            out.say(f"  job {job} layer {layer}: {status}, {since}"
                    + (f", last worker {worker}" if worker else ""))
    if events:
        out.say("reconciler, latest:")
        for at, job, layer, action, detail in events:
            where = f"job {job}" + ("" if layer is None else f" layer {layer}")
            extra = ", ".join(f"{k} {v}" for k, v in (detail or {}).items() if v is not None)
            out.say(f"  {at:%Y-%m-%d %H:%M:%S}  {where}: {action.replace('_', ' ')}"
                    + (f" ({extra})" if extra else ""))


def cmd_cancel(args) -> int:
    from jobs.enqueue import EnqueueError, cancel

    out = Report(args)
    try:
        what = cancel(database_url(args), args.job)
    except EnqueueError as exc:
        return fail(str(exc))
    out.say(f"job {args.job}: {what}")
    out.put(job=args.job, result=what)
    out.emit()
    return 0


def cmd_retry(args) -> int:
    from jobs.enqueue import EnqueueError, QueuedWithoutBroker, retry

    try:
        layers = retry(database_url(args), args.job)
    except EnqueueError as exc:
        return fail(str(exc))
    except QueuedWithoutBroker as exc:
        print(f"warning: job {args.job}: {exc}", file=sys.stderr)
        return QUEUED_NOT_SENT
    out = Report(args)
    out.say(f"job {args.job}: layers {layers} queued again")
    out.put(job=args.job, layers=layers)
    out.emit()
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("enqueue", help="queue checkpoints for the workers")
    s.add_argument("model", help=MODEL_HELP)
    checkpoints_option(s)
    s.add_argument("--force", action="store_true", help="recompute jobs that exist already")
    s.add_argument("--full-grid", default=None, metavar="LAYER:NEURONS",
                   help="instead of measuring: compute the full-resolution grids of these "
                        "neurons of a stored layer (e.g. 3:17,250), replacing their sketches; "
                        "give the checkpoint and the measurement flags it was stored with")
    database_option(s)
    science_options(s)
    execution_options(s, device_only=True)
    json_option(s)
    loads_model(s)
    s.set_defaults(fn=cmd_enqueue)

    s = sub.add_parser("plan", help="estimate the time and storage of a request before "
                                    "queueing it (calibrates once per model and device)")
    s.add_argument("model", help=MODEL_HELP)
    checkpoints_option(s)
    s.add_argument("--recalibrate", action="store_true",
                   help="measure the model on this device again instead of using the cache")
    database_option(s)
    science_options(s)
    execution_options(s)
    json_option(s)
    loads_model(s)
    s.set_defaults(fn=cmd_plan)

    s = sub.add_parser("worker", help="run a worker (one process; start one per GPU)")
    s.add_argument("--concurrency", type=int, default=1, help="pool processes (default 1)")
    s.add_argument("--pool", default="prefork", choices=("prefork", "solo"),
                   help="Celery pool: prefork (a child process per task) or solo")
    s.add_argument("--loglevel", default="info", help="Celery log level (default info)")
    s.add_argument("--hostname", default=None, help="worker name shown in job progress")
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("status", help="progress of jobs")
    s.add_argument("jobs", nargs="*", type=int, help="job ids (default all)")
    s.add_argument("--watch", action="store_true", help="refresh until no job is active")
    s.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    json_option(s)
    database_option(s)
    s.set_defaults(fn=cmd_status)

    for name, fn, text in (
            ("cancel", cmd_cancel, "cancel a queued or running job"),
            ("retry", cmd_retry, "queue again what a job that is not done still needs")):
        s = sub.add_parser(name, help=text)
        s.add_argument("job", type=int, help="the job's id (see ncat status)")
        json_option(s)
        database_option(s)
        s.set_defaults(fn=fn)
