"""The held-out fits behind each label's explanations (catalog.labels.fit_models), against a slow
reference: per fold, numpy's least-norm least squares on the training cells, judged on
the held-out cells cell by cell (the fast path never predicts a cell: it takes each
held-out residual from sums per level)."""

import numpy as np
import pytest
import torch
from labelling import cells_of

from catalog.labels.additive import operand_groups, other_result
from catalog.labels.fit_models import TSS, FoldModel, held_out_all, levels, pair_folds


def _reference(groups: list[np.ndarray], folds: np.ndarray, y: np.ndarray):
    """(residual sum of squares, sum of squares about the training mean) held out, per map."""
    x = np.concatenate([np.eye(int(g.max()) + 1)[g] for g in groups], axis=1)
    press, tss = np.zeros(len(y)), np.zeros(len(y))
    for f in np.unique(folds):
        tr, te = folds != f, folds == f
        coef = np.linalg.lstsq(x[tr], y[:, tr].T, rcond=None)[0]  # the least-norm fit
        press += ((y[:, te] - (x[te] @ coef).T) ** 2).sum(1)
        tss += ((y[:, te] - y[:, tr].mean(1, keepdims=True)) ** 2).sum(1)
    return press, tss


@pytest.mark.parametrize("op,hi", [("-", 12), ("+", 20), ("*", 15), ("+", 40)])
def test_held_out_fits_equal_the_slow_reference(op, hi):
    """Every model of ``OperandFit.explain`` (operands, the result, operands with each
    operator's result) on cells that need not be a rectangle, models sharing groupings."""
    cells = cells_of(op, hi)
    rng = np.random.default_rng(hi)
    groups = operand_groups(cells.a, cells.b)
    folds = pair_folds(cells.a, cells.b)
    y = rng.standard_normal((7, len(cells.a))) + 3 * (cells.result % 4 == 1) + cells.a
    specs = {"operands": groups, "result": [levels(cells.result)]}
    for o in "+-*/":
        specs["joint:" + o] = [*groups, levels(other_result(o, cells.a, cells.b))]
    models = {k: FoldModel.of(g, folds, "cpu") for k, g in specs.items()}
    if hi == 40:  # both ways of taking the held-out residual, side by side
        assert {m.wide for m in models.values()} == {True, False}
    got = held_out_all(models, torch.from_numpy(y))
    for k, g in specs.items():
        press, tss = _reference(g, folds, y)
        # the fit runs in float32 on the maps less their means: within 1e-5 of each map's
        # held-out sum of squares (an R^2 to 1e-5)
        np.testing.assert_array_less(np.abs(got[k].numpy() - press), 1e-5 * tss, err_msg=k)
        np.testing.assert_allclose(got[TSS].numpy(), tss, rtol=1e-9)
    # the models differ: on + and - the joint model fits the planted residue better (the
    # product's many values on [0, 15)^2 predict little held out)
    if op != "*":
        assert np.all(got["joint:" + op].numpy() < 0.8 * got["operands"].numpy())


@pytest.mark.parametrize("op,hi", [("*", 15), ("+", 40)])
def test_a_map_far_from_zero_is_fit_as_exactly_as_its_centred_self(op, hi):
    """The means are taken out before the float32 fit and their part put back exactly: a
    held-out cell of a level no training cell has is predicted a shrunken constant (the
    least-norm fit), so the mean's part is not zero, and a map of mean 1e4 with a spread
    of 1 would lose every digit of its residual in float32 without it."""
    cells = cells_of(op, hi)
    rng = np.random.default_rng(hi)
    groups = operand_groups(cells.a, cells.b)
    folds = pair_folds(cells.a, cells.b)
    y = rng.standard_normal((5, len(cells.a))) + (cells.result % 3 == 0)
    specs = {"joint:*": [*groups, levels(other_result("*", cells.a, cells.b))],
             "operands": groups}
    models = {k: FoldModel.of(g, folds, "cpu") for k, g in specs.items()}
    assert models["joint:*"].const_press > 1e-3  # unseen levels: the constant is shrunk
    far = y + 1e4
    got = held_out_all(models, torch.from_numpy(far))
    for k, g in specs.items():
        press, tss = _reference(g, folds, far)
        np.testing.assert_array_less(np.abs(got[k].numpy() - press), 1e-5 * tss, err_msg=k)


def test_float32_maps_are_fit_as_their_float64_values():
    """The explanations pass a layer's float32 maps as they are (the mean is taken in
    float64 in the pass that promotes them): every sum of squares is the one of the same
    values given as float64, to the bit."""
    cells = cells_of("+", 20)
    rng = np.random.default_rng(3)
    groups = operand_groups(cells.a, cells.b)
    folds = pair_folds(cells.a, cells.b)
    y = (rng.standard_normal((6, len(cells.a))) + 2 * (cells.result % 5 == 2) + 40).astype(
        np.float32)
    models = {"operands": FoldModel.of(groups, folds, "cpu"),
              "joint:*": FoldModel.of([*groups, levels(cells.a * cells.b)], folds, "cpu")}
    y32 = torch.from_numpy(y)
    got, want = held_out_all(models, y32), held_out_all(models, y32.double())
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == torch.float64
        assert torch.equal(got[k], want[k]), k


def test_rivals_tied_to_rounding_are_named_by_the_fixed_order():
    """max and min can fit a map equally (equal in exact arithmetic): whichever a rounding
    puts ahead, the name is the first of the tie in the rivals' order, so the stored name
    does not follow the thread count; a real lead still wins."""
    from catalog.labels.fit_models import RIVAL_TIE, Explanations

    ex = Explanations.empty(4)
    ex.rivals = {"op1 + op2": np.array([0.2, 0.2, 0.2, 0.9]),
                 "max(op1, op2)": np.array([0.5, 0.5 + RIVAL_TIE / 10, 0.5, 0.5]),
                 "min(op1, op2)": np.array([0.5 + RIVAL_TIE / 10, 0.5, 0.5 + 10 * RIVAL_TIE,
                                            np.nan])}
    best, name = ex.best_rival()
    assert list(name) == ["max(op1, op2)", "max(op1, op2)", "min(op1, op2)", "op1 + op2"]
    np.testing.assert_allclose(best, [0.5 + RIVAL_TIE / 10, 0.5 + RIVAL_TIE / 10,
                                      0.5 + 10 * RIVAL_TIE, 0.9])
