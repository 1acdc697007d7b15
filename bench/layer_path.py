"""The path of one layer through the code (issue 82): which modules a layer's work enters,
in order, from the entry a driver calls to the stored rows.

A worker's layer (``jobs.runner.process_layer``, what the Celery task calls) and
``ncat catalog``'s checkpoint (``jobs.store_results.catalog_checkpoint``) are each run in
this process on the tiny built-in model against a fresh database on the local PostgreSQL,
under ``sys.setprofile``. A stop is a call from a function of one project module
(``jobs/``, ``schema/``, ``catalog/``) into a function of another, each (caller, callee)
pair counted once in order of its first call (a loop's calls are one stop); calls within
``catalog/`` (the science) are not stops, calls out of it into ``schema/`` or ``jobs/``
are. Reported per route: the stops, the modules entered, the returns to a module
entered before (stops less modules), the climbs back up (a call from a package into one
the dependency order puts above it: ``catalog`` <- ``schema`` <- ``jobs``, so a callback
from the science into the driver is one), and each module's entries.

    .venv/bin/python bench/layer_path.py [--record]

(bench/results/layer_path.json; --record: bench/recorded/cpu_layer_path.json)
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from _common import ROOT, save

PROJECT = ("jobs/", "schema/", "catalog/")
RANK = {"catalog": 0, "schema": 1, "jobs": 2}


def _module(filename: str) -> str | None:
    """The project module a code object is in (its path from the root), or None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return rel if rel.startswith(PROJECT) else None


class PathTracer:
    """Records the stops of a layer's work (module doc)."""

    def __init__(self) -> None:
        self.stack: list[str | None] = []  # per frame: "module:function" or None
        self.stops: list[tuple[str, str]] = []
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, frame, event: str, arg) -> None:
        if event == "call":
            mod = _module(frame.f_code.co_filename)
            here = f"{mod}:{frame.f_code.co_name}" if mod else None
            caller = next((f for f in reversed(self.stack) if f is not None), None)
            self.stack.append(here)
            if here is None or caller is None:
                return
            a, b = caller.split(":")[0], here.split(":")[0]
            if a == b or (a.startswith("catalog/") and b.startswith("catalog/")):
                return
            if (caller, here) not in self.seen:
                self.seen.add((caller, here))
                self.stops.append((caller, here))
        elif event == "return" and self.stack:
            self.stack.pop()


def traced(fn, *args, **kwargs) -> list[tuple[str, str]]:
    """The stops of ``fn(*args, **kwargs)``: (caller, callee) as "module:function"."""
    tracer = PathTracer()
    sys.setprofile(tracer)
    try:
        fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return tracer.stops


def summary(stops: list[tuple[str, str]]) -> dict:
    """Stops, modules entered, returns to a module entered before, climbs back up,
    entries per module, and the stops themselves."""
    entered = collections.Counter(b.split(":")[0] for _, b in stops)
    climbs = [(a, b) for a, b in stops
              if RANK[a.split("/")[0]] < RANK[b.split("/")[0]]]
    return {"stops": len(stops), "modules": len(entered),
            "returns": len(stops) - len(entered), "climbs": len(climbs),
            "entered": dict(entered.most_common()), "climbs_at": [f"{a} -> {b}" for a, b in climbs],
            "path": [f"{a} -> {b}" for a, b in stops]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()

    import os
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="ncat-layer-path-"))
    os.environ["NCAT_HOME"] = str(home)  # before the settings are read
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from catalog import builtin
    from catalog.sources import load_model
    from jobs import enqueue, runner
    from jobs.store_results import catalog_checkpoint
    from schema.database import resolve_database_url
    from schema.engine import migrate

    from helpers import SEED_CONFIG, drop_database, new_database_url
    from tiny_model import TINY

    root = home / "builtin"
    builtin.train(TINY, root=root, progress=False)
    server = resolve_database_url()
    out = {}
    for route in ("worker", "catalog"):
        url = new_database_url(server)
        migrate(url)
        try:
            if route == "worker":
                jobs = enqueue.enqueue(url, builtin.model_name(TINY), [TINY.steps], SEED_CONFIG,
                                       send=lambda *a, **k: None)
                job = jobs[0]
                # the first layer: no summary after it; the last: the job's final step too
                first = traced(runner.process_layer, url, job.job_id, 0, worker="trace")
                last = traced(runner.process_layer, url, job.job_id, TINY.n_layers - 1,
                              worker="trace")
                out["worker, a layer"] = summary(first)
                out["worker, the last layer (and the summary)"] = summary(last)
            else:
                lm = load_model("builtin", TINY.steps, builtin_config=TINY, cache_root=root)
                out["ncat catalog, the whole checkpoint"] = summary(
                    traced(catalog_checkpoint, url, lm, SEED_CONFIG))
        finally:
            drop_database(url)
    for name, s in out.items():
        print(f"{name}: {s['stops']} stops in {s['modules']} modules, {s['returns']} returns "
              f"to a module entered before, {s['climbs']} climbs back up; entered: "
              f"{s['entered']}")
    save("layer_path", out, record="cpu_layer_path" if args.record else None)


if __name__ == "__main__":
    main()
