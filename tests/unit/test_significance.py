"""Base rates and exact p-values of heuristic scores, against a brute-force reference."""

import math

import numpy as np
import pytest

from catalog.labels.significance import base_rate, overlap_tail, p_values

from reference import reference_score


def tail_by_counting(n: int, k: int, x: int) -> float:
    """P(overlap >= x) summed from binomial coefficients with exact integers."""
    total = math.comb(n, k)
    return sum(math.comb(k, i) * math.comb(n - k, k - i) for i in range(x, k + 1)) / total


@pytest.mark.parametrize("n,k", [(10, 3), (30, 29), (100, 50), (900, 855), (900, 1), (57, 20)])
def test_tail_equals_exact_counting(n, k):
    tail = overlap_tail(n, k)
    for x in range(k + 1):
        assert tail[x] == pytest.approx(tail_by_counting(n, k, x), rel=1e-9, abs=1e-300)
    assert tail[0] == pytest.approx(1.0)


def test_base_rate_is_the_mean_score_of_random_maps():
    """The mean Algorithm 1 score of a heuristic over random maps is |S_H| / cells, and the
    share of random maps at or above a score is the p-value (10,000 maps)."""
    rng = np.random.default_rng(0)
    n, k = 60, 12
    member = np.zeros(n, dtype=bool)
    member[rng.choice(n, k, replace=False)] = True
    scores = np.array([reference_score(rng.standard_normal(n), member) for _ in range(10_000)])
    assert scores.mean() == pytest.approx(base_rate(k, n), abs=0.005)
    for s in (0.25, 0.5, 0.75):
        observed = (scores >= s - 1e-9).mean()
        want = p_values(np.array([s]), np.array([k]), n)[0]
        se = math.sqrt(want * (1 - want) / len(scores))
        assert abs(observed - want) < 4 * se + 1e-4, (s, observed, want)


def test_a_large_set_reaches_the_paper_threshold_on_noise_and_is_not_significant():
    """`result in [0, 50)` covers 855 of 900 cells of the + grid on [0, 30): a score of
    0.95 clears the paper's 0.6 but is only its base rate (what noise gives), while a
    perfect 1.0 (the 45 other cells exactly at the bottom) is overwhelming evidence."""
    assert base_rate(855, 900) == pytest.approx(0.95)
    p = p_values(np.array([0.95, 1.0]), np.array([855, 855]), 900)
    assert p[0] > 0.4 and p[1] < 1e-70
    # a one-cell heuristic scoring 1.0 on a 900-cell grid: p = 1/900
    assert p_values(np.array([1.0]), np.array([1]), 900)[0] == pytest.approx(1 / 900)
    # a 10-cell set fully in the top 10 is very unlikely by chance
    assert p_values(np.array([1.0]), np.array([10]), 900)[0] < 1e-20
