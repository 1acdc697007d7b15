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
The released code's pattern counting (``count`` cells of S_H among a fixed top K) is
the same distribution with K draws. A multi-result row picks its 2-5 results after
looking at the map, so its p-value is multiplied by the number of result sets of that
size it could have picked (Bonferroni over the choice).

**The label rule.** A neuron implements H on an operator when its score clears
``match_threshold`` AND its p-value is at most ``significance_level / m``, m the number
of heuristics scored for that operator (both ends of the map count when bottom-k is
scored). By Bonferroni the chance that a map with no structure gets any label is at
most ``significance_level``, whatever the grid size, the operator or the families.
"""

from __future__ import annotations

import numpy as np

from catalog.core.stats import hypergeom_tail


def base_rate(k: np.ndarray | int, n_cells: int) -> np.ndarray:
    """Expected Algorithm 1 score of a heuristic of ``k`` cells on a random ordering."""
    return np.asarray(k, dtype=np.float64) / n_cells


def overlap_tail(n_cells: int, k: int, draws: int | None = None) -> np.ndarray:
    """P(X >= x) for x = 0..draws, X the overlap of a random ``draws``-subset of
    ``n_cells`` cells with a fixed set of k cells (``catalog.core.stats.hypergeom_tail``;
    draws defaults to k). Read-only, cached there: every layer of a checkpoint asks for
    the same (cells, k) pairs."""
    draws = k if draws is None else draws
    if not 0 < k <= n_cells:
        raise ValueError(f"k must be in 1..{n_cells}, got {k}")
    if not 0 < draws <= n_cells:
        raise ValueError(f"draws must be in 1..{n_cells}, got {draws}")
    return hypergeom_tail(int(n_cells), int(k), int(draws))


def p_values(score: np.ndarray, k: np.ndarray, n_cells: int,
             draws: np.ndarray | int | None = None) -> np.ndarray:
    """Exact p-value of each score (one row per score: its heuristic's k = |S_H| and the
    number of top cells drawn, k itself for Algorithm 1, K for pattern counting)."""
    score, k = np.asarray(score, dtype=np.float64), np.asarray(k, dtype=np.int64)
    d = k.copy() if draws is None else np.broadcast_to(np.asarray(draws, dtype=np.int64),
                                                       k.shape)
    out = np.empty(len(score), dtype=np.float64)
    # whole cells of the overlap: float64 scores are count / draws to 1e-15, so a count
    # of whole cells is recovered exactly; shared ties round down (conservative)
    x = np.floor(score * d + 1e-9 * np.maximum(d, 1)).astype(np.int64)
    for kk, dd in set(zip(k.tolist(), d.tolist(), strict=True)):
        sel = (k == kk) & (d == dd)
        out[sel] = overlap_tail(n_cells, int(kk), int(dd))[np.clip(x[sel], 0, dd)]
    return out


def labels(score: np.ndarray, p_value: np.ndarray, threshold: float, rule: str,
           level: float, n_tests: int) -> np.ndarray:
    """Which rows mean "the neuron implements the heuristic" (see the module docstring):
    rule 'paper' is score >= threshold; 'significant' also needs p <= level / n_tests
    (rows without a p-value are never labelled under it)."""
    ok = np.asarray(score) >= threshold
    if rule == "paper":
        return ok
    p = np.asarray(p_value, dtype=np.float64)
    return ok & (np.nan_to_num(p, nan=2.0) <= level / max(n_tests, 1))
