"""Full measurement of one checkpoint: every neuron, 4 operators, the full grid, 100 pairs
per operator, exact and attribution patching, all heuristic families, summary; timed per
phase, which is where the README's cost-per-checkpoint guidance comes from.

Run: .venv/bin/python bench/measure_checkpoint.py [operand_hi] [builtin|pythia] [--runs N]
(target for the built-in model on [0, 100): < 60 s on 2 cores). "pythia" is the offline
random model with Pythia-14m's shape (6 layers x 512 neurons); its timings are those of
the real model, whose weights only change the numbers measured. Each run measures the
checkpoint afresh; the report gives each phase's median over the runs and the total's
spread (min-max).
"""

import sys
import time

from _common import offline_pythia, over_runs, runs_option, save  # first: see _common


def main(hi: int = 100, model: str = "builtin", runs: int = 5):
    import torch

    from catalog import builtin
    from catalog.config import ScienceConfig
    from catalog.sources import load_model

    if model == "builtin":
        builtin.train(builtin.TrainConfig())
        lm = load_model("builtin")
    else:
        lm = load_model(offline_pythia(), 1000)
    config = ScienceConfig(operand_hi=hi, pairs_per_op=100)
    per_run = []
    for _ in range(runs):  # only the last run's results are kept: one run's worth of memory
        prep = layers = None
        prep, layers, timings = measure_once(lm, config)
        per_run.append(timings)
    phases = over_runs(per_run, tuple(per_run[0]), digits=2)
    save(f"measure_checkpoint_{model}_hi{hi}", {
        "model": lm.info.name, "operand_range": [0, hi], "prompts": len(prep.table),
        "neurons": lm.model.cfg.n_layers * lm.model.cfg.d_mlp,
        "score_rows": int(sum(len(v.matches) for v in layers.values())), "runs": runs,
        "total_s": phases.pop("total"),
        "phases_s": {k: v["median"] for k, v in phases.items()},
        "threads": torch.get_num_threads()})


def measure_once(lm, config):
    """(prepared run, layer results, seconds per phase and in total) of one measurement."""
    from catalog.run.checkpoint import CheckpointRun

    phases = {}
    t0 = time.perf_counter()
    prep = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    phases["prepare (prompts, grid pass, pairs)"] = time.perf_counter() - t0
    mark = [time.perf_counter()]

    def lap(result) -> None:  # each layer's wall time, from the end of the one before
        now = time.perf_counter()
        phases[f"layer {result.layer}"] = now - mark[0]
        mark[0] = now

    out = prep.run_all(on_layer=lap, keep=True)
    layers = out.results
    phases["summary (faithfulness, knockouts)"] = out.summary_seconds
    phases["total"] = time.perf_counter() - t0
    return prep, layers, phases


if __name__ == "__main__":
    runs = runs_option()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100,
         sys.argv[2] if len(sys.argv) > 2 else "builtin", runs)
