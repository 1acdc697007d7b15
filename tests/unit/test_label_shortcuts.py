"""The label rule's shortcuts give what the long way gives (catalog.labels.operand_fit,
catalog.labels.operator_labels): the window scan's one product against every window
projected out by hand, the dense design's product against the gather per grouping, the
second pass's screen of (map, set) pairs against scoring every map and set, the gate's
rivals taken only where a row passes against taking them everywhere, and the merge of
the two passes against a set of (neuron, heuristic) keys."""

import dataclasses

import labelling
import numpy as np
import pytest
import torch
from labelling import additive_maps, cells_of, labelled_with_fit, noise_maps, product_window_maps

from catalog.config import ScienceConfig
from catalog.labels import additive, fit_models, gate, operand_fit, value_null
from catalog.labels import operator_labels as ol
from catalog.labels.additive import SCAN_BINS, AdditiveOperands, WindowScan, other_result
from catalog.labels.fit_models import levels
from catalog.labels.heuristics import Heuristic, Rescue, rescue_partitions
from catalog.labels.matches import Matches

LEVEL = 0.05


@pytest.mark.parametrize("op,hi", [("+", 20), ("*", 30), ("-", 15)])
def test_the_window_scan_is_every_window_projected_out(op, hi):
    """Each map's best window, against each window's cell set less the additive fit and
    its explained sum of squares (r.s)^2 / |s|^2, window by window (``*`` on [0, 30) has
    more values than bins)."""
    cells = cells_of(op, hi)
    add = AdditiveOperands.of(cells.a, cells.b)
    values = other_result("*", cells.a, cells.b) if op == "-" else cells.result
    scan = WindowScan.of(values, add, "cpu")
    rng = np.random.default_rng(hi)
    y = torch.from_numpy(rng.standard_normal((6, len(cells.a))) + (values % 3 == 1))
    r_y = y - add.fitted(y)
    valid = np.nonzero(values >= 0)[0]
    lev = levels(values[valid], SCAN_BINS)
    want = np.zeros(len(y))
    bins = int(lev.max()) + 1
    assert op != "*" or len(np.unique(values)) > bins
    for i in range(bins):
        for j in range(i + 1, bins + 1):
            s = np.zeros(len(values))
            s[valid[(lev >= i) & (lev < j)]] = 1.0
            r_s = (torch.from_numpy(s)[None] - add.fitted(torch.from_numpy(s)[None]))[0]
            ss = float(r_s @ r_s)
            if ss > 1e-12:
                want = np.maximum(want, ((r_y @ r_s).numpy() ** 2) / ss)
    np.testing.assert_allclose(scan.best(r_y).numpy(), want, rtol=1e-9)


def test_the_dense_design_fits_as_the_sparse_one(monkeypatch):
    """The additive fit's product with the dense design equals the gather per grouping
    that a design over ``DENSE_LIMIT`` takes."""
    cells = cells_of("+", 25)
    y = torch.from_numpy(np.random.default_rng(0).standard_normal((5, len(cells.a))))
    dense = AdditiveOperands.of(cells.a, cells.b)
    monkeypatch.setattr(fit_models, "DENSE_LIMIT", 0)
    sparse = AdditiveOperands.of(cells.a, cells.b)
    assert dense.design.dense and not sparse.design.dense
    np.testing.assert_allclose(dense.fitted(y).numpy(), sparse.fitted(y).numpy(), atol=1e-12)
    c = torch.from_numpy(np.random.default_rng(1).standard_normal((3, dense.design.width)))
    upto = dense.design.ends[1]  # op1's and op2's columns, not the layout's
    np.testing.assert_allclose(dense.design.on_cells(c, upto).numpy(),
                               sparse.design.on_cells(c, upto).numpy(), atol=1e-12)


