"""One Qwen2.5-Coder-0.5B layer's labelling, this checkout's code against another revision's
(issue 79), in the same run.

Two child processes load the GGUF that `ncat fetch qwen2.5-coder-0.5b` brings, one importing
this checkout's code and one the code of git revision REV (a temporary worktree), each with
one math thread. Each prepares the run (`+` on [0, 30), 3 solved examples, attribution
patching: the configuration of the recorded Qwen label-cost runs; ``--ops`` for others) and
measures the layer once untimed (its operators' fits are then built, as in a worker after
its first layer); then the two take turns, ``--runs`` times each, the order alternating per
round so that neither runs beside the other. Each measurement is ``CheckpointRun.run_layer``
whole; the labelling is its phases less the model's own work (activations, lens, patching,
spectra). Each child prints a digest of what decides the catalog's rows (every label row with
its score, the effects' ranks), so the report says whether both revisions label alike.

    .venv/bin/python bench/qwen_layer_labels.py --against 0639d10 [--layer 20] [--runs 5]
        [--record]

(bench/results/qwen_layer_labels.json; --record: bench/recorded/cpu_qwen_layer_labels.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, save

MODEL = "qwen2.5-coder-0.5b"
# phases of run_layer that are the model's own work, not the labelling
MODEL_WORK = ("activations", "lens", "attribution", "exact", "patching", "spectra")


def _digest(lr) -> str:
    import hashlib

    import numpy as np

    m = lr.matches
    rows = sorted((int(m.neuron[i]), int(m.op[i]), m.row_heuristic(i).key,
                   bool(m.implements[i]), round(float(m.score[i]), 6))
                  for i in range(len(m)))
    return hashlib.sha256(json.dumps([rows, np.asarray(lr.rank).tolist()])
                          .encode()).hexdigest()


def _child(layer: int, hi: int, shots: int, ops: str) -> None:
    import torch

    torch.set_num_threads(1)
    import catalog
    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    config = ScienceConfig(operators=tuple(ops.split()), operand_hi=hi, shots=shots,
                           patching=("attribution",))
    lm = load_model(MODEL, progress=False)
    run = CheckpointRun(lm.model, lm.tokenizer, config, layers=[layer]).prepare()
    run.run_layer(layer)  # untimed: the operators' fits are built here
    print("ready", catalog.__file__, flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        lr = run.run_layer(layer)
        total = time.perf_counter() - t0
        labels = total - sum(s for p, s in lr.seconds.items() if p in MODEL_WORK)
        print(json.dumps({"total_s": total, "labels_s": labels, "phases": lr.seconds,
                          "digest": _digest(lr), "rows": len(lr.matches)}), flush=True)


def _start(code: Path, args) -> subprocess.Popen:
    env = {**os.environ, **{k: "1" for k in
                            ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
           "PYTHONPATH": str(code)}
    return subprocess.Popen([sys.executable, __file__, "--child", "--layer", str(args.layer),
                             "--hi", str(args.hi), "--shots", str(args.shots),
                             "--ops", args.ops],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            cwd=code)


def _turn(proc: subprocess.Popen) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def _git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", metavar="REV", required=False)
    ap.add_argument("--layer", type=int, default=20)
    ap.add_argument("--hi", type=int, default=30)
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--ops", default="+", help="operators, space-separated (default '+')")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.layer, args.hi, args.shots, args.ops)
        return
    if not args.against:
        ap.error("--against REV is required (the revision to compare with)")
    import numpy as np

    sha, here = _git("rev-parse", args.against), _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    tree = Path(tempfile.mkdtemp(prefix="ncat-bench-rev-")) / "tree"
    _git("worktree", "add", "--detach", str(tree), sha)
    try:
        procs = {"old": _start(tree, args), "new": _start(ROOT, args)}
        for name, p in procs.items():  # each child imported the code it was meant to
            assert p.stdout is not None
            ready, path = p.stdout.readline().split()
            assert ready == "ready", ready
            assert path.startswith(str(tree if name == "old" else ROOT)), (name, path)
        got: dict[str, list[dict]] = {"old": [], "new": []}
        for r in range(args.runs):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                got[name].append(_turn(procs[name]))
                print(name, {k: v for k, v in got[name][-1].items() if k != "phases"},
                      flush=True)
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait(60)
    finally:
        _git("worktree", "remove", "--force", str(tree))

    def stats(runs: list[dict], key: str) -> dict:
        xs = [r[key] for r in runs]
        return {"median_s": float(np.median(xs)), "min_s": min(xs), "max_s": max(xs),
                "runs_s": xs}

    out: dict = {"model": MODEL, "layer": args.layer, "operators": args.ops,
                 "operand_range": [0, args.hi], "shots": args.shots, "threads": 1,
                 "runs": args.runs, "old_rev": sha,
                 "new_rev": here + (" + uncommitted changes" if dirty else "")}
    for name, runs in got.items():
        out[name] = {"labels": stats(runs, "labels_s"), "run_layer": stats(runs, "total_s"),
                     "phases_median_s": {p: float(np.median([r["phases"].get(p, 0.0)
                                                             for r in runs]))
                                         for p in sorted({p for r in runs
                                                          for p in r["phases"]})},
                     "digests": sorted({r["digest"] for r in runs}),
                     "label_rows": sorted({r["rows"] for r in runs})}
    out["labels speedup old / new"] = (out["old"]["labels"]["median_s"]
                                       / out["new"]["labels"]["median_s"])
    out["run_layer speedup old / new"] = (out["old"]["run_layer"]["median_s"]
                                          / out["new"]["run_layer"]["median_s"])
    out["equal labels"] = (out["old"]["digests"] == out["new"]["digests"]
                           and len(out["new"]["digests"]) == 1)
    save("qwen_layer_labels", out, "cpu_qwen_layer_labels" if args.record else None)


if __name__ == "__main__":
    main()
