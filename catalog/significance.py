"""How surprising a heuristic score is: its base rate and an exact p-value.

Algorithm 1 scores a neuron against a heuristic H with k = |S_H| cells out of N valid
cells as the share of S_H among the neuron's top-k cells. If the map's order carried no
information (a random ordering of the cells), the number of S_H cells among the top k
would be hypergeometric: k draws without replacement from N cells of which k are in
S_H. Its mean is k * k / N, so the expected score, the **base rate**, is k / N: a set
covering 95% of the grid scores about 0.95 on noise. The **p-value** is the exact upper
tail P(X >= x) of that distribution at the observed overlap x.

Tied cells are shared fairly by the scorer (a fractional count); the p-value uses the
whole cells of the count, rounded down, which can only make it larger (conservative).
Scores of the released code's pattern counting and of the multi-result family follow
other nulls, and get no p-value (NaN).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


def base_rate(k: np.ndarray | int, n_cells: int) -> np.ndarray:
    """Expected Algorithm 1 score of a heuristic of ``k`` cells on a random ordering."""
    return np.asarray(k, dtype=np.float64) / n_cells


@lru_cache(maxsize=8192)
def overlap_tail(n_cells: int, k: int) -> np.ndarray:
    """P(X >= x) for x = 0..k, X the overlap of a random k-subset of ``n_cells`` cells
    with a fixed set of k cells (hypergeometric), computed exactly in log space.

    Cached: every layer of a checkpoint asks for the same (cells, k) pairs. The array
    returned is read-only."""
    if not 0 < k <= n_cells:
        raise ValueError(f"k must be in 1..{n_cells}, got {k}")
    i = torch.arange(0, k + 1, dtype=torch.float64)

    def log_comb(n, r):
        return torch.lgamma(n + 1) - torch.lgamma(r + 1) - torch.lgamma(n - r + 1)

    n, kk = torch.tensor(float(n_cells), dtype=torch.float64), torch.tensor(float(k),
                                                                          dtype=torch.float64)
    possible = (k - i) <= (n_cells - k)  # at least 2k - N of the k draws must land in S_H
    log_pmf = torch.where(possible,
                          log_comb(kk, i) + log_comb(n - kk, kk - i) - log_comb(n, kk),
                          torch.full_like(i, -float("inf")))
    # upper tail: logcumsumexp from the right
    tail = torch.logcumsumexp(log_pmf.flip(0), dim=0).flip(0).exp().clamp(max=1.0).numpy()
    tail.flags.writeable = False
    return tail


def p_values(score: np.ndarray, k: np.ndarray, n_cells: int) -> np.ndarray:
    """Exact p-value of each Algorithm 1 score (one row per score, its heuristic's k)."""
    score, k = np.asarray(score, dtype=np.float64), np.asarray(k, dtype=np.int64)
    out = np.empty(len(score), dtype=np.float64)
    x = np.floor(score * k + 1e-6).astype(np.int64)  # whole cells of the overlap
    for kk in np.unique(k):
        sel = k == kk
        out[sel] = overlap_tail(n_cells, int(kk))[np.clip(x[sel], 0, kk)]
    return out