def _mixed_maps(op: str, hi: int) -> np.ndarray:
    """Maps the second pass looks at: result sets with a smooth operand trend of their own
    size mixed in (the first pass misses most), additive maps, another operator's result,
    noise."""
    cells = cells_of(op, hi)
    rng = np.random.default_rng([hi, ord(op)])
    out = []
    for h in (Heuristic("range", "result", (20, 10)), Heuristic("modulo", "result", (5, 2)),
              Heuristic("pattern", "result", ("..7",))):
        s = h.contains(cells.a, cells.b, cells.result).astype(float)
        add = additive_maps("monotone", cells, 12, rng)
        add = (add - add.mean(1, keepdims=True)) / add.std(1, keepdims=True) * s.std()
        out.append(s + add + noise_maps(cells, 12, rng))
    out += [additive_maps("thresholds", cells, 12, rng), product_window_maps(cells, 12, rng),
            noise_maps(cells, 12, rng)]
    return np.concatenate(out).astype(np.float32)


def _rows(m: Matches) -> dict:
    return {(int(n), m.heuristics[h].key, bool(b)): (float(s), float(p), bool(i))
            for n, h, b, s, p, i in zip(m.neuron, m.heuristic, m.bottom, m.score, m.p_value,
                                        m.implements, strict=True)}


