"""The label rule's float32 window scans and its blocks change no label
(catalog.labels.additive.WindowScan.bounds, catalog.labels.gate._rivals,
``BLOCK``): the bounds hold the float64 scan's best window on maps of every scale,
and are tight enough to decide; the gate decides as it does with every map scanned
exactly; labels, rows and p-values do not depend on how many maps a block holds."""

import labelling
import numpy as np
import pytest
import torch
from labelling import additive_maps, cells_of, labelled_with_fit, noise_maps, product_window_maps

from catalog.config import ScienceConfig
from catalog.labels import additive, gate, operand_fit
from catalog.labels import operator_labels as ol
from catalog.labels.additive import SCAN_BINS, AdditiveOperands, WindowScan, other_result
from catalog.labels.fit_models import levels
from catalog.labels.heuristics import Heuristic

LEVEL = 0.05


def _maps(op: str, hi: int, n: int = 60) -> np.ndarray:
    """Result sets, a set with a smooth operand trend mixed in, additive maps, another
    operator's result and noise, at scales from 1e-4 to 1e4 (float32, as the run's)."""
    cells = cells_of(op, hi)
    rng = np.random.default_rng([hi, ord(op)])
    out = []
    for h in (Heuristic("range", "result", (20, 10)), Heuristic("modulo", "result", (5, 2))):
        s = h.contains(cells.a, cells.b, cells.result).astype(float)
        out.append(s + 0.5 * noise_maps(cells, n // 6, rng))
        trend = additive_maps("monotone", cells, n // 6, rng)
        trend = (trend - trend.mean(1, keepdims=True)) / trend.std(1, keepdims=True)
        out.append(s + trend * s.std() + noise_maps(cells, n // 6, rng))
    out += [additive_maps("thresholds", cells, n // 6, rng),
            product_window_maps(cells, n // 6, rng), noise_maps(cells, n // 6, rng)]
    maps = np.concatenate(out)
    maps *= 10.0 ** rng.uniform(-4, 4, size=(len(maps), 1))
    return maps.astype(np.float32)


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20), ("-", 15), ("/", 30)])
def test_the_float32_bounds_hold_the_best_window(op, hi):
    """lo <= best <= hi for every map and every operator's scan on these cells, and the
    bounds are within 1e-4 of the best (relative) on all but degenerate maps: bounds as
    wide as the values would decide nothing."""
    cells = cells_of(op, hi)
    add = AdditiveOperands.of(cells.a, cells.b)
    y = torch.from_numpy(_maps(op, hi)).double()
    r_y = y - add.fitted(y)
    for o in "+-*/":
        values = cells.result if o == op else other_result(o, cells.a, cells.b)
        scan = WindowScan.of(values, add, "cpu")
        best = scan.best(r_y).numpy()
        lo, hi_ = (x.numpy() for x in scan.bounds(r_y))
        assert (lo <= best).all() and (best <= hi_).all(), o
        assert ((hi_ - lo) <= 1e-4 * best).mean() >= 0.95, (o, np.max((hi_ - lo) / best))


def test_the_bounds_fail_without_their_slack(monkeypatch):
    """The float32 roots do differ from the float64 ones: with no slack the bounds miss
    the best window of some maps (so the slack is what makes them hold)."""
    cells = cells_of("+", 30)
    add = AdditiveOperands.of(cells.a, cells.b)
    y = torch.from_numpy(_maps("+", 30, 240)).double()
    r_y = y - add.fitted(y)
    scan = WindowScan.of(cells.result, add, "cpu")
    monkeypatch.setattr(additive, "SCAN_SLACK", 0.0)
    lo, hi = scan.bounds(r_y)
    best = scan.best(r_y)
    assert ((best < lo) | (best > hi)).any()


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20)])
def test_the_gate_decides_as_with_every_map_scanned_exactly(op, hi, monkeypatch):
    """``_gate_rows`` (p-values, rivals, fits) with the float32 bounds equals the same
    with bounds so wide that every map is scanned exactly in float64; most maps are
    decided by the bounds alone."""
    cells = cells_of(op, hi)
    maps = torch.from_numpy(_maps(op, hi))
    fit = ol.operand_fit(ScienceConfig(operand_hi=hi, significance_level=LEVEL), cells)
    hs = [Heuristic("range", "result", (20, 10)), Heuristic("modulo", "result", (5, 2)),
          Heuristic("range", "result", (30, 20)), Heuristic("range", "result", (10, 30))]
    neuron = np.repeat(np.arange(len(maps)), len(hs))
    members = fit.set_index(hs * len(maps))
    bottom = np.zeros(len(neuron), dtype=bool)
    exact_maps: list[int] = []
    real = fit.rival_beyond_residual

    def spy(r_y, own=None):
        exact_maps.append(len(r_y))
        return real(r_y, own)

    monkeypatch.setattr(fit, "rival_beyond_residual", spy)
    got = {}
    for name, slack in (("bounds", additive.SCAN_SLACK), ("exact", 1e30)):
        monkeypatch.setattr(additive, "SCAN_SLACK", slack)
        exact_maps.clear()
        fit.hold(maps, maps)
        try:
            got[name] = gate._gate_rows(fit, maps, maps, neuron, members, bottom, 2.0)
        finally:
            fit.release()
        got[name + " scanned"] = sum(exact_maps)
    for a, b in zip(got["bounds"], got["exact"], strict=True):
        np.testing.assert_array_equal(a, b)
    keep, fits = got["exact"][1], got["exact"][2]
    assert (~keep).any() and (~fits).any() and fits.any()  # every verdict is here
    assert got["exact scanned"] == len(maps)
    assert got["bounds scanned"] <= 0.1 * len(maps), got["bounds scanned"]


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20)])
def test_labels_do_not_depend_on_the_block_size(op, hi, monkeypatch):
    """Labels, rows and explanations with blocks of 7 maps equal those with every map in
    one block (p-values to float64 rounding: a product's last bits depend on its
    shape): the screen, the gate and the explanations join their blocks right."""
    cells = cells_of(op, hi)
    maps = _maps(op, hi)
    config = ScienceConfig(operand_hi=hi, significance_level=LEVEL)
    fit = ol.build_operand_fit(config, cells)
    monkeypatch.setattr(labelling, "operand_fit", lambda *args, **kwargs: fit)
    assert operand_fit.BLOCK >= len(maps)
    one = labelled_with_fit(op, cells, maps, maps, config)
    monkeypatch.setattr(additive, "BLOCK", 7)
    monkeypatch.setattr(operand_fit, "BLOCK", 7)
    monkeypatch.setattr(gate, "BLOCK", 7)
    small = labelled_with_fit(op, cells, maps, maps, config)
    a, b = one.matches, small.matches
    assert a.implements.sum() >= 10
    for field in ("neuron", "heuristic", "bottom", "implements", "score"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    np.testing.assert_allclose(a.p_value, b.p_value, rtol=1e-9, atol=1e-300)
    np.testing.assert_array_equal(one.labelled, small.labelled)
    for x, y in ((one.k, small.k), (one.kv, small.kv)):
        np.testing.assert_allclose(x.joint, y.joint, rtol=1e-5, atol=1e-6)


def test_each_held_map_is_scanned_once(monkeypatch):
    """``OperandFit.held_bounds``: the bounds of a held map are the scans' own
    (``rival_bounds``; to float64 rounding across blocks of other sizes), taken the first
    time they are asked for; asked again (the second pass's screen, its gate) nothing is
    scanned and the same values come back; the own operator's window alone first, then
    all, scans every map for every rival axis."""
    cells = cells_of("+", 30)
    maps = torch.from_numpy(_maps("+", 30))
    fit = ol.operand_fit(ScienceConfig(operand_hi=30, significance_level=LEVEL), cells)
    scanned: list[int] = []
    real = WindowScan.bounds

    def spy(self, r_y):
        scanned.append(len(r_y))
        return real(self, r_y)

    fit.hold(maps, maps)
    try:
        r_all = fit.beyond(maps, torch.arange(len(maps)))
        monkeypatch.setattr(WindowScan, "bounds", spy)
        first = torch.arange(0, len(maps), 2)
        own = fit.held_bounds(maps, first, r_all[first], own_only=True)
        assert scanned == [len(first)]  # the own operator's scan only
        np.testing.assert_array_equal(own[2], fit.rival_bounds(r_all[first])[2])
        np.testing.assert_array_equal(own[3], fit.rival_bounds(r_all[first])[3])
        assert np.isnan(own[0]).all() and np.isnan(own[1]).all()
        scanned.clear()
        every = torch.arange(len(maps))
        want = fit.rival_bounds(r_all)
        scanned.clear()
        got = fit.held_bounds(maps, every, r_all)
        # every map lacked the rivals' bounds: one scan per rival axis and its own
        assert scanned == [len(maps)] * len(fit.scans) and len(fit.scans) == 6
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
        scanned.clear()
        again = fit.held_bounds(maps, every.flip(0), r_all.flip(0))
        assert scanned == []
        for a, b in zip(again, got, strict=True):
            np.testing.assert_array_equal(a, b[::-1])
    finally:
        fit.release()
    # a map not held is scanned each time
    fit.held_bounds(maps, torch.arange(3), r_all[:3])
    assert scanned == [3] * len(fit.scans)


def test_the_best_window_is_the_largest_root_squared():
    """``WindowScan.best`` takes max |root| and squares it (not torch.aminmax, 10-20x
    slower on rows): bit for bit the larger square of the smallest and largest root."""
    cells = cells_of("*", 20)
    add = AdditiveOperands.of(cells.a, cells.b)
    y = torch.from_numpy(_maps("*", 20)).double()
    r_y = y - add.fitted(y)
    scan = WindowScan.of(cells.result, add, "cpu")
    low, high = torch.aminmax(scan.sums(r_y) @ scan.pick, dim=1)
    np.testing.assert_array_equal(scan.best(r_y).numpy(),
                                  torch.maximum(low * low, high * high).numpy())


def _cumulative_sets(values, add):
    """C, the reference ``WindowScan`` no longer keeps: row 0 zero, row k the indicator
    of the cells of bins 0 .. k - 1 less its additive fit (cells of negative values in
    no bin)."""
    valid = np.nonzero(values >= 0)[0]
    lev = levels(values[valid], SCAN_BINS)
    ind = torch.zeros(int(lev.max()) + 1, len(values), dtype=torch.float64)
    ind[torch.as_tensor(lev), torch.as_tensor(valid)] = 1
    return torch.cat([torch.zeros(1, len(values), dtype=torch.float64),
                      torch.cumsum(ind - add.fitted(ind), 0)])


@pytest.mark.parametrize("op,hi", [("*", 20), ("/", 15), ("-", 14)])
def test_the_window_sums_of_a_residual_are_its_products_with_the_cumulative_sets(op, hi):
    """``WindowScan.sums``: a residual map's sums over the bins below each k, one scatter,
    equal to r_y C' (C: the cumulative bin indicators less their additive fit), on a
    grid whose cells are not all in a window (``/`` by zero, ``-`` below zero on the
    other operator's values) and on one that is not a rectangle (``-``)."""
    cells = cells_of(op, hi)
    add = AdditiveOperands.of(cells.a, cells.b)
    y = torch.from_numpy(_maps(op, hi)).double()
    r_y = add.residual(y)
    for o in "+-*/":
        values = other_result(o, cells.a, cells.b)
        scan = WindowScan.of(values, add, "cpu")
        want = r_y @ _cumulative_sets(values, add).T
        assert scan.rows == len(want.T)
        np.testing.assert_allclose(scan.sums(r_y).numpy(), want.numpy(), rtol=0,
                                   atol=1e-11 * float(want.abs().max()), err_msg=o)
