"""What the final circuit across training costs (issue 48): per checkpoint, the whole
catalog run (every layer and the summary) with the final checkpoint's circuit measured in
its summary, the final circuit's share of it, and the same beside the checkpoint's own
paper curve (the reference: the same kind of work, with the reversed control too).

    python bench/final_circuit.py [MODEL] [--final 3000] [--steps 256,1024,2048]
                                  [--hi 100] [--ops +-*/] [--repeat 3]

Library only (no database): the final checkpoint is run once and its circuit taken from
its summary (catalog.circuits.final.FinalCircuit.from_curves); each other checkpoint is
run ``--repeat`` times with it. Reports medians with their range; the target is at most
20% added to a checkpoint's catalog time. Writes bench/results/final_circuit_<model>.json.
"""

import argparse
import statistics
import sys
import time

import _common  # noqa: F401  (sets the offline Hugging Face cache first)
from _common import save


def main() -> int:
    from catalog.circuits.final import FinalCircuit
    from catalog.config import ScienceConfig
    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="builtin")
    p.add_argument("--final", type=int, default=3000)
    p.add_argument("--steps", default="256,1024,2048")
    p.add_argument("--hi", type=int, default=100)
    p.add_argument("--ops", default="+-*/")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    config = ScienceConfig(operand_hi=args.hi, operators=tuple(args.ops))
    lm = load_model(args.model, args.final)
    out = CheckpointRun(lm.model, lm.tokenizer, config).prepare().run_all()
    final = FinalCircuit.from_curves(out.summary.curves, args.final)
    rows = []
    for step in [int(s) for s in args.steps.split(",")]:
        lm = load_model(args.model, step)
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            got = CheckpointRun(lm.model, lm.tokenizer, config).prepare().run_all(final=final)
            total = time.perf_counter() - t0
            sec = got.summary.seconds
            fin = sec.get("curve, final circuit", 0.0)
            runs.append({"total_s": total, "final_s": fin, "own_paper_s": sec["curve, paper"],
                         "added": fin / (total - fin),
                         "vs_own_curve": fin / sec["curve, paper"]})
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        spread = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in runs[0]}
        rows.append({"step": step, "median": med, "range": spread, "runs": runs,
                     "n_correct": got.summary.n_correct})
        print(f"step {step}: catalog {med['total_s']:.1f} s, final circuit {med['final_s']:.2f}"
              f" s = +{100 * med['added']:.1f}% ({100 * spread['added'][0]:.1f}-"
              f"{100 * spread['added'][1]:.1f}), {med['vs_own_curve']:.2f}x the own paper "
              f"curve; correct prompts {got.summary.n_correct}", flush=True)
    save(f"final_circuit_{args.model}", {"model": args.model, "final": args.final,
                                              "config": config.as_dict(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
