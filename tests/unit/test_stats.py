"""catalog.core.stats, the one home of every statistic: published values, exact rationals, and
scipy's own implementations where the catalog keeps a faster hand version."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sps

from catalog.core import stats


@pytest.mark.parametrize(("k", "n", "want"), [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion",
    # table I, method 3 (score interval without continuity correction)
    (81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)),
    (0, 20, (0.0, 0.1611)), (1, 29, (0.0061, 0.1718)),
])
def test_wilson_published_values(k, n, want):
    assert stats.wilson(k, n) == pytest.approx(want, abs=5e-5)


def test_wilson_equals_scipy_and_handles_the_edges():
    for k, n in [(0, 1), (1, 1), (3, 10), (10, 10), (500, 2928), (2928, 2928), (7, 1000)]:
        ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert stats.wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert all(math.isnan(x) for x in stats.wilson(0, 0))  # no trials: no interval
    with pytest.raises(ValueError, match="k = 5, n = 4"):
        stats.wilson(5, 4)


def test_newcombe_published_values():
    # Newcombe (1998), "Interval estimation for the difference between independent
    # proportions", table II, method 10: 56/70 - 48/80 -> 0.0524 to 0.3339,
    # 9/10 - 3/10 -> 0.1705 to 0.8090
    assert stats.newcombe(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert stats.newcombe(9, 10, 3, 10) == pytest.approx((0.1705, 0.8090), abs=5e-5)
    assert all(math.isnan(x) for x in stats.newcombe(1, 0, 1, 2))


def test_hypergeometric_tail_exact_rationals():
    # Fisher's lady tasting tea: 8 cups, 4 with the milk first, she names 4: all right
    # with probability 1/70, at least 3 right with 17/70
    tail = stats.hypergeom_tail(8, 4, 4)
    assert tail[4] == pytest.approx(1 / 70, rel=1e-12)
    assert tail[3] == pytest.approx(17 / 70, rel=1e-12)
    assert tail[0] == 1.0
    # every overlap at least 0 (or at least what the draws force): exactly 1
    assert stats.hypergeom_tail(900, 450, 90)[0] == 1.0
    assert (stats.hypergeom_tail(10, 8, 5)[:4] == 1.0).all()  # 5 draws of 10, 8 in the set
    # every tail of a small case against exact counting with fractions
    for n, k, d in [(20, 7, 5), (30, 29, 12), (12, 3, 12), (9, 0, 4)]:
        want = [sum((Fraction(math.comb(k, j) * math.comb(n - k, d - j), math.comb(n, d))
                     for j in range(x, d + 1)), Fraction(0)) for x in range(d + 1)]
        np.testing.assert_allclose(stats.hypergeom_tail(n, k, d), [float(w) for w in want],
                                   rtol=1e-11, atol=0)
    assert not stats.hypergeom_tail(8, 4, 4).flags.writeable
    with pytest.raises(ValueError, match="k = 9"):
        stats.hypergeom_log_pmf(8, 9, 4)


@pytest.mark.parametrize(("n", "k", "d"), [(900, 90, 90), (2500, 250, 250), (900, 450, 90)])
def test_hypergeometric_tail_equals_scipy_to_its_far_end(n, k, d):
    x = np.arange(d + 1)
    want = sps.hypergeom.sf(x - 1, n, k, d)
    got = stats.hypergeom_tail(n, k, d)
    keep = want > 1e-290  # the far ends here: 2e-126, 1e-300, 6e-30
    assert got[keep].min() < 1e-29
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-9)
    np.testing.assert_allclose(stats.hypergeom_pmf(n, k, d), sps.hypergeom.pmf(x, n, k, d),
                               rtol=1e-9, atol=1e-300)


def test_fisher_greater_equals_scipy_and_the_hypergeometric_sum():
    for k1, n1, k2, n2 in [(8, 10, 3, 10), (45, 50, 160, 200), (0, 5, 5, 5), (3, 3, 0, 30),
                           (1688, 2928, 1333, 2928)]:
        want = sps.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="greater").pvalue
        assert stats.fisher_greater(k1, n1, k2, n2) == pytest.approx(want, rel=1e-8)
    assert stats.fisher_greater(0, 5, 0, 5) == 1.0  # nothing labelled: no evidence


def test_fisher_combined_equals_scipy():
    rng = np.random.default_rng(0)
    p1, p2 = rng.random(20), rng.random(20) ** 4
    want = [sps.combine_pvalues([a, b], method="fisher").pvalue
            for a, b in zip(p1, p2, strict=True)]
    np.testing.assert_allclose(stats.fisher_combined(p1, p2), want, rtol=1e-10)
    assert stats.fisher_combined(1.0, 1.0) == 1.0


def test_spearman_published_value_and_edges():
    # the IQ and television-hours example of Spearman's coefficient: rho = -29/165
    iq = np.array([106, 100, 86, 101, 99, 103, 97, 113, 112, 110], float)
    tv = np.array([7, 27, 2, 50, 28, 29, 20, 12, 6, 17], float)
    assert stats.spearman(iq, tv) == pytest.approx(-29 / 165, abs=1e-12)
    # ties get average ranks: the Pearson correlation of the average ranks
    x, y = np.array([1, 2, 2, 3, 5.0]), np.array([2, 1, 4, 4, 9.0])
    rx, ry = sps.rankdata(x), sps.rankdata(y)
    assert stats.spearman(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1], abs=1e-12)
    assert stats.spearman(np.array([1.0, 2, np.nan, 4]), np.array([1.0, 2, 3, 4])) == 1.0
    assert math.isnan(stats.spearman(np.ones(5), np.arange(5.0)))
    assert math.isnan(stats.spearman(np.arange(2.0), np.arange(2.0)))


def test_trimmed_mean_known_values_and_scipy():
    assert stats.trimmed_mean(np.arange(10.0), 0.1) == pytest.approx(4.5)
    assert stats.trimmed_mean(np.array([1.0, 2, 3, 4, 100]), 0.2) == pytest.approx(3.0)
    x = np.random.default_rng(1).standard_cauchy((30, 47))
    np.testing.assert_allclose(stats.trimmed_mean(x, 0.1), sps.trim_mean(x, 0.1, axis=1),
                               rtol=1e-12)
    assert np.isnan(stats.trimmed_mean(np.zeros((3, 0)), 0.1)).all()


def test_log_n_choose():
    assert math.exp(stats.log_n_choose(52, 5)) == pytest.approx(2_598_960, rel=1e-12)


def test_share_standard_error():
    assert stats.share_se(0.5, 100) == pytest.approx(0.05)
    assert stats.share_se(0.0, 10) == 0.0
    assert math.isnan(stats.share_se(0.5, 0))


def test_median_interval_is_the_published_order_statistics():
    """Ranks of the distribution-free 95% interval of a median (Campbell and Gardner,
    BMJ 1988, table): n = 10: 2nd and 9th; 20: 6th and 15th; 50: 18th and 33rd; 100: 40th
    and 61st; under 6 values no pair of order statistics covers 95%."""
    for n, lo, hi in ((10, 2, 9), (20, 6, 15), (50, 18, 33), (100, 40, 61), (6, 1, 6)):
        assert stats.median_ci(np.arange(1, n + 1)[::-1]) == (lo, hi)
    assert all(np.isnan(stats.median_ci(np.arange(5))))
    assert stats.median_ci(np.array([np.nan, 3, 1, 2, 5, 4, 6])) == (1, 6)


def test_nan_mean_is_numpys_without_the_empty_slice_warning():
    """Equal to np.nanmean wherever a slice has a finite value, NaN where none has, and
    no warning either way (an early checkpoint's all-NaN ratios filled the worker's log)."""
    import warnings

    x = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [2.0, 2.0, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = stats.nan_mean(x, axis=1)
        col = stats.nan_mean(x, axis=0)
        whole = stats.nan_mean(np.full(4, np.nan))
    np.testing.assert_array_equal(got, [2.0, np.nan, 2.0])
    np.testing.assert_array_equal(col, [1.5, 2.0, 3.0])
    assert np.isnan(whole)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        np.nanmean(x, axis=1)  # what it replaces does warn


def test_mean_se_by_hand():
    from catalog.core.stats import mean_se

    got = mean_se(np.array([1.0, 2.0, 3.0, 4.0, np.nan]))  # NaN left out
    se = np.sqrt(((np.arange(1, 5) - 2.5) ** 2).sum() / 3) / 2  # 0.6455
    assert got["n"] == 4 and got["mean"] == 2.5 and got["se"] == pytest.approx(se)
    assert got["ci"] == pytest.approx([2.5 - 1.96 * se, 2.5 + 1.96 * se])
    assert np.isnan(mean_se(np.array([3.0]))["se"])
