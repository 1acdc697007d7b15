"""Exact patching of all neurons: batched last-position recompute vs the naive hook loop,
and against its FLOP floor.

Run: .venv/bin/python bench/patching.py [--runs N] [--pythia-only]
(targets: >= 5x on both models; the batched path within 2x of its floor, issue 33)
Each run times both ways on every layer, back to back; the report gives the median over
the runs and the spread (min-max) of each time and of the per-run ratio. The floor is the
time the patched rows' matrix products would take at the rate this machine reaches on
those very shapes (each (rows, k) @ (k, n) of a block and of the unembedding, timed in
the same run): rows = pairs x (neurons + 1 baseline), each through the blocks after its
layer and the unembedding. The clean forward that fills the key/value cache and the
attention over cached keys are left out, so the floor is a lower bound.
"""

import numpy as np

from _common import (  # first: see _common
    matmul_rate,
    offline_pythia,
    over_runs,
    runs_option,
    save,
    timed,
)


def row_products(model) -> list[tuple[int, int]]:
    """(k, n) of each matrix product one position makes through a block: queries, keys,
    values, output, the MLP's in (and gate) and out."""
    cfg = model.cfg
    kv_heads = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.d_head, kv_heads * cfg.d_head
    mlp = [(d, cfg.d_mlp)] * (2 if cfg.gated_mlp else 1) + [(cfg.d_mlp, d)]
    return [(d, q), (d, kv), (d, kv), (q, d)] + mlp


def floor_seconds(model, layers, n_rows: int, rows_per_forward: int) -> float:
    """Seconds the patched rows' matrix products take at this machine's measured rate on
    each of their shapes (``rows_per_forward`` rows at once)."""
    cfg = model.cfg
    shapes = set(row_products(model)) | {(cfg.d_model, cfg.d_vocab)}
    per_row = {kn: 2.0 * kn[0] * kn[1] / matmul_rate(rows_per_forward, *kn) for kn in shapes}
    block = sum(per_row[kn] for kn in row_products(model))
    unembed = per_row[(cfg.d_model, cfg.d_vocab)]
    return sum(n_rows * ((cfg.n_layers - layer - 1) * block + unembed) for layer in layers)


CHUNK = 64  # exact_patching's default chunk of neurons


def bench(name, lm, layers, hi, pairs, runs):
    import torch

    from catalog.config import ScienceConfig
    from catalog.measuring.patching import exact_patching
    from catalog.measuring.prompts import sample_pairs
    from catalog.run.checkpoint import CheckpointRun

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
        # the rows of one forward: the pairs of a length group times a chunk of neurons
        floor_s = floor_seconds(lm.model, layers, len(clean) * (lm.model.cfg.d_mlp + 1),
                                len(clean) * CHUNK)
        per_run.append({"batched_s": fast_s, "naive_s": slow_s, "speedup": slow_s / fast_s,
                        "floor_s": floor_s, "over_floor": fast_s / floor_s})
    n = len(layers) * lm.model.cfg.d_mlp
    return {"model": name, "neurons": n, "pairs": len(clean), "runs": runs,
            **over_runs(per_run, ("batched_s", "naive_s", "speedup", "floor_s", "over_floor"),
                        digits=2),
            "max_abs_diff_over_max_effect": max_diff / scale}


def main(runs: int = 5, pythia_only: bool = False):
    import torch

    from catalog import builtin
    from catalog.sources import load_model

    rows = []
    if not pythia_only:  # the built-in model is trained first where it is not cached
        builtin.train(builtin.TrainConfig())
        rows.append(bench("built-in (2 layers, 1024 neurons)", load_model("builtin"), [0, 1],
                          100, 100, runs))
    repo = offline_pythia()
    rows.append(bench("Pythia-14m shape (6 layers, 3072 neurons)", load_model(repo, 1000),
                      list(range(6)), 100, 100, runs))
    save("patching", {"rows": rows, "threads": torch.get_num_threads()})


if __name__ == "__main__":
    import sys

    only = "--pythia-only" in sys.argv  # skips training the built-in model where not cached
    main(runs_option(), pythia_only=only)
