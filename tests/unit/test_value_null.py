"""The 'values' label rule (catalog.labels.value_null): structured maps that compute no
arithmetic are labelled at most at the configured rate, planted heuristics still are, and the exact
tail equals enumeration and Monte Carlo."""

import itertools

import numpy as np
import pytest
import torch
from labelling import cells_of, labelled

from catalog.config import ScienceConfig
from catalog.core.arith import OPERATORS
from catalog.labels import tails
from catalog.labels.heuristics import Cells, Heuristic, partitions_for

LEVEL = 0.05


def structured_maps(kind: str, cells: Cells, n: int, rng) -> np.ndarray:
    """Maps that compute no arithmetic: a random function of op1, of op2, of the result
    value, or of the result's magnitude (its number of digits), plus a little noise."""
    x = {"op1": cells.a, "op2": cells.b, "result": cells.result,
         "magnitude": tails.digit_count(cells.result)}[kind]
    _, inv = np.unique(x, return_inverse=True)
    f = rng.standard_normal((n, inv.max() + 1))
    return (f[:, inv] + 0.1 * rng.standard_normal((n, len(cells.a)))).astype(np.float32)


@pytest.mark.parametrize("hi", [10, 30, 100])
@pytest.mark.parametrize("op", OPERATORS)
def test_structured_maps_without_arithmetic_are_labelled_at_most_at_the_level(op, hi):
    cells = cells_of(op, hi)
    config = ScienceConfig(operand_hi=hi, significance_level=LEVEL)
    rng = np.random.default_rng([hi, OPERATORS.index(op)])
    for kind in ("op1", "op2", "result", "magnitude"):
        n = 1000
        hits = set()
        for start in range(0, n, 250):
            maps = structured_maps(kind, cells, 250, rng)
            m = labelled(op, cells, maps, maps, config)  # the KV map as a flat lens gives it
            hits |= {start + int(i) for i in m.neuron[m.implements]}
        # the family-wise level, with room for sampling error: 5% of 1,000 is 50, sd 7
        assert len(hits) <= LEVEL * n + 3 * np.sqrt(n * LEVEL * (1 - LEVEL)), (kind, len(hits))


def test_the_cell_null_labels_structured_maps_the_value_null_does_not():
    cells = cells_of("+", 30)
    maps = structured_maps("op1", cells, 200, np.random.default_rng(3))
    cell_rule = labelled("+", cells, maps, maps, ScienceConfig(operand_hi=30,
                                                               label_rule="significant"))
    value_rule = labelled("+", cells, maps, maps, ScienceConfig(operand_hi=30))
    n_cell = len(np.unique(cell_rule.neuron[cell_rule.implements]))
    n_value = len(np.unique(value_rule.neuron[value_rule.implements]))
    assert n_cell > 100 and n_value <= 10, (n_cell, n_value)


PLANTED = [("+", Heuristic("range", "op1", (10, 10))),
           ("+", Heuristic("modulo", "op2", (3, 1))),
           ("+", Heuristic("pattern", "result", ("..7",))),
           ("+", Heuristic("identical", "both", ())),
           ("+", Heuristic("range", "both", (10, 10))),
           ("+", Heuristic("modulo", "result", (5, 2))),
           ("*", Heuristic("range", "op1", (20, 10))),
           ("*", Heuristic("modulo", "both", (2, 0))),
           ("*", Heuristic("pattern", "result", ("..7",))),
           ("-", Heuristic("modulo", "op1", (4, 3))),
           ("/", Heuristic("range", "op2", (10, 10))),
           ("/", Heuristic("modulo", "op1", (3, 0)))]


@pytest.mark.parametrize("op,h", PLANTED, ids=[f"{o}{h.key}" for o, h in PLANTED])
def test_planted_heuristics_are_still_labelled(op, h):
    cells = cells_of(op, 100)
    rng = np.random.default_rng(7)
    member = h.contains(cells.a, cells.b, cells.result)
    maps = (member + 0.3 * rng.standard_normal((3, len(cells.a)))).astype(np.float32)
    m = labelled(op, cells, maps, maps, ScienceConfig(operand_hi=100))
    for neuron in range(3):
        got = {m.heuristics[i].key for i in m.heuristic[(m.neuron == neuron) & m.implements]}
        assert h.key in got, (neuron, got)


def test_single_values_and_multi_results_cannot_beat_a_relabelling():
    """op1 = 17 alone is one row among the two-digit ones: its best p-value is 1/90, never
    below the corrected level; under the cell rule it is labelled."""
    cells = cells_of("+", 100)
    h = Heuristic("value", "op1", (17,))
    maps = (h.contains(cells.a, cells.b, cells.result)
            + 0.3 * np.random.default_rng(0).standard_normal((2, len(cells.a)))).astype(
        np.float32)
    values = labelled("+", cells, maps, maps, ScienceConfig(operand_hi=100))
    row = [i for i in range(len(values)) if values.row_heuristic(i).key == h.key]
    assert row and values.p_value[row[0]] == pytest.approx(1 / 90)
    assert not values.implements[row].any()
    cell = labelled("+", cells, maps, maps, ScienceConfig(operand_hi=100,
                                                          label_rule="significant"))
    assert any(cell.row_heuristic(i).key == h.key for i in np.nonzero(cell.implements)[0])


