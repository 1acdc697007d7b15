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

``--against REV`` compares code instead: one process runs the checkout's code, one the
code of git revision REV (a temporary worktree), each with one thread, taking turns on
the same step so that neither runs beside the other (the order alternates per round);
each prints its seconds and a digest of what it measured (every layer's label rows and
effects' ranks, the summary's prompt explanations, knockouts and faithfulness), so the
report says whether the two catalogs are equal (bench/results/demo_checkpoint_code.json;
--record: bench/recorded/cpu_demo_checkpoint_code.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, against_ready, code_env, revision_tree, save, take_turns


def _digest(res) -> str:
    """sha256 of what a measured checkpoint stores that the code could change."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for layer, lr in sorted(res.layers.items()):
        m = lr.matches
        rows = sorted((int(m.neuron[i]), int(m.op[i]), m.row_heuristic(i).key,
                       bool(m.implements[i]), round(float(m.score[i]), 6))
                      for i in range(len(m)))
        h.update(json.dumps([layer, rows, np.asarray(lr.rank).tolist()]).encode())
    s = res.summary
    h.update(json.dumps([s.prompt_explanations, s.prompt_knockouts, s.heuristic_knockouts,
                         s.faithfulness], sort_keys=True, default=str).encode())
    return h.hexdigest()


def _child(threads: int, step: int) -> None:
    import torch

    torch.set_num_threads(threads)
    import catalog
    from catalog import load_model, measure
    from jobs.demo import DEMO_CONFIG

    last = load_model("builtin")
    measure(last.model, last.tokenizer, DEMO_CONFIG, progress=False)  # fits built
    lm = load_model("builtin", step)
    print("ready", catalog.__file__, flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        res = measure(lm.model, lm.tokenizer, DEMO_CONFIG, progress=False)
        print(f"{time.perf_counter() - t0:.3f} {_digest(res)}", flush=True)


def _start(threads: int, step: int, code: Path = ROOT) -> subprocess.Popen:
    """A child measuring ``step`` with ``threads`` threads, importing the code under
    ``code`` (this checkout, or another revision's worktree)."""
    return subprocess.Popen([sys.executable, __file__, "--child", str(threads), "--step",
                             str(step)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=code_env(code, threads), cwd=code)


def _ready(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if not line.startswith("ready"):
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


def _turn(proc: subprocess.Popen) -> tuple[float, str]:
    """One measurement by one child, alone: (seconds, digest)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    seconds, digest = proc.stdout.readline().split()
    return float(seconds), digest


def _against(rev: str, runs: int, step: int, record: bool) -> None:
    """The checkout's code against revision ``rev``'s (module doc)."""
    import numpy as np

    with revision_tree(rev) as (tree, sha, here):
        procs = {"old": _start(1, step, tree), "new": _start(1, step)}
        against_ready(procs, tree)
        got = take_turns(procs, runs, _turn)
        _stop(list(procs.values()))

    def stats(xs: list) -> dict:
        s = [x for x, _ in xs]
        return {"median_s": float(np.median(s)), "min_s": min(s), "max_s": max(s),
                "runs_s": s, "digests": sorted({d for _, d in xs})}

    old, new = stats(got["old"]), stats(got["new"])
    out = {"cores": 1, "step": step, "runs": runs, "old_rev": sha,
           "new_rev": here,
           "old": old, "new": new, "speedup old / new": old["median_s"] / new["median_s"],
           "equal catalogs": old["digests"] == new["digests"] and len(old["digests"]) == 1}
    save("demo_checkpoint_code", out, "cpu_demo_checkpoint_code" if record else None)


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
    ap.add_argument("--against", metavar="REV", default=None,
                    help="compare this checkout's code with git revision REV's")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args.child, args.step)
        return
    if args.against:
        _against(args.against, args.runs, args.step, args.record)
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
    save("demo_checkpoint", out, "cpu_demo_checkpoint" if args.record else None)


if __name__ == "__main__":
    main()
