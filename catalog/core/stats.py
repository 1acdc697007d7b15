"""Every statistic the catalog reports or decides with, defined once: intervals of a
share and of a difference of shares, a share's standard error, the exact hypergeometric
tail (the label rule's overlap test, the enrichment's Fisher test), Fisher's combination
of two p-values, rank correlation, the trimmed mean and a median's interval. Each is
tested against published values (tests/unit/test_stats.py).

scipy computes where it is right and fast enough (the Spearman correlation, the normal
and t tails). Five are written here, each for a stated reason:

- ``wilson``: the closed form takes 1.8 us a call, scipy's
  ``binomtest(k, n).proportion_ci(method="wilson")`` 1.6 ms (it computes the test's
  p-value first); a summary asks for thousands (every layer, operator, family and set),
  and the test checks the two agree to 1e-12;
- ``hypergeom_tail``: the upper tail for every threshold at once, summed in log space;
  scipy's ``hypergeom.sf`` agrees to 2e-10 down to 1e-300 but takes 1.5 ms (900 cells)
  to 260 ms (90,000 cells) a tail where this takes 0.1-0.3 ms, and the label rule asks
  for thousands;
- ``fisher_combined``: a closed form, vectorised over arrays of p-value pairs
  (``scipy.stats.combine_pvalues`` takes one set per call);
- ``trimmed_mean``: the kept values are summed in sorted order, so a neuron's rank
  statistic has the same bits on every machine (``scipy.stats.trim_mean`` sums a
  partition whose order is the implementation's, and ranks of near-equal neurons
  would depend on it);
- ``nan_mean``: numpy's ``nanmean`` without its warning on slices with no finite value
  (their mean is NaN, the answer for a checkpoint that answers no prompt).

This module imports nothing from the catalog: any layer may use it.
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import numpy as np

# the two-sided 95% normal quantile
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial share k / n at the level of ``z`` (two-sided;
    95% by default), without continuity correction. (nan, nan) for n = 0: no share, so
    no interval (callers print "-")."""
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= k <= n:
        raise ValueError(f"a share needs 0 <= k <= n, got k = {k}, n = {n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def share_se(p: float, n: int) -> float:
    """Standard error of a share p measured on n trials, sqrt(p (1 - p) / n) (nan for
    n = 0)."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def newcombe(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval (1998, method 10) of p1 - p2, from the two Wilson
    intervals; (nan, nan) where either share has no trials."""
    if not n1 or not n2:
        return float("nan"), float("nan")
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1)
    l2, u2 = wilson(k2, n2)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def log_n_choose(n: int, r: int) -> float:
    """log C(n, r), the log of the binomial coefficient."""
    return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)


def hypergeom_log_pmf(n: int, k: int, draws: int) -> np.ndarray:
    """log P(X = x), x = 0..draws, for X the overlap of a random ``draws``-subset of ``n``
    items with a fixed set of ``k`` of them (-inf where impossible)."""
    from scipy.special import gammaln

    if not (0 <= k <= n and 0 <= draws <= n):
        raise ValueError(f"a hypergeometric needs 0 <= k, draws <= n, got n = {n}, "
                         f"k = {k}, draws = {draws}")
    x = np.arange(draws + 1, dtype=np.float64)
    possible = (x <= k) & (draws - x <= n - k)
    xs = np.where(possible, x, 0.0)
    out = (gammaln(k + 1) - gammaln(xs + 1) - gammaln(k - xs + 1)
           + gammaln(n - k + 1) - gammaln(draws - xs + 1) - gammaln(n - k - draws + xs + 1)
           - (gammaln(n + 1) - gammaln(draws + 1) - gammaln(n - draws + 1)))
    return np.where(possible, out, -np.inf)


