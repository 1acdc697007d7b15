"""Steps 5 and 6 of the label rule (catalog 0.11.0; ``catalog.labels.operator_labels``): a
result label must beat its rivals (``catalog.labels.rivals``: every other operator's
result in an order-free form, max and min of the operands) held out, and its set must
explain the KV map beyond each of them (a nested test). docs/method.md section 7 and
docs/labels.md ("Catalog 0.11.0") give the rule, what it separates and what it cannot."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from catalog.config import vocab
from catalog.core.digest import array_digest
from catalog.labels.additive import BLOCK, partial_tests
from catalog.labels.fit_models import (
    TSS,
    Design,
    Explanations,
    FoldModel,
    fold_model,
    held_bytes,
    held_out_all,
    held_out_r2,
)
from catalog.labels.matches import Matches
from catalog.labels.operand_fit import EXPLAIN_VALUES, OperandFit
from catalog.labels.rivals import axis_values, nested_levels


def result_rows(m: Matches) -> np.ndarray:
    """Whether each row's heuristic is a result heuristic of one value set."""
    return np.array([h.target == "result" and not h.chosen
                     for h in m.heuristics] or [False], dtype=bool)[m.heuristic]


@dataclass
class AxisProjection:
    """The least-squares fit to maps of one-hot groupings of the cells (the operands and
    a rival axis's factor): the design and the pseudo-inverse of its normal equations."""

    design: Design
    pinv: torch.Tensor
    rank: int

    @classmethod
    def of(cls, groups: list[np.ndarray], device) -> AxisProjection:
        design = Design(groups, device)
        rank = int(np.linalg.matrix_rank(design.xtx, hermitian=True))
        pinv = torch.as_tensor(np.linalg.pinv(design.xtx, hermitian=True), device=device)
        return cls(design, pinv, rank)

    def residual(self, maps: torch.Tensor) -> torch.Tensor:
        """(n, cells) float64: each map less its fit."""
        y = maps.double()
        return y - self.design.on_cells(self.design.sums(y) @ self.pinv, self.design.width)



