"""Exact patching of all neurons: batched last-position recompute vs the naive hook loop.

Run: .venv/bin/python bench/patching.py [--runs N]   (targets: >= 5x on both models)
Each run times both ways on every layer, back to back; the report gives the median over
the runs and the spread (min-max) of each time and of the per-run ratio.
"""

import numpy as np

from _common import offline_pythia, over_runs, runs_option, save, timed  # first: see _common


def bench(name, lm, layers, hi, pairs, runs):
    import torch

    from catalog.config import ScienceConfig
    from catalog.patching import exact_patching
    from catalog.prompts import sample_pairs
    from catalog.run import CheckpointRun

    from reference import naive_patching

    torch.set_num_threads(torch.get_num_threads())
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         ScienceConfig(operand_hi=hi, pairs_per_op=pairs), layers=layers).prepare()
    prep.table.correct[:] = True  # pairs from every prompt: the random model answers little
    clean, cf = sample_pairs(prep.table, "+", pairs, seed=0)
    max_diff = scale = 0.0
    per_run = []
    for _ in range(runs):
        fast_s = slow_s = 0.0
        for layer in layers:
            t, fast = timed(exact_patching, lm.model, prep.table, layer, clean, cf,
                            prep.activations(layer)[cf])
            fast_s += t
            t, slow = timed(naive_patching, lm.model, prep.table, layer, clean, cf)
            slow_s += t
            max_diff = max(max_diff, float(np.abs(fast - slow).max()))
            scale = max(scale, float(np.abs(slow).max()))
        per_run.append({"batched_s": fast_s, "naive_s": slow_s, "speedup": slow_s / fast_s})
    n = len(layers) * lm.model.cfg.d_mlp
    return {"model": name, "neurons": n, "pairs": len(clean), "runs": runs,
            **over_runs(per_run, ("batched_s", "naive_s", "speedup"), digits=2),
            "max_abs_diff_over_max_effect": max_diff / scale}


def main(runs: int = 5):
    import torch

    from catalog import builtin
    from catalog.sources import load_model

    builtin.train(builtin.TrainConfig())
    rows = [bench("built-in (2 layers, 1024 neurons)", load_model("builtin"), [0, 1], 100, 100,
                  runs)]
    repo = offline_pythia()
    rows.append(bench("Pythia-14m shape (6 layers, 3072 neurons)", load_model(repo, 1000),
                      list(range(6)), 100, 100, runs))
    save("patching", {"rows": rows, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main(runs_option())
