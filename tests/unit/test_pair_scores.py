"""The second pass's per-pair scoring (catalog.labels.pair_scores) gives the rows that scoring
every result heuristic of each pair's map and keeping its own set's rows gives: the same
rows in the same order, the same scores, sides and p-values to the last bit, the same
sort orders for the value rule, on maps with ties at the k-th value (scored the long way)
and without."""

import numpy as np
import pytest
import torch
from labelling import cells_of

from catalog.config import ScienceConfig
from catalog.labels import pair_scores
from catalog.labels.heuristics import partitions_for, result_partitions
from catalog.labels.matching import score_partitions
from catalog.labels.operator_labels import unique_rows


def _sets(parts):
    """Each result heuristic's set row (distinct cell sets) by key, as the fit numbers them."""
    own, keys = [], []
    for p in parts:
        for i, h in enumerate(p.heuristics):
            own.append(p.labels == i)
            keys.append(h.key)
    uniq, _, row = unique_rows(np.stack(own), inverse=True)
    return len(uniq), dict(zip(keys, row.tolist(), strict=True))


def _maps(cells, parts, set_of, n_sets, rng):
    """Pair maps of every kind the second pass meets: noise, a set planted in noise (the
    pair's own or another), values rounded so that the k-th value is tied, a long run of
    zeros (a ReLU), constants; and each map's set."""
    n_cells = len(cells.a)
    row_set = rng.integers(0, n_sets, 240)
    member = {}
    for p in parts:
        for i, h in enumerate(p.heuristics):
            member.setdefault(set_of[h.key], p.labels == i)
    maps = rng.standard_normal((240, n_cells))
    for i in range(0, 240, 3):  # the pair's own set on top (or at the bottom)
        sign = 1.0 if i % 2 else -1.0
        maps[i] += sign * 2.5 * member[int(row_set[i])]
    maps[1::4] = np.round(maps[1::4])  # a few values shared by many cells: tied k-th values
    maps[2::8] = np.maximum(maps[2::8], 0) * (rng.random((30, n_cells)) < 0.2)
    maps[5::40] = 0.5
    row_set[7::50] = -1  # a map without a set: nothing scored on it
    return torch.as_tensor(maps, dtype=torch.float32), row_set


@pytest.mark.parametrize("op,hi,with_bottom,floor,variant", [
    ("+", 20, True, 0.0, "paper"), ("*", 20, True, 0.5, "paper"),
    ("+", 30, False, 0.3, "paper"), ("-", 20, True, 0.2, "code")])
def test_pairs_score_as_every_heuristic_scored_then_kept(op, hi, with_bottom, floor, variant,
                                                         monkeypatch):
    cells = cells_of(op, hi)
    config = ScienceConfig(operand_hi=hi, heuristic_variant=variant)
    parts = result_partitions(partitions_for(cells, config))
    # the released code's digit patterns count their cells among K top cells
    assert any(p.scoring == "count" for p in parts) == (variant == "code")
    n_sets, set_of = _sets(parts)
    rng = np.random.default_rng(7)
    maps, row_set = _maps(cells, parts, set_of, n_sets, rng)
    fell_back: list = []
    real = pair_scores._add_fallback
    monkeypatch.setattr(pair_scores, "_add_fallback",
                        lambda cols, m, maps_, *a: (fell_back.extend(maps_.tolist()),
                                                    real(cols, m, maps_, *a)))
    pair_orders: dict = {}
    got = score_partitions(maps, maps, parts, floor, with_bottom, config.pattern_top_k,
                           cells=cells, orders=pair_orders, pairs=(row_set, set_of))
    every_orders: dict = {}
    every = score_partitions(maps, maps, parts, floor, with_bottom, config.pattern_top_k,
                             cells=cells, orders=every_orders)
    at = np.array([set_of.get(h.key, -1) for h in every.heuristics])[every.heuristic]
    want = every._select((at >= 0) & (at == row_set[every.neuron]))
    assert [h.key for h in got.heuristics] == [h.key for h in want.heuristics]
    for f in ("neuron", "op", "heuristic", "score", "bottom", "base_rate", "p_value"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    # the value rule reads the KV side's orders; these maps are both K and KV maps
    assert set(pair_orders) == {(True, False), (True, True)} if with_bottom else {(True, False)}
    for key, order in pair_orders.items():
        np.testing.assert_array_equal(order.numpy(), every_orders[key].numpy())
    # the test has teeth: rows on both sides, maps with tied k-th values scored the long way
    # (rounded ones), rows kept from them, and maps with no row of their set
    assert len(got) > 20 and got.bottom.any() == with_bottom
    assert len(fell_back) > 10 and np.isin(got.neuron, fell_back).any()
    assert not np.isin(got.neuron, np.nonzero(row_set < 0)[0]).any()


def test_candidates_are_each_maps_own_sets_heuristics_in_order():
    """(map, heuristic) of every heuristic whose set is the map's, by map then heuristic;
    a set named by two heuristics of one partition gives both, a map of set -1 none."""
    from catalog.labels.heuristics import Heuristic, Partition

    hs = [Heuristic("range", "result", (i, 1)) for i in range(4)]
    part = Partition(hs, np.array([0, 1, 2, 3, -1]), np.array([1, 1, 1, 1]))
    set_of = {hs[0].key: 2, hs[1].key: 0, hs[2].key: 2, hs[3].key: -1}
    rows, h = pair_scores.candidates(part, np.array([2, -1, 0, 1, 2]), set_of)
    assert rows.tolist() == [0, 0, 2, 4, 4]
    assert h.tolist() == [0, 2, 1, 0, 2]


def test_a_set_counted_two_ways_with_a_tie_at_one_gives_each_row_once():
    """A set named by a heuristic scored on its k cells and by one counted among K top
    cells: a map tied at the K-th value but not at the k-th (or the other way) is scored
    the long way whole, so each of its rows comes once, as scoring every heuristic gives."""
    from catalog.labels.heuristics import Heuristic, Partition

    n, k_top = 40, 5
    labels = np.where(np.arange(n) < 10, 0, -1)
    own = Partition([Heuristic("range", "result", (0, 10))], labels, np.array([10]))
    counted = Partition([Heuristic("pattern", "result", ("x",))], labels, np.array([10]),
                        scoring="count")
    set_of = {own.heuristics[0].key: 0, counted.heuristics[0].key: 0}
    rng = np.random.default_rng(3)
    maps = np.stack([rng.permutation(n).astype(np.float32) for _ in range(3)])
    desc = np.argsort(-maps, axis=1)
    maps[1, desc[1, 4]] = maps[1, desc[1, 5]]  # the 5th and 6th largest equal: a tie at K
    maps[2, desc[2, 9]] = maps[2, desc[2, 10]]  # a tie at the 10th: at k, not at K
    maps_t = torch.as_tensor(maps)
    row_set = np.zeros(3, dtype=np.int64)
    parts = [own, counted]
    got = score_partitions(maps_t, maps_t, parts, 0.0, True, k_top, pairs=(row_set, set_of))
    every = score_partitions(maps_t, maps_t, parts, 0.0, True, k_top)
    assert len(got) == len(every) == 6
    for f in ("neuron", "heuristic", "score", "bottom", "p_value"):
        np.testing.assert_array_equal(getattr(got, f), getattr(every, f), err_msg=f)
