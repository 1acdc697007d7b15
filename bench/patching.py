"""Exact patching of all neurons: batched last-position recompute vs the naive hook loop.

Run: .venv/bin/python bench/patching.py   (targets: >= 5x on both models)
"""

import numpy as np

from _common import offline_pythia, save, timed  # first: it points the hub cache at a temp folder


def bench(name, lm, layers, hi, pairs):
    import torch

    from catalog.config import MeasureConfig
    from catalog.patching import exact_patching
    from catalog.prompts import sample_pairs
    from catalog.run import CheckpointRun

    from reference import naive_patching

    torch.set_num_threads(torch.get_num_threads())
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         MeasureConfig(operand_hi=hi, pairs_per_op=pairs), layers=layers).prepare()
    prep.table.correct[:] = True  # pairs from every prompt: the random model answers little
    clean, cf = sample_pairs(prep.table, "+", pairs, seed=0)
    fast_s = slow_s = 0.0
    max_diff = scale = 0.0
    for layer in layers:
        t, fast = timed(exact_patching, lm.model, prep.table, layer, clean, cf,
                        prep.activations(layer)[cf])
        fast_s += t
        t, slow = timed(naive_patching, lm.model, prep.table, layer, clean, cf)
        slow_s += t
        max_diff = max(max_diff, float(np.abs(fast - slow).max()))
        scale = max(scale, float(np.abs(slow).max()))
    n = len(layers) * lm.model.cfg.d_mlp
    return {"model": name, "neurons": n, "pairs": len(clean), "batched_s": round(fast_s, 3),
            "naive_s": round(slow_s, 3), "speedup": round(slow_s / fast_s, 1),
            "max_abs_diff_over_max_effect": max_diff / scale}


def main():
    import torch

    from catalog import builtin
    from catalog.sources import load_model

    builtin.train(builtin.TrainConfig())
    rows = [bench("built-in (2 layers, 1024 neurons)", load_model("builtin"), [0, 1], 100, 100)]
    repo = offline_pythia()
    rows.append(bench("Pythia-14m shape (6 layers, 3072 neurons)", load_model(repo, 1000),
                      list(range(6)), 100, 100))
    save("patching", {"rows": rows, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main()
