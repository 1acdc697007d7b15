"""The cost of matching neurons across runs (issue 83), 2 CPU cores.

- the built-in model (the default, 2 layers x 512 neurons, `+ - * /` on [0, 100)): its
  last checkpoint against its step 2048, profiles (one pass over the grid each), the
  similarity matrix and both matches, median of ``--runs`` with the spread; and against a
  naive reference in the same run: each pair's correlations by ``np.corrcoef``, on 64 rows;
- Qwen2.5-Coder-0.5B's size without its weights: two layers' worth of neurons (2 x 4,864
  per model) on its `+` grid over [0, 30) (900 cells), random profiles with a shared
  part (what the matrix product and the assignment cost does not depend on the values).

    .venv/bin/python bench/counterparts.py [--runs 3] [--record]

(bench/results/counterparts.json; --record: bench/recorded/cpu_counterparts.json)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from _common import median_spread, save


def _timed(fn, runs: int):
    out, times = None, []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    from catalog import ScienceConfig, builtin, load_model
    from catalog.counterparts.match import Profiles, match, profiles, similarity

    builtin.train(builtin.TrainConfig())
    config = ScienceConfig(operand_hi=100)
    last, earlier = load_model("builtin"), load_model("builtin", 2048)
    (pa, pb), t_prof = _timed(lambda: (profiles(last.model, last.tokenizer, config),
                                       profiles(earlier.model, earlier.tokenizer, config)),
                              args.runs)
    sim, t_sim = _timed(lambda: similarity(pa, pb), args.runs)
    m, t_match = _timed(lambda: match(sim), args.runs)
    # the naive reference: np.corrcoef per pair and operator, 64 rows of A
    rows = 64
    ops = pa.cells[:, 0]

    def naive():
        out = np.zeros((rows, len(pb.values)))
        for i in range(rows):
            for j in range(len(pb.values)):
                r = []
                for o in np.unique(ops):
                    x, y = pa.values[i, ops == o], pb.values[j, ops == o]
                    r.append(0.0 if x.std() == 0 or y.std() == 0 else np.corrcoef(x, y)[0, 1])
                out[i, j] = np.mean(r)
        return out

    ref, t_naive = _timed(naive, 1)
    assert np.allclose(ref, sim[:rows], atol=1e-5)
    per_row_naive = t_naive[0] / rows
    fast_per_row = np.median(t_sim) / len(pa.values)

    rng = np.random.default_rng(0)
    n, cells = 2 * 4864, 900
    grid = np.array([(0, a, b) for a in range(30) for b in range(30)])
    shared = rng.normal(size=(8, cells))
    qa = Profiles((rng.normal(size=(n, 8)) @ shared + rng.normal(size=(n, cells)))
                  .astype(np.float32), np.zeros((n, 2), np.int64), grid, ("+",))
    qb = Profiles((rng.normal(size=(n, 8)) @ shared + rng.normal(size=(n, cells)))
                  .astype(np.float32), np.zeros((n, 2), np.int64), grid, ("+",))
    qsim, t_qsim = _timed(lambda: similarity(qa, qb), 1)
    _, t_qmatch = _timed(lambda: match(qsim), 1)

    out = {
        "builtin": {"neurons": len(pa.values), "cells": len(pa.cells),
                    "profiles_s (both models)": median_spread(t_prof, 2),
                    "similarity_s": median_spread(t_sim, 3),
                    "match_s": median_spread(t_match, 3),
                    "naive_similarity_s_per_row": per_row_naive,
                    "similarity speedup over naive": per_row_naive / fast_per_row,
                    "one_to_one_is_best": float(np.mean(m.one_to_one == m.best))},
        "qwen-sized (2 layers x 4,864 per model, + on [0, 30))": {
            "similarity_s": t_qsim[0], "match_s": t_qmatch[0]},
    }
    save("counterparts", out, "cpu_counterparts" if args.record else None)


if __name__ == "__main__":
    main()