@lru_cache(maxsize=8192)
def hypergeom_tail(n: int, k: int, draws: int) -> np.ndarray:
    """P(X >= x), x = 0..draws (``hypergeom_log_pmf``'s X), summed in log space from the
    right so that tails down to 1e-300 keep their digits. Cached (the label rule asks for
    the same (n, k, draws) on every layer); the array is read-only."""
    log_pmf = hypergeom_log_pmf(n, k, draws)
    with np.errstate(divide="ignore"):
        tail = np.exp(np.logaddexp.accumulate(log_pmf[::-1])[::-1])
    tail = np.minimum(tail, 1.0)
    # overlaps the draws force (at least 0; at least draws - (n - k)) are certain: exactly
    # 1, not the sum's rounding (a one-sided test of no excess must give p = 1)
    tail[:max(0, draws - (n - k)) + 1] = 1.0
    tail.flags.writeable = False
    return tail


def hypergeom_pmf(n: int, k: int, draws: int) -> np.ndarray:
    """P(X = x), x = 0..draws (``hypergeom_log_pmf``)."""
    return np.exp(hypergeom_log_pmf(n, k, draws))


def fisher_greater(k1: int, n1: int, k2: int, n2: int) -> float:
    """One-sided Fisher exact p-value that group 1's share k1 / n1 is the larger: P(X >= k1)
    for X the successes among n1 items drawn from the n1 + n2 with k1 + k2 successes."""
    total, successes = n1 + n2, k1 + k2
    if n1 == 0 or successes == 0:
        return 1.0
    return float(hypergeom_tail(total, successes, n1)[min(k1, n1)])


def fisher_combined(p1: np.ndarray | float, p2: np.ndarray | float) -> np.ndarray:
    """Fisher's combination of two independent p-values, elementwise: with u = p1 p2,
    P(U1 U2 <= u) = u (1 - ln u) (the chi-square tail with 4 degrees of freedom)."""
    u = np.clip(np.asarray(p1, dtype=np.float64) * np.asarray(p2, dtype=np.float64),
                1e-300, 1.0)
    return np.minimum(1.0, u * (1.0 - np.log(u)))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of the pairs where both are finite (average ranks for
    ties); NaN with fewer than 3 pairs or a constant side."""
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def mean_se(x: np.ndarray) -> dict:
    """Mean, standard error over the values and normal 95% interval of ``x`` (its finite
    values), with n: {"mean", "se", "ci", "n"} (NaN SE below two values)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    mean = float(x.mean()) if n else float("nan")
    se = float(x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return {"mean": mean, "se": se, "ci": [mean - 1.96 * se, mean + 1.96 * se], "n": n}


def trimmed_mean(x: np.ndarray, prop: float) -> np.ndarray:
    """Mean over the last axis after dropping floor(prop * n) values at each end (NaN for
    an empty axis); the kept values are summed in sorted order (see the module doc)."""
    n = x.shape[-1]
    if n == 0:
        return np.full(x.shape[:-1], np.nan, dtype=np.float32)
    cut = int(np.floor(prop * n))
    s = np.sort(x, axis=-1)
    return s[..., cut:n - cut].mean(-1)


def median_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The distribution-free interval of a median from two order statistics: [x_(r),
    x_(n-r+1)] (1-based) with the largest r whose coverage 1 - 2 P(B <= r - 1), B ~
    Binomial(n, 1/2), is at least ``level``; (nan, nan) below 6 values at 95% (no pair of
    order statistics covers that often). NaN values are left out."""
    from scipy import stats

    s = np.sort(np.asarray(x, dtype=np.float64)[np.isfinite(np.asarray(x, dtype=np.float64))])
    n = len(s)
    if n == 0:
        return float("nan"), float("nan")
    r = int(stats.binom.ppf((1 - level) / 2, n, 0.5))  # smallest r' with P(B <= r') >= a/2
    if stats.binom.cdf(r, n, 0.5) > (1 - level) / 2:
        r -= 1  # then P(B <= r) <= a/2 and [x_(r+1), x_(n-r)] covers at least level
    if r < 0:
        return float("nan"), float("nan")
    return float(s[r]), float(s[n - r - 1])


def nan_mean(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``np.nanmean`` without its "Mean of empty slice" warning: a slice with no finite
    value has mean NaN, which is the answer here, not a fault (a checkpoint early in
    training answers no prompt, so every faithfulness ratio and component effect of it
    is NaN, and the worker's log filled with warnings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)
