"""Robust effects: one outlier pair cannot reorder the neurons; the statistics are right."""

import numpy as np
import pytest

from catalog.measuring import effects


def test_statistics_on_hand_numbers():
    log = np.array([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 9.0]])
    st = effects.PairStats.of(log)
    assert st.median[0] == pytest.approx(0.45)
    assert st.trimmed[0] == pytest.approx(np.mean([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))
    assert st.log_mean[0] == pytest.approx(log.mean())
    assert st.moved[0] == pytest.approx(0.9)  # the 0.0 pair does not move the answer
    np.testing.assert_array_equal(effects.ranks(effects.rank_key(
        np.array([[0.1], [-0.5], [0.3], [np.nan]]), "abs"))[:, 0], [2, 0, 1, 3])
    np.testing.assert_array_equal(effects.ranks(effects.rank_key(
        np.array([[0.1], [-0.5], [0.3], [np.nan]]), "signed"))[:, 0], [1, 2, 0, 3])


@pytest.mark.parametrize("statistic", ["trimmed", "median"])
def test_one_outlier_pair_cannot_move_a_neuron_by_more_than_a_few_places(statistic):
    """200 neurons, 100 pairs. One pair of one neuron is the P(r') = 1e-9 case: the paper's
    effect for it is about 1e8, its log-space effect 0.5 * ln(1e8) = 9.2. Under the paper's
    mean the neuron jumps to rank 0; under the robust statistics it moves a few places."""
    rng = np.random.default_rng(0)
    n, pairs = 200, 100
    size = rng.gamma(2.0, 0.02, n)[:, None]
    log = size * (1 + 0.5 * rng.standard_normal((n, pairs)))
    paper = np.expm1(log)  # same order as the log effect for small effects
    before = effects.PairStats.of(log, paper)
    rank_before = effects.ranks(effects.rank_key(before.statistic(statistic)[:, None], "abs"))
    victim = int(np.argsort(-np.abs(before.statistic(statistic)))[120])  # mid-table
    log2, paper2 = log.copy(), paper.copy()
    log2[victim, 7], paper2[victim, 7] = 0.5 * np.log(1e8), 1e8 / 2
    after = effects.PairStats.of(log2, paper2)
    rank_after = effects.ranks(effects.rank_key(after.statistic(statistic)[:, None], "abs"))
    assert abs(int(rank_after[victim, 0]) - int(rank_before[victim, 0])) <= 3
    # the paper's mean is not robust: the outlier wins
    mean_rank = effects.ranks(effects.rank_key(after.statistic("mean")[:, None], "abs"))
    assert mean_rank[victim, 0] == 0


def test_the_spread_of_huge_paper_effects_is_finite_and_warns_nothing():
    import warnings

    from catalog.measuring.effects import PairStats

    # two pairs whose patched answer probability grew by e^80: effects near 5.5e34
    paper = np.array([[np.expm1(80.0), 0.0], [1.0, 3.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = PairStats.of(np.zeros_like(paper), paper)
    assert np.isfinite(stats.std).all()
    assert stats.std[0] == pytest.approx(np.expm1(80.0) / 2, rel=1e-5)
    assert stats.std[1] == pytest.approx(1.0)


def test_an_overflowed_paper_effect_has_an_infinite_spread_and_warns_nothing():
    """A log-probability gap past 88.7 overflows the paper's effect in float32 (an expm1):
    that neuron's mean and spread are infinite, not NaN (NaN says "not measured" here),
    without numpy's "invalid value" warning; a neuron not patched (NaN) stays NaN and the
    other rows keep their values."""
    import warnings

    from catalog.measuring.effects import PairStats

    with np.errstate(over="ignore"):
        big = np.expm1(np.float32(95.0))
    assert np.isinf(big)
    paper = np.array([[big, 0.0, 2.0], [1.0, 3.0, 5.0], [np.nan, np.nan, np.nan]],
                     dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = PairStats.of(np.zeros_like(paper), paper)
    assert stats.mean[0] == np.inf and stats.std[0] == np.inf
    assert stats.mean[1] == pytest.approx(3.0)
    assert stats.std[1] == pytest.approx(np.std([1.0, 3.0, 5.0]))
    assert np.isnan(stats.mean[2]) and np.isnan(stats.std[2])
