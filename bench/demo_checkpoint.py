"""One demo checkpoint (the built-in model, `+ - * /` on [0, 100), the demo's config), the
old way and the new in the same run (issue 79): the old demo worker was one pool process
with torch's default threads (one per core); the new one runs one pool process per core,
each with one thread. Both are measured here in steady state, as a demo worker runs them
after its first checkpoint (each process has built its operators' fits and fold models,
which it keeps: ``catalog.labels.operator_labels.operand_fit``): every process first
measures the last checkpoint once (not timed), then the step given, ``--runs`` times.

- old: one process, ``torch.set_num_threads(cores)``: seconds per checkpoint;
- new: ``cores`` processes with one thread each, started together on the same step:
  seconds until all are done, and so checkpoints per second.

Reported: each way's median and spread (min-max) over the runs, and the ratio of the new
way's throughput to the old's. Run on an idle machine:

    .venv/bin/python bench/demo_checkpoint.py [--runs 5] [--step 2048] [--record]

(bench/results/demo_checkpoint.json; --record: bench/recorded/cpu_demo_checkpoint.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import ROOT, save


def _child(threads: int, step: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from catalog import load_model, measure
    from jobs.demo import DEMO_CONFIG

    last = load_model("builtin")
    measure(last.model, last.tokenizer, DEMO_CONFIG, progress=False)  # fits built
    lm = load_model("builtin", step)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        measure(lm.model, lm.tokenizer, DEMO_CONFIG, progress=False)
        print(f"{time.perf_counter() - t0:.3f}", flush=True)


def _start(threads: int, step: int) -> subprocess.Popen:
    env = {**os.environ, **{k: str(threads) for k in
                            ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
    return subprocess.Popen([sys.executable, __file__, "--child", str(threads), "--step",
                             str(step)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)


def _ready(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"a bench process did not start: {line!r}")


def _round(procs: list[subprocess.Popen]) -> float:
    """Every process measures the step once, started together: seconds until the last."""
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        assert p.stdout is not None
        float(p.stdout.readline())
    return time.perf_counter() - t0


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--step", type=int, default=2048)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child, args.step)
        return
    import numpy as np

    from catalog import builtin

    builtin.train(builtin.TrainConfig())
    cores = len(os.sched_getaffinity(0))
    old = [_start(cores, args.step)]
    _ready(old)
    old_s = [_round(old) for _ in range(args.runs)]
    _stop(old)
    new = [_start(1, args.step) for _ in range(cores)]
    _ready(new)
    new_s = [_round(new) for _ in range(args.runs)]
    _stop(new)

    def stats(xs: list[float]) -> dict:
        return {"median_s": float(np.median(xs)), "min_s": min(xs), "max_s": max(xs),
                "runs_s": xs}

    old_rate = 1 / np.median(old_s)
    new_rate = cores / np.median(new_s)
    out = {"cores": cores, "step": args.step, "runs": args.runs,
           "old: one process, a thread per core": stats(old_s),
           f"new: {cores} processes, one thread each": stats(new_s),
           "old checkpoints per minute": 60 * old_rate,
           "new checkpoints per minute": 60 * new_rate,
           "throughput ratio new / old": new_rate / old_rate}
    save("demo_checkpoint", out)
    if args.record:
        (ROOT / "bench" / "recorded" / "cpu_demo_checkpoint.json").write_text(
            json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
