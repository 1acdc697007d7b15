"""Command line: ``ncat``. Trains the built-in model and measures checkpoints.

The catalog library never prints; this module turns its results into text.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from catalog.arith import OPERATORS
from catalog.config import MeasureConfig

# Only light modules are imported here: `ncat worker` must not import torch in the
# worker's parent process. Commands import the science when they run.
from jobs.demo import DEMO_CONFIG  # noqa: E402  (light: catalog.config only)


def _parse_layers(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--layers must be comma-separated integers, got {text!r}") from None


def _default_port() -> int:
    value = os.environ.get("NCAT_EXPLORER_PORT", "8501")
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SystemExit(f"NCAT_EXPLORER_PORT must be a port number, got {value!r}")
    return int(value)


def _config_from_args(args) -> MeasureConfig:
    ops = tuple(args.ops) if args.ops else OPERATORS
    try:
        batching = {k: getattr(args, k) for k in ("batch_size", "patch_chunk")
                    if getattr(args, k, None) is not None}
        return MeasureConfig(operators=ops, operand_lo=args.lo, operand_hi=args.hi,
                             pairs_per_op=args.pairs, seed=args.seed,
                             heuristic_variant=args.variant, **batching)
    except ValueError as exc:
        raise SystemExit(f"invalid measurement config: {exc}") from None


def print_result(res, top: int = 5, out=sys.stdout) -> None:
    """Readable summary of a CheckpointResult: accuracy, faithfulness, top neurons per layer."""
    import numpy as np

    ops = res.config.operators
    if res.summary:
        s = res.summary
        print("accuracy:   " + "  ".join(f"{op} {s.accuracy[op]:.3f}" for op in ops), file=out)
        for op in ops:
            curve = ", ".join(f"k={k}: {f:.2f}" for k, f in s.faithfulness[op])
            print(f"faithfulness {op}: {curve}", file=out)
    for layer, lr in sorted(res.layers.items()):
        print(f"\nlayer {layer}: {len(lr.matches)} heuristic scores >= {res.config.score_floor}",
              file=out)
        for o, op in enumerate(ops):
            order = np.argsort(lr.rank[:, o])[:top]
            for n in order:
                sel = (lr.matches.neuron == n) & (lr.matches.op == o)
                best = ""
                if sel.any():
                    i = np.nonzero(sel)[0][np.argmax(lr.matches.score[sel])]
                    best = f"{lr.matches.heuristic[i].label} ({lr.matches.score[i]:.2f})"
                print(f"  {op} neuron {n:5d}  effect {lr.effect[n, o]:9.3f}  {best}", file=out)


def cmd_train_builtin(args) -> int:
    from catalog import builtin

    cfg = builtin.TrainConfig(**({"steps": args.steps} if args.steps else {}), seed=args.seed)
    path = builtin.train(cfg)
    meta = json.loads((path / f"step{cfg.steps}.json").read_text())
    acc = meta["heldout_accuracy"]
    print(f"checkpoints in {path}: steps {builtin.available_steps(cfg)}")
    print("held-out accuracy: " + "  ".join(f"{op} {acc[op]:.3f}" for op in OPERATORS))
    return 0


def cmd_checkpoints(args) -> int:
    from catalog.sources import ModelSourceError, list_checkpoints

    try:
        steps = list_checkpoints(args.model)
    except ModelSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("no training checkpoints" if steps is None else " ".join(map(str, steps)))
    return 0


def cmd_measure(args) -> int:
    from catalog.measurement import measure
    from catalog.sources import ModelSourceError, load_model

    config = _config_from_args(args)
    try:
        lm = load_model(args.model, args.checkpoint, device=args.device)
        t0 = time.perf_counter()
        res = measure(lm.model, lm.tokenizer, config, layers=_parse_layers(args.layers),
                      progress=not args.quiet, provenance=lm.info.as_dict())
    except (ModelSourceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{lm.info.name} step {lm.info.checkpoint}: measured in "
          f"{time.perf_counter() - t0:.1f} s ({len(res.table)} prompts)")
    print_result(res)
    return 0


def cmd_demo(args) -> int:
    from jobs.demo import catalog_all
    from jobs.enqueue import EnqueueError

    t0 = time.perf_counter()
    try:
        out = catalog_all(args.model, _config_from_args(args), progress=not args.quiet)
    except EnqueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"catalog ready in {time.perf_counter() - t0:.0f} s: {out['jobs']} checkpoints, "
          f"{out['layers']} layers, in {out['database_url']}")
    for job_id, step, error in out["failed"]:
        print(f"job {job_id} (step {step}) failed: {error}", file=sys.stderr)
    if args.no_serve:
        return 1 if out["failed"] else 0
    args.database_url = out["database_url"]
    return cmd_explore(args)


def _url(args) -> str:
    from schema.settings import resolve_database_url, with_driver

    return with_driver(args.database_url) if args.database_url else resolve_database_url()


def cmd_migrate(args) -> int:
    from schema.engine import migrate

    url = migrate(_url(args))
    print(f"database migrated to head: {url}")
    return 0


def cmd_catalog(args) -> int:
    """Measure checkpoints and write them to the database (no queue)."""
    from catalog.sources import ModelSourceError, canonical_name, load_model
    from jobs.enqueue import parse_checkpoints
    from jobs.store_results import catalog_checkpoint
    from schema import store
    from schema.engine import migrate

    config = _config_from_args(args)
    layers = _parse_layers(args.layers)
    try:
        name = canonical_name(args.model)
        steps = parse_checkpoints(args.model, args.checkpoints)
        url = migrate(_url(args))
        for step in steps:
            if not args.force:
                with store.connect(url) as conn:
                    have = store.find_stored(conn, model_name=name, step=step,
                                             config_hash=config.config_hash())
                if have and have.covers(layers):
                    print(f"{name} step {step}: already in the catalog (--force recomputes)")
                    continue
            lm = load_model(args.model, step, device=args.device)
            t0 = time.perf_counter()
            ids = catalog_checkpoint(url, lm, config, layers=layers,
                                     progress=not args.quiet)
            print(f"{lm.info.name} step {step}: stored in {time.perf_counter() - t0:.1f} s "
                  f"(checkpoint id {ids.checkpoint_id}, config id {ids.config_id})")
    except (ModelSourceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_export(args) -> int:
    from schema.export import export

    try:
        n = export(_url(args), args.what, Path(args.out), args.format)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # database errors: say what failed
        print(f"error: export of {args.what!r} failed: {exc}", file=sys.stderr)
        return 2
    print(f"{n} rows written to {args.out}")
    return 0


def cmd_enqueue(args) -> int:
    from jobs.enqueue import EnqueueError, enqueue
    from schema.engine import migrate

    config = _config_from_args(args)
    try:
        url = migrate(_url(args))
        jobs = enqueue(url, args.model, args.checkpoints, config,
                       layers=_parse_layers(args.layers), device=args.device, force=args.force)
    except EnqueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for j in jobs:
        if j.stored:
            what = "already in the catalog, nothing queued (--force recomputes)"
        elif j.created:
            what = "queued"
        else:
            what = "queued again (--force)" if args.force else "exists already"
        print(f"job {j.job_id}: {j.model} step {j.step}, {len(j.layers)} layers: {what}")
    return 0


def cmd_worker(args) -> int:
    from jobs.celery_app import app, queue_name

    argv = ["worker", "--loglevel", args.loglevel, "--concurrency", str(args.concurrency),
            "--queues", queue_name(), "--pool", args.pool]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    app.worker_main(argv)
    return 0


def cmd_explore(args) -> int:
    """Serve the Streamlit explorer (prints its URL)."""
    import subprocess

    env = dict(os.environ)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    port = args.port if args.port is not None else _default_port()
    app = Path(__file__).resolve().parents[1] / "ui" / "app.py"
    print(f"explorer: http://localhost:{port}")
    return subprocess.call([sys.executable, "-m", "streamlit", "run", str(app),
                            "--server.port", str(port), "--server.headless", "true",
                            "--browser.gatherUsageStats", "false"], env=env)


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def cmd_status(args) -> int:
    from jobs.enqueue import job_statuses

    url = _url(args)
    while True:
        rows = job_statuses(url, args.jobs or None)
        lines = [f"job {r.job_id:4d}  {r.model} step {r.step}  "
                 f"{_bar(r.layers_done, r.layers_total)}  {r.status}"
                 + (f"  layer {r.failed_layer}: {r.error}" if r.error else "") for r in rows]
        print("\n".join(lines) if lines else "no jobs")
        active = any(r.status in ("queued", "running", "summarizing") for r in rows)
        if not args.watch or not active:
            return 0
        time.sleep(args.interval)
        print()


def cmd_cancel(args) -> int:
    from jobs.enqueue import EnqueueError, cancel

    try:
        print(f"job {args.job}: {cancel(_url(args), args.job)}")
    except EnqueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_retry(args) -> int:
    from jobs.enqueue import EnqueueError, retry

    try:
        layers = retry(_url(args), args.job)
    except EnqueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"job {args.job}: layers {layers} queued again")
    return 0


def _measure_options(s) -> None:
    s.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    s.add_argument("--ops", default=None, help="operators, e.g. '+-' (default all four)")
    s.add_argument("--lo", type=int, default=0)
    s.add_argument("--hi", type=int, default=DEMO_CONFIG.operand_hi)
    s.add_argument("--pairs", type=int, default=100, help="counterfactual pairs per operator")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--variant", choices=("paper", "code"), default="paper")
    s.add_argument("--device", default="cpu")
    s.add_argument("--quiet", action="store_true", help="no progress bars")


def _batch_options(s) -> None:
    """Memory vs speed where this process computes (workers read NCAT_BATCH_SIZE and
    NCAT_PATCH_CHUNK instead); not part of the config hash."""
    s.add_argument("--batch-size", type=int, default=None,
                   help="prompts per forward pass (default 4096; lower it on a small GPU)")
    s.add_argument("--patch-chunk", type=int, default=None,
                   help="neurons patched per batched forward (default 64)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ncat", description="The arithmetic neuron catalog.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("demo", help="catalog every built-in checkpoint through the queue, "
                                    "then serve the explorer")
    s.add_argument("--model", default="builtin")
    s.add_argument("--no-serve", action="store_true", help="stop once the catalog is ready")
    s.add_argument("--port", type=int, default=None,
                   help="the explorer's port (default: $NCAT_EXPLORER_PORT or 8501)")
    _measure_options(s)
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("train-builtin", help="train the built-in arithmetic model (cached)")
    s.add_argument("--steps", type=int, default=None, help="training steps (default 3000)")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_train_builtin)

    s = sub.add_parser("checkpoints", help="list a model's training checkpoints")
    s.add_argument("model")
    s.set_defaults(fn=cmd_checkpoints)

    s = sub.add_parser("measure", help="measure every neuron of one checkpoint, no database")
    s.add_argument("model", help="'builtin', a hub name, a local HF directory or a .gguf file")
    s.add_argument("--checkpoint", type=int, default=None, help="training step")
    _measure_options(s)
    _batch_options(s)
    s.set_defaults(fn=cmd_measure)

    db_help = "database URL (default: DATABASE_URL, a local server, or an embedded one)"
    s = sub.add_parser("migrate", help="create or upgrade the catalog's database")
    s.add_argument("--database-url", default=None, help=db_help)
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("catalog", help="measure checkpoints and store them (no queue)")
    s.add_argument("model", help="'builtin', a hub name, a local HF directory or a .gguf file")
    s.add_argument("--checkpoints", default=None,
                   help="'all', '0,512,3000' or 'start:stop:step' (default: final weights)")
    s.add_argument("--force", action="store_true",
                   help="recompute checkpoints the catalog holds already")
    s.add_argument("--database-url", default=None, help=db_help)
    _measure_options(s)
    _batch_options(s)
    s.set_defaults(fn=cmd_catalog)

    s = sub.add_parser("enqueue", help="queue checkpoints for the workers")
    s.add_argument("model", help="'builtin', a hub name, a local HF directory or a .gguf file")
    s.add_argument("--checkpoints", default=None,
                   help="'all', '0,512,3000' or 'start:stop:step' (default: final weights)")
    s.add_argument("--force", action="store_true", help="recompute jobs that exist already")
    s.add_argument("--database-url", default=None, help=db_help)
    _measure_options(s)
    s.set_defaults(fn=cmd_enqueue)

    s = sub.add_parser("worker", help="run a worker (one process; start one per GPU)")
    s.add_argument("--concurrency", type=int, default=1)
    s.add_argument("--pool", default="prefork", choices=("prefork", "solo"))
    s.add_argument("--loglevel", default="info")
    s.add_argument("--hostname", default=None)
    s.set_defaults(fn=cmd_worker)

    s = sub.add_parser("status", help="progress of jobs")
    s.add_argument("jobs", nargs="*", type=int, help="job ids (default all)")
    s.add_argument("--watch", action="store_true", help="refresh until no job is active")
    s.add_argument("--interval", type=float, default=2.0)
    s.add_argument("--database-url", default=None, help=db_help)
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("explore", help="serve the Streamlit explorer")
    s.add_argument("--port", type=int, default=None,
                   help="the explorer's port (default: $NCAT_EXPLORER_PORT or 8501)")
    s.add_argument("--database-url", default=None, help=db_help)
    s.set_defaults(fn=cmd_explore)

    for name, fn, text in (("cancel", cmd_cancel, "cancel a queued or running job"),
                           ("retry", cmd_retry, "queue a failed or cancelled job again")):
        s = sub.add_parser(name, help=text)
        s.add_argument("job", type=int)
        s.add_argument("--database-url", default=None, help=db_help)
        s.set_defaults(fn=fn)

    s = sub.add_parser("export", help="export a view or read-only query to Parquet or CSV")
    s.add_argument("what", help="a view or table name, or a SELECT query")
    s.add_argument("--out", required=True, help="output file (.parquet or .csv)")
    s.add_argument("--format", choices=("parquet", "csv"), default=None)
    s.add_argument("--database-url", default=None, help=db_help)
    s.set_defaults(fn=cmd_export)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
