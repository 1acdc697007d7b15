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
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, against_ready, code_env, revision_tree, save, take_turns

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
    return subprocess.Popen([sys.executable, __file__, "--child", "--layer", str(args.layer),
                             "--hi", str(args.hi), "--shots", str(args.shots),
                             "--ops", args.ops],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=code_env(code, 1), cwd=code)


def _turn(proc: subprocess.Popen) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    got = json.loads(proc.stdout.readline())
    print({k: v for k, v in got.items() if k != "phases"}, flush=True)
    return got


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

    with revision_tree(args.against) as (tree, sha, here):
        procs = {"old": _start(tree, args), "new": _start(ROOT, args)}
        against_ready(procs, tree)
        got = take_turns(procs, args.runs, _turn)
        for p in procs.values():
            assert p.stdin is not None
            p.stdin.close()
            p.wait(60)

    def stats(runs: list[dict], key: str) -> dict:
        xs = [r[key] for r in runs]
        return {"median_s": float(np.median(xs)), "min_s": min(xs), "max_s": max(xs),
                "runs_s": xs}

    out: dict = {"model": MODEL, "layer": args.layer, "operators": args.ops,
                 "operand_range": [0, args.hi], "shots": args.shots, "threads": 1,
                 "runs": args.runs, "old_rev": sha, "new_rev": here}
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