def beyond_rivals(fit: OperandFit, maps: torch.Tensor, ni: np.ndarray, heuristics: list,
                  si: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """Per row (``ni``: its map among ``maps``; ``si``: its heuristic among
    ``heuristics``; ``bottom``: low on the set, else high), whether the heuristic's set
    explains the map beyond the operands AND each rival axis (``catalog.labels.
    rivals``), as a p-value: the partial regression's tests (``partial_tests``:
    classic and robust, the larger p-value; one-sided on the row's side) of the set
    with op1's, op2's and the layout's effects and the axis's factor in the model
    (``nested_levels``), the largest over the axes. Each map's and set's residual is
    taken once per axis. A map that is a function of the rival (min(op1, op2) on
    ``+``), or of both (the sum's parity is |op1 - op2|'s), leaves the set nothing
    to explain."""
    a, b, r = fit.cells
    dev = maps.device
    sets = torch.as_tensor(np.stack([np.asarray(h.contains(a, b, r), dtype=np.float64)
                                     for h in heuristics]), device=dev)
    y = maps.double()
    p = np.zeros(len(ni))
    sign = np.where(bottom, -1.0, 1.0)
    ni_t, si_t = torch.as_tensor(ni, device=dev), torch.as_tensor(si, device=dev)
    for name in fit.axes:
        proj = projection(fit, name)
        df = max(fit.n_cells - proj.rank - 1, 1)
        got, _ = partial_tests(proj.residual(y), proj.residual(sets), ni_t, si_t, sign,
                               df)
        p = np.fmax(p, got)
    return p

def projection(fit: OperandFit, name: str) -> AxisProjection:
    """The least-squares fit of the operands with rival axis ``name``'s factor,
    built once per axis."""
    if name not in fit._projections:
        a, b, _ = fit.cells
        groups = [*fit.specs["operands"], nested_levels(axis_values(name, a, b))]
        fit._projections[name] = AxisProjection.of(groups, fit.device)
    return fit._projections[name]

def explain_set(fit: OperandFit, maps: torch.Tensor, heuristic) -> np.ndarray:
    """(maps,) the held-out R^2 of the operands with ``heuristic``'s set (one column:
    it predicts a result value no training fold holds as well as any other; the
    own result's factor does not, on ``*``'s many products), as ``explain`` judges
    every explanation."""
    a, b, r = fit.cells
    model = set_model(fit, np.asarray(heuristic.contains(a, b, r), dtype=np.int64))
    out = []
    step = max(BLOCK, EXPLAIN_VALUES // max(fit.n_cells, 1))
    for s in range(0, len(maps), step):
        got = held_out_all({"set": model}, maps[s:s + step])
        out.append(held_out_r2(got["set"], got[TSS]))
    return torch.cat(out).cpu().numpy() if out else np.zeros(0)



def set_model(fit: OperandFit, member: np.ndarray) -> FoldModel:
    """The fold model of the operands with the set ``member`` (0/1 per cell), kept on the
    fit for the next checkpoint (least recently used first out, within
    ``SET_MODELS_BYTES``): the same model ``fold_model`` builds. A worker meets the same
    labels' sets checkpoint after checkpoint: on the demo's grid about 60 models a
    checkpoint, 2 s to build, about 1.6 MB each."""
    key = array_digest(member)
    kept = fit._set_models
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    model = fold_model([*fit.specs["operands"], member], fit.folds, fit.device)
    kept[key] = model
    while len(kept) > 1 and held_bytes(kept) > vocab.SET_MODELS_BYTES:
        kept.popitem(last=False)
    return model


def beaten(m: Matches, fit: OperandFit, kv: torch.Tensor, maps: np.ndarray,
           ex_kv: Explanations, reach: float) -> Matches:
    """``m`` with no result label that a rival explains as well (steps 5 and 6 of the
    module doc), on the KV map:

    - held out: a rival with the operands (``Explanations.rivals``: another operator's
      result or an interaction of the operands, each a factor of its values by bins and
      by residues, so that it predicts values no training fold held) predicts the map
      better than the own result with the operands (``joint``: its factor by value or by
      bins, or the label's set, ``explain_set``; ``rival_wins``);
    - nested: the label's set explains the map beyond the operands AND each rival axis's
      factor no better than chance at ``reach`` (``beyond_rivals``; the row's
      p-value is raised to it). A map that is a function of the rival on these cells
      (min(op1, op2) on ``+``), or of both (the sum's parity is |op1 - op2|'s), leaves
      the set nothing: a tie names neither.

    ``maps``: the maps ``ex_kv`` explains (indices, sorted); their ``joint`` becomes the
    own result as it predicts best by any label that stands, which is what is stored:
    the label and the comparison stored beside it never disagree."""
    rows = np.nonzero(m.implements & result_rows(m))[0]
    if not len(maps) or not len(rows):
        return m
    at = np.searchsorted(maps, m.neuron[rows])
    assert np.all(maps[at] == m.neuron[rows]), "a map with a result label was not explained"
    # the own result's factor already predicts most maps better than their best rival;
    # the label's set (one column: it predicts result values no fold held, as the
    # factor of *'s many products does not) is fit only where it does not
    doubt = rival_wins(ex_kv.joint, ex_kv.other)
    lost = doubt[at]
    for h in np.unique(m.heuristic[rows[lost]]):
        sel = np.nonzero((m.heuristic[rows] == h) & lost)[0]
        where = np.unique(at[sel])
        y = kv.index_select(0, torch.as_tensor(maps[where], device=kv.device))
        own = np.fmax(ex_kv.joint[where], explain_set(fit, y, m.heuristics[h]))
        won = rival_wins(own, ex_kv.other[where])
        lost[sel] = won[np.searchsorted(where, at[sel])]
        # what is stored: the own result as it predicts best, by any label that stands
        ex_kv.joint[where[~won]] = own[~won]
    # the nested test of the rows the held-out comparison leaves, all at once
    live = np.nonzero(~lost)[0]
    if len(live):
        where, ni = np.unique(at[live], return_inverse=True)
        hs, si = np.unique(m.heuristic[rows[live]], return_inverse=True)
        y = kv.index_select(0, torch.as_tensor(maps[where], device=kv.device))
        p = beyond_rivals(fit, y, ni.reshape(-1), [m.heuristics[h] for h in hs],
                              si.reshape(-1), m.bottom[rows[live]])
        lost[live] |= p > reach
        m.p_value[rows[live]] = np.fmax(m.p_value[rows[live]], p)
    m.implements[rows[lost]] = False
    return m


def rival_wins(own: np.ndarray, rival: np.ndarray) -> np.ndarray:
    """Whether a rival takes a result label away: it predicts the map better than the own
    result, held out (compared as they are stored, in float32: the label and the stored
    comparison never disagree)."""
    return (np.nan_to_num(rival, nan=-np.inf).astype(np.float32)
            > np.nan_to_num(own, nan=-np.inf).astype(np.float32))