def test_the_labelable_sets_are_numpys_unique_rows_and_never_held_as_booleans(monkeypatch):
    """``build_operand_fit`` keeps its own result sets packed to bits until it knows they
    fit (``labelable_fits``): under the limit they are the distinct rows of every result
    partition's sets (np.unique over the stacked booleans, in its order, each key on its
    row); over it none are kept, and building the fit of ``*`` on [0, 150) (6,748 sets
    over 22,500 cells: 152 MB as booleans, which it used to hold twice before turning
    them all away) never holds as many bytes of numpy arrays as the sets as booleans
    once (measured: 116 MB, most of it the partitions; 420 MB before)."""
    import tracemalloc

    from catalog.labels.heuristics import partitions_for, result_partitions

    for op, hi in (("*", 20), ("+", 30), ("-", 12)):
        cells = cells_of(op, hi)
        config = ScienceConfig(operand_hi=hi)
        own, keys = [], []
        for p in result_partitions(partitions_for(cells, config)):
            for i, h in enumerate(p.heuristics):
                own.append(p.labels == i)
                keys.append(h.key)
        want, back = np.unique(np.stack(own), axis=0, return_inverse=True)
        fit = ol.build_operand_fit(config, cells)
        got = fit.labelable_sets.cpu().numpy()
        r = AdditiveOperands.of(cells.a, cells.b).residual(torch.as_tensor(want * 1.0))
        real = ((r * r).sum(1) > 1e-12).numpy()  # sets beyond the additive fit
        assert got.shape[1] == len(cells.a) and len(got) <= len(want), op
        # each key's row: its set among the kept ones (sets an additive fit explains
        # whole, such as every cell, are dropped)
        for k, row in zip(keys, back.reshape(-1).tolist(), strict=True):
            at = fit.labelable_of[k]
            if at >= 0:
                assert np.array_equal(got[at], want[row]), (op, k)
        assert len(got) == real.sum() > 0, op
    monkeypatch.setattr(operand_fit, "LABELABLE_LIMIT", 0)
    assert ol.build_operand_fit(ScienceConfig(operand_hi=20), cells_of("*", 20)).labelable is None
    monkeypatch.undo()
    cells, config = cells_of("*", 150), ScienceConfig(operand_hi=150)
    n_sets = sum(len(p.heuristics) for p in result_partitions(partitions_for(cells, config)))
    tracemalloc.start()
    try:
        fit = ol.build_operand_fit(config, cells)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fit.labelable is None and n_sets > 6000
    assert peak < n_sets * len(cells.a), (peak, n_sets * len(cells.a))


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20)])
def test_the_second_pass_screen_loses_no_label(op, hi, monkeypatch):
    """Labels, rows, scores and p-values with the screen (``may_label``: maps, then
    partitions, then rows) equal those of scoring every map left for every result set
    (each (map, set) pair's map less the operands' part of its joint fit with the set:
    a screen that passes every pair), and the screen does skip maps and partitions."""
    cells = cells_of(op, hi)
    maps = _mixed_maps(op, hi)
    config = ScienceConfig(operand_hi=hi, significance_level=LEVEL)
    fit = ol.operand_fit(config, cells)
    assert fit.labelable is not None and len(fit.labelable_of)
    skips, scored = [], []
    real_rescued = ol.rescued

    def spy(fitting, config, kv, k_map, score, *args):
        def counting(k, kv_scored, orders, rescue):
            skips.append(rescue.skip if isinstance(rescue, Rescue) else None)
            scored.append(len(k))
            return score(k, kv_scored, orders, rescue)
        return real_rescued(fitting, config, kv, k_map, counting, *args)

    monkeypatch.setattr(ol, "rescued", spy)
    screened = labelled_with_fit(op, cells, maps, maps, config)
    with_screen = (list(skips), list(scored))
    skips.clear()
    scored.clear()
    unscreened = dataclasses.replace(fit)
    n_sets = len(fit.labelable)
    unscreened.may_label = (  # type: ignore[method-assign]
        lambda kv, k_map, reach, rows: torch.ones(len(rows), n_sets, dtype=torch.bool))
    monkeypatch.setattr(labelling, "operand_fit", lambda *args, **kwargs: unscreened)
    every = labelled_with_fit(op, cells, maps, maps, config)
    assert _rows(screened.matches) == _rows(every.matches)
    np.testing.assert_array_equal(screened.labelled, every.labelled)
    # the long way scored more maps and every result partition; the screen skipped some
    assert sum(with_screen[1]) < sum(scored), (with_screen[1], scored)
    additive = frozenset(k for k, i in fit.labelable_of.items() if i < 0)
    assert all(s == additive for s in skips)
    assert any(s for s in with_screen[0])
    # and the second pass labelled something (the comparison is not of two empty lists)
    m = every.matches
    trend_rows = m.implements & (m.neuron < 36)
    assert trend_rows.sum() >= 12


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20)])
def test_the_second_pass_scores_only_rows_it_can_label(op, hi, monkeypatch):
    """The second pass keeps only the rows it labels, so it scores rows from the label
    threshold up of the partitions that can be labelled (``second_pass_scoring``): rows,
    labels and explanations equal those of scoring every result partition from the
    store's floor, and fewer partitions or rows were scored."""
    from catalog.labels import matching

    cells = cells_of(op, hi)
    maps = _mixed_maps(op, hi)
    config = ScienceConfig(operand_hi=hi, significance_level=LEVEL)
    scored = []
    real_score = matching.score_partitions

    def counting(k, kv, parts, floor, *args, **kwargs):
        out = real_score(k, kv, parts, floor, *args, **kwargs)
        scored.append((sum(len(p.heuristics) for p in parts) * len(k), len(out)))
        return out

    monkeypatch.setattr(labelling, "score_partitions", counting)
    fast = labelled_with_fit(op, cells, maps, maps, config)
    narrow, scored[:] = list(scored), []
    monkeypatch.setattr(value_null, "second_pass_scoring",
                        lambda parts, rescue, *_: (rescue_partitions(parts, rescue),
                                                   config.score_floor))
    every = labelled_with_fit(op, cells, maps, maps, config)
    assert _rows(fast.matches) == _rows(every.matches)
    np.testing.assert_array_equal(fast.labelled, every.labelled)
    for a, b in ((fast.k, every.k), (fast.kv, every.kv)):
        for name in ("operands", "result", "joint", "other"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # the first call of each is the first pass (the same); the second pass's calls differ
    assert narrow[0] == scored[0] and len(narrow) == len(scored) > 1
    # (on a small grid every result partition may be labelable: then only the rows fall)
    assert sum(n for n, _ in narrow[1:]) <= sum(n for n, _ in scored[1:])
    assert sum(r for _, r in narrow[1:]) < sum(r for _, r in scored[1:])
    assert fast.matches.implements.sum() > 0


def test_without_the_sets_the_second_pass_scores_the_residual(monkeypatch):
    """On grids whose sets are too many to keep (``LABELABLE_LIMIT``) the second pass has
    no screen and no sets: it scores each map left less its additive fit (the residual),
    and still gives back most of a window with a smooth trend mixed in (36 of 40 at
    noise 0.3 measured with the residual; the first pass alone labels none), with the
    same gate."""
    cells = cells_of("+", 30)
    config = ScienceConfig(operand_hi=30, significance_level=LEVEL)
    monkeypatch.setattr(operand_fit, "LABELABLE_LIMIT", 0)
    fit = ol.build_operand_fit(config, cells)
    assert fit.labelable is None and fit.labelable_sets is None
    monkeypatch.setattr(labelling, "operand_fit", lambda *args, **kwargs: fit)
    h = Heuristic("range", "result", (20, 10))
    s = h.contains(cells.a, cells.b, cells.result).astype(float)
    rng = np.random.default_rng(3)
    add = additive_maps("monotone", cells, 40, rng)
    add = (add - add.mean(1, keepdims=True)) / add.std(1, keepdims=True) * s.std()
    maps = (s + add + noise_maps(cells, 40, rng)).astype(np.float32)
    m = labelled_with_fit("+", cells, maps, maps, config).matches
    keys = np.array([x.key for x in m.heuristics] + [""])[m.heuristic]
    hit = m.implements & (keys == h.key)
    assert len(np.unique(m.neuron[hit])) >= 30, len(np.unique(m.neuron[hit]))


@pytest.mark.parametrize("op,hi", [("+", 30), ("*", 20)])
def test_the_screen_keeps_every_pair_the_strict_gate_could_keep(op, hi):
    """``may_label`` against the strict gate's own tests on every (map, set) pair:
    wherever the set passes both tests beyond the operands (KV one-sided on either side,
    K two-sided, the larger p-value at most the level) and fits (within ``RIVAL_MARGIN``
    of the best window), the screen keeps the pair; and it does drop pairs."""
    cells = cells_of(op, hi)
    maps = torch.from_numpy(_mixed_maps(op, hi))
    fit = ol.operand_fit(ScienceConfig(operand_hi=hi, significance_level=LEVEL), cells)
    reach = 1e-4
    rows = np.arange(len(maps))
    fit.hold(maps, maps)
    try:
        screen = fit.may_label(maps, maps, reach, rows).numpy()
        n_sets = len(fit.labelable)
        ni = torch.as_tensor(np.repeat(rows, n_sets))
        si = torch.as_tensor(np.tile(np.arange(n_sets), len(rows)))
        r_y = fit.beyond(maps, torch.as_tensor(rows))
        df = max(fit.n_cells - fit.additive.rank - 1, 1)
        p_k = additive.partial_p(r_y, fit.labelable, ni, si, None, df)
        p_kv = np.fmin(*[additive.partial_p(r_y, fit.labelable, ni, si,
                                                np.full(len(ni), sign), df)
                         for sign in (1.0, -1.0)])
        e = ((r_y @ fit.labelable.T) ** 2 / fit.labelable_ss).numpy().reshape(-1)
        window = fit.window_best(maps, torch.as_tensor(rows), r_y).numpy()[ni.numpy()]
    finally:
        fit.release()
    exact = (np.fmax(p_k, p_kv) <= reach) & (e >= (1 - operand_fit.RIVAL_MARGIN) * window)
    exact = exact.reshape(len(rows), n_sets)
    assert exact.sum() >= 10 and not screen.all()
    missed = np.argwhere(exact & ~screen)
    assert not len(missed), missed[:5]


def test_the_gates_rivals_are_taken_where_a_row_passes():
    """``_gate_rows`` with the corrected level and with every map looked at give the same
    p-values, and the same verdicts on every row whose p-value passes."""
    cells = cells_of("+", 30)
    maps = torch.from_numpy(_mixed_maps("+", 30))
    config = ScienceConfig(operand_hi=30, significance_level=LEVEL)
    fit = ol.operand_fit(config, cells)
    hs = [Heuristic("range", "result", (20, 10)), Heuristic("modulo", "result", (5, 2)),
          Heuristic("pattern", "result", ("..7",)), Heuristic("range", "result", (30, 20))]
    neuron = np.repeat(np.arange(len(maps)), len(hs))
    members = fit.set_index(hs * len(maps))
    bottom = np.zeros(len(neuron), dtype=bool)
    reach = 1e-4
    fit.hold(maps, maps)
    try:
        p, keep, fits = gate._gate_rows(fit, maps, maps, neuron, members, bottom, reach)
        p_all, keep_all, fits_all = gate._gate_rows(fit, maps, maps, neuron, members,
                                                           bottom, 2.0)
    finally:
        fit.release()
    np.testing.assert_array_equal(p, p_all)
    passed = p <= reach
    assert 10 <= passed.sum() < len(p)  # both kinds of row are here
    np.testing.assert_array_equal(keep[passed], keep_all[passed])
    np.testing.assert_array_equal(fits[passed], fits_all[passed])
    assert (~keep_all[passed]).any() or (~fits_all[passed]).any()


def test_merged_replaces_rows_of_the_same_neuron_and_heuristic():
    """Against a set of (neuron, key): the second pass's labelled rows replace the first
    pass's rows of the same neuron and heuristic, whatever order each list holds its
    heuristics in."""
    rng = np.random.default_rng(5)
    hs = [Heuristic("range", "result", (lo, 10)) for lo in range(0, 60, 10)]

    def rows(n, order):
        heur = [hs[i] for i in order]
        return Matches(rng.integers(0, 8, n).astype(np.int32), np.zeros(n, np.int8),
                       rng.integers(0, len(heur), n).astype(np.int32),
                       rng.uniform(size=n).astype(np.float32), np.zeros(n, bool), heur,
                       implements=rng.uniform(size=n) < 0.5)

    m, r = rows(60, [0, 1, 2, 3, 4, 5]), rows(25, [5, 3, 1, 4])
    got = ol.merged(m, r)
    taken = {(int(n), r.heuristics[h].key)
             for n, h, i in zip(r.neuron, r.heuristic, r.implements, strict=True) if i}
    kept = [(int(n), m.heuristics[h].key) for n, h in zip(m.neuron, m.heuristic, strict=True)
            if (int(n), m.heuristics[h].key) not in taken]
    got_keys = [(int(n), got.heuristics[h].key)
                for n, h in zip(got.neuron, got.heuristic, strict=True)]
    n_new = int(r.implements.sum())
    assert got_keys[:len(got_keys) - n_new] == kept
    assert sorted(got_keys[len(got_keys) - n_new:]) == sorted(
        (int(n), r.heuristics[h].key)
        for n, h, i in zip(r.neuron, r.heuristic, r.implements, strict=True) if i)
    assert taken and len(kept) < len(m)  # some rows were replaced


def test_the_float32_screen_keeps_every_pair_the_float64_test_passes():
    """The second pass's screen runs its t-tests in float32 (``screen_t_test``): maps
    planted on the classic test's threshold, cos^2(r, s) = t^2 / (df + t^2) times
    1 + rel for rel from -1e-2 to +1e-4, at scales from 1e-3 to 1e3 and either sign. Every
    pair the float64 test passes must pass the screen (a screen that drops one skips a map
    the strict gate would label); pairs 1% under the threshold must not (a screen loosened
    that far screens nothing out)."""
    rng = np.random.default_rng(7)
    n_cells, df, t2 = 900, 840, 25.0
    sets = rng.standard_normal((4, n_cells))
    sets_ss = (sets * sets).sum(1)
    c = t2 / (df + t2)
    rels = (-1e-2, -1e-4, -1e-6, -1e-8, 0.0, 1e-8, 1e-6, 1e-4)
    maps, own, rel_of = [], [], []
    for j in range(len(sets)):
        s_hat = sets[j] / np.sqrt(sets_ss[j])
        for rel in rels:
            for _ in range(8):
                u = rng.standard_normal(n_cells)
                u -= (u @ s_hat) * s_hat
                u /= np.linalg.norm(u)
                cos = np.sqrt(c * (1 + rel)) * rng.choice([-1.0, 1.0])
                scale = 10.0 ** rng.uniform(-3, 3)
                maps.append(scale * (cos * s_hat + np.sqrt(1 - cos * cos) * u))
                own.append(j)
                rel_of.append(rel)
    r = torch.as_tensor(np.array(maps))
    own_t, rel_of = torch.as_tensor(own), np.array(rel_of)
    dot = (r @ torch.as_tensor(sets).T)
    exact = dot * dot * (df + t2) >= t2 * (r * r).sum(1, keepdim=True) * torch.as_tensor(sets_ss)
    _, got = additive.screen_t_test(r, torch.as_tensor(sets).float(),
                                       torch.as_tensor(sets_ss), df, t2)
    assert exact.any() and not (exact & ~got).any()
    mine = got[torch.arange(len(r)), own_t].numpy()
    assert mine[rel_of >= 0].all()  # every map on or over the threshold of its own set
    assert not mine[rel_of == -1e-2].any()