def _brute_force_tail(share: np.ndarray, member: np.ndarray, stratum: np.ndarray) -> float:
    """P(X >= x_obs) by enumerating every relabelling of the values within strata."""
    m = int(member.sum())
    order = np.sort(share)[::-1]
    top = share >= order[m - 1]
    x_obs = int((top & member).sum())
    groups = [np.nonzero(stratum == s)[0] for s in np.unique(stratum)]
    hits = total = 0
    for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
        relabel = np.empty(len(share), dtype=np.int64)
        for g, p in zip(groups, perms, strict=True):
            relabel[g] = p
        x = int((top & member[relabel]).sum())
        hits += x >= x_obs
        total += 1
    return hits / total


def test_the_exact_tail_equals_enumeration_on_a_small_grid():
    rng = np.random.default_rng(0)
    values = np.array([1, 4, 7, 12, 15, 18, 33])  # strata: one digit (3), two digits (4)
    cells = Cells("+", values, np.zeros_like(values), values, 0, 40)
    groups = tails.ValueGroups.of(cells, "op1")
    assert groups.n_strata == 2
    for trial in range(40):
        share = rng.integers(0, 4, len(values)).astype(np.float64)  # ties included
        member = rng.random(len(values)) < 0.5
        if not member.any():
            continue
        got = tails.set_p_values(torch.as_tensor(share[None, :]), member[None, :], groups)[0]
        assert got == pytest.approx(_brute_force_tail(share, member, groups.stratum),
                                    abs=1e-12), trial


def test_the_exact_tail_equals_monte_carlo_on_a_larger_grid():
    rng = np.random.default_rng(1)
    cells = cells_of("+", 60)
    groups = tails.ValueGroups.of(cells, "op1")
    share = rng.random(60) + (np.arange(60) % 7 == 3) * 0.25  # residue 3 (mod 7) lifted
    member = np.arange(60) % 7 == 3
    exact = tails.set_p_values(torch.as_tensor(share[None, :]), member[None, :], groups)[0]
    m = int(member.sum())
    top = share >= np.sort(share)[::-1][m - 1]
    x_obs = int((top & member).sum())
    b = 200_000
    perms = tails.strata_permutations(groups.stratum, b, np.random.default_rng(2))
    x = (top[None, :] & member[perms]).sum(1)
    mc = float((x >= x_obs).mean())
    se = np.sqrt(mc * (1 - mc) / b)
    assert 1e-4 < exact < 0.5
    assert abs(exact - mc) < 4 * se + 1e-5, (exact, mc, se)


def test_the_within_class_bound_is_above_the_exact_shuffle_tail():
    """The conditional test's Hoeffding/Bernstein bound is an upper bound: never below the
    Monte Carlo tail of shuffling the map within each result."""
    cells = cells_of("+", 12)
    classes = tails.ValueGroups.of(cells, "result")
    rng = np.random.default_rng(4)
    member = (cells.a >= 6)
    for _ in range(5):
        w = (rng.random(len(cells.a)) < 0.3 + 0.4 * member).astype(np.float64)
        w_c = np.bincount(classes.group, weights=w, minlength=len(classes.values))
        s_c = np.bincount(classes.group, weights=member.astype(float),
                          minlength=len(classes.values))
        bound = tails.within_class_tail(torch.as_tensor(w_c[None, :]),
                                        torch.as_tensor(s_c[None, :]),
                                        torch.as_tensor(classes.size, dtype=torch.float64),
                                        torch.as_tensor([(w * member).sum()]))[0]
        t_obs = (w * member).sum()
        b = 20_000
        null = np.zeros(b)
        for i in range(b):
            shuffled = w.copy()
            for c in range(len(classes.values)):
                idx = np.nonzero(classes.group == c)[0]
                shuffled[idx] = rng.permutation(w[idx])
            null[i] = (shuffled * member).sum()
        assert bound >= (null >= t_obs - 1e-9).mean() - 3 / np.sqrt(b)


def test_tarone_counts_only_tests_that_can_reach_the_level():
    assert tails.tarone(np.array([1e-9] * 10 + [0.5] * 1000), 0.05) == 10
    assert tails.tarone(np.array([1e-9] * 30), 0.05) == 30


def test_duplicate_cell_sets_are_scored_once_under_the_simplest_name():
    cells = cells_of("+", 20)
    parts = partitions_for(cells, ScienceConfig(operand_hi=20))
    every = partitions_for(cells, ScienceConfig(operand_hi=20, dedupe_heuristics=False))
    hs = [h for p in parts for h in p.heuristics]
    keys = {h.key for h in hs}
    assert "range:op1:10:10" in keys and "pattern:op1:.1." not in keys
    kept = next(h for h in hs if h.key == "range:op1:10:10")
    assert "op1 matches .1." in kept.aliases
    # every cell set once per map, and nothing lost: each dropped heuristic is an alias
    sets = [(h.direct, h.contains(cells.a, cells.b, cells.result).tobytes()) for h in hs]
    assert len(sets) == len(set(sets))
    n_every = sum(len(p.heuristics) for p in every)
    assert n_every - len(hs) == sum(len(h.aliases) for h in hs) > 0


def test_the_sequential_monte_carlo_of_op1_eq_op2_is_valid_and_stops_early():
    """On maps with no diagonal structure the p-value is uniform or above it (at most ~5%
    below 0.05) and most maps stop after a block; a planted diagonal runs to the end."""
    cells = cells_of("+", 30)
    rows, cols = tails.ValueGroups.of(cells, "op1"), tails.ValueGroups.of(cells, "op2")
    rng = np.random.default_rng(8)
    maps = torch.as_tensor(structured_maps("op1", cells, 300, rng), dtype=torch.float64)
    diag = torch.as_tensor(cells.a == cells.b, dtype=torch.float64)
    maps = torch.cat([maps, diag[None, :] + 0.1 * torch.randn(1, len(cells.a),
                                                              dtype=torch.float64)])
    weights = tails.top_weights(maps, 30)
    p = tails.identical_p(weights, cells, rows, cols, 20_000, seed=0)
    null_p = p[:300]
    assert (null_p <= 0.05).mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 300)
    assert np.median(null_p) > 0.2
    assert p[-1] == pytest.approx(1 / 20_001)
    # a map's own limit (rows that cannot be labelled): the planted diagonal stops at one
    # block, with the p-value of that many draws; every other map is unchanged, and so is
    # a map that stopped early anyway
    limit = np.full(len(p), 20_000)
    limit[-1] = limit[0] = 1024
    capped = tails.identical_p(weights, cells, rows, cols, 20_000, seed=0, limit=limit)
    assert capped[-1] == pytest.approx(1 / 1025)
    np.testing.assert_array_equal(capped[1:-1], p[1:-1])
    if p[0] >= tails.STOP_AFTER / 1024:  # map 0 stopped within its first block
        assert capped[0] == p[0]


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_the_controls_count_of_labelled_maps_equals_labelling_every_row(op):
    """``labelled_maps`` (the relabelled-values control) scores only rows from the label
    threshold up and only partitions that can reach the corrected level: the maps it
    counts are exactly those that scoring every partition and labelling label."""
    from catalog.labels import controls, value_null
    from catalog.labels.heuristics import n_tests
    from catalog.labels.operand_fit import OperandFit

    hi = 30
    cells = cells_of(op, hi)
    config = ScienceConfig(operand_hi=hi, operators=(op,))
    rng = np.random.default_rng([11, OPERATORS.index(op)])
    planted = [h for _, h in PLANTED if h.family != "identical"]
    member = np.stack([h.contains(cells.a, cells.b, cells.result) for h in planted])
    # planted sets at noise levels from clear to lost, beside maps with no arithmetic
    noise = np.repeat([0.3, 0.8, 1.5], len(planted))[:, None]
    maps = np.concatenate([np.tile(member, (3, 1)) + noise * rng.standard_normal(
        (3 * len(planted), len(cells.a))),
        structured_maps("op1", cells, 20, rng), structured_maps("result", cells, 20, rng)])
    maps = maps.astype(np.float32)
    kv = (maps + 0.2 * rng.standard_normal(maps.shape)).astype(np.float32)
    full = labelled(op, cells, maps, kv, config)
    expected = np.unique(full.neuron[full.implements])
    assert 0 < len(expected) < len(maps)  # both outcomes occur
    parts = partitions_for(cells, config)
    k = n_tests(parts, True, False)
    null = value_null.ValueNull.of(cells, parts, config.null_strata, config.seed,
                              config.pattern_top_k, k, config.significance_level)
    k = value_null.n_value_tests(null, parts, True, config.significance_level)
    reach = config.significance_level / k
    assert any(all(null.min_p(h) > reach for h in p.heuristics) for p in parts)
    fit = OperandFit.of(op, cells.a, cells.b, cells.result)
    got = controls.labelled_maps(torch.from_numpy(maps), torch.from_numpy(kv), cells,
                                 parts, config, k, null, True, fit)
    np.testing.assert_array_equal(got, expected)
