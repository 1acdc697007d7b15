"""The gate on result labels (docs/method.md section 7, "What a label explains"): a
result row the value rule labels keeps its label only where its set explains the KV map
and the activation beyond both operands' additive effects (``partial_p``) and no other
operator's result set or window of values explains the KV map clearly better
(``catalog.labels.operand_fit.OperandFit``'s rivals); and whether the label's set is the
one that FITS (within ``RIVAL_MARGIN`` of the best window of the operator's own values),
which the second pass requires."""

from __future__ import annotations

import numpy as np
import torch

from catalog.labels.additive import BLOCK, explained, partial_p, partial_tests
from catalog.labels.operand_fit import RIVAL_MARGIN, OperandFit


def _set_residuals(fit: OperandFit, members: np.ndarray, device) -> tuple:
    """(the distinct sets of ``members`` less their additive fit, each member's row)."""
    # in the order of their keys, not of the cache: the cache's order depends on which
    # layers this process measured before, and a matrix product's last bits on the rows'
    # order, so a layer's p-values would depend on the process that measured it
    keys = {i: k for k, i in fit._set_of.items()}
    uniq_s = np.array(sorted(set(members.tolist()), key=keys.__getitem__), dtype=np.int64)
    pos = np.zeros(len(fit.sets), dtype=np.int64)
    pos[uniq_s] = np.arange(len(uniq_s))
    sets = torch.as_tensor(fit.sets[uniq_s], dtype=torch.float64, device=device)
    return fit.additive.residual(sets), pos[members].reshape(-1)


def _blocks(neuron: np.ndarray):
    """The distinct maps of rows ``neuron`` by blocks of ``BLOCK``: (maps of the block,
    the block's rows, each row's map within the block)."""
    uniq_n, n_of = np.unique(neuron, return_inverse=True)
    n_of = n_of.reshape(-1)
    for start in range(0, len(uniq_n), BLOCK):
        stop = min(start + BLOCK, len(uniq_n))
        rows = np.nonzero((n_of >= start) & (n_of < stop))[0]
        yield uniq_n[start:stop], rows, n_of[rows] - start


def own_beyond(fit: OperandFit, maps: torch.Tensor, neuron: np.ndarray,
               members: np.ndarray) -> np.ndarray:
    """Per row, the sum of squares its set (``members``: rows of ``fit.sets``) explains of
    map ``neuron`` beyond the operands' fit."""
    out = np.zeros(len(neuron))
    if not len(neuron):
        return out
    dev = maps.device
    r_s, s_of = _set_residuals(fit, members, dev)
    for uniq, rows, ni in _blocks(neuron):
        y = maps.index_select(0, torch.as_tensor(uniq, device=dev)).double()
        out[rows] = explained(fit.additive.residual(y), r_s,
                               torch.as_tensor(ni, device=dev),
                               torch.as_tensor(s_of[rows], device=dev))
    return out


def gate(m, fit: OperandFit, kv: torch.Tensor, k_map: torch.Tensor, reach: float,
         strict: bool = False):
    """The result labels of one operator's rows ``m`` (neuron indices into the maps) that
    stand beyond the operands: each result row the value rule labels has its p-value
    raised to its tests beyond f(op1) + g(op2) on the KV map (one-sided, the side scored)
    and on the K map (two-sided: the activation must carry the set, not only the lens;
    ``partial_p``), and keeps its label only where that p-value is at most
    ``reach`` (the corrected level) and no rival's set or window
    (``catalog.labels.rivals``) explains the KV
    map beyond the operands by more than ``RIVAL_MARGIN`` over the label's own set
    (``OperandFit.rival_beyond``: one set against one set, so a factor with many levels
    gains nothing; a set that both operators' results name, parity under + and -, ties
    and stays). A row whose set also explains the map within ``RIVAL_MARGIN`` of the
    best window of the operator's own values (``WindowScan``) FITS: it names the set that
    fits, not a set that overlaps it (a wide window around the one that fits, or its
    complement on the other side); with ``strict`` (the second pass) only such rows keep
    their labels. Returns ``m``, its rows updated, and the maps (indices) with a labelled
    row that fits."""
    result_row = np.array([h.target == "result" and not h.chosen
                           for h in m.heuristics] or [False], dtype=bool)[m.heuristic]
    rows = np.nonzero(result_row & m.implements)[0]
    if len(rows):
        # each distinct heuristic's set once (thousands of rows name a few dozen)
        uniq_h, at = np.unique(m.heuristic[rows], return_inverse=True)
        members = fit.set_index([m.heuristics[i] for i in uniq_h])[at.reshape(-1)]
        p, keep, fits = _gate_rows(fit, kv, k_map, m.neuron[rows], members, m.bottom[rows],
                                   reach)
        m.p_value[rows] = np.fmax(m.p_value[rows], p)
        m.implements[rows] &= (p <= reach) & keep & (fits if strict else True)
        return m, np.unique(m.neuron[rows][m.implements[rows] & fits])
    return m, np.zeros(0, np.int64)


def _gate_rows(fit: OperandFit, kv: torch.Tensor, k_map: torch.Tensor, neuron: np.ndarray,
               members: np.ndarray, bottom: np.ndarray, reach: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gate's tests of result rows, each map's and set's residual beyond the operands
    taken once for all of them: (the larger p-value of the KV test, one-sided, and the K
    test, two-sided; whether no rival explains the KV map more than ``RIVAL_MARGIN`` over
    the row's own set or its own operator's best window; whether the own operator's best
    window explains it no more than that over the row's set). The last two are taken
    only on maps with a row whose p-value is at most ``reach`` (True elsewhere: no such
    row keeps a label)."""
    dev = kv.device
    r_s, s_of = _set_residuals(fit, members, dev)
    df = max(fit.n_cells - fit.additive.rank - 1, 1)
    sign = np.where(bottom, -1.0, 1.0)
    p, keep = np.ones(len(neuron)), np.ones(len(neuron), dtype=bool)
    fits = np.ones(len(neuron), dtype=bool)
    for uniq, rows, ni in _blocks(neuron):
        idx = torch.as_tensor(uniq, device=dev)
        ni_t, si_t = torch.as_tensor(ni, device=dev), torch.as_tensor(s_of[rows], device=dev)
        r_kv = fit.beyond(kv, idx)
        # the activation itself must carry the set beyond both operands: a KV map that is
        # an additive activation times the neuron's lens has result structure from the
        # lens alone (the neuron pushes some answer digits whatever the prompt's result)
        p_kv, own_set = partial_tests(r_kv, r_s, ni_t, si_t, sign[rows], df)
        p[rows] = np.fmax(p_kv, partial_p(fit.beyond(k_map, idx), r_s, ni_t, si_t, None, df))
        # the rivals only of maps with a row that passes: no other row keeps a label
        need = np.zeros(len(uniq), dtype=bool)
        need[ni[p[rows] <= reach]] = True
        if fit.scans and need.any():
            sel = need[ni]
            keep[rows[sel]], fits[rows[sel]] = _rivals(
                fit, kv, idx, r_kv, need, ni[sel], own_set[sel])
    return p, keep, fits


def _rivals(fit: OperandFit, kv: torch.Tensor, idx: torch.Tensor, r_kv: torch.Tensor,
            need: np.ndarray, at_ni: np.ndarray, own_set: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """The gate's comparisons of rows (``at_ni``: each row's map among ``idx``, all of
    them maps in ``need``; ``own_set``: what each row's set explains of it): (no rival
    explains the map more than ``RIVAL_MARGIN`` over the row's set or its own operator's
    best window; the own best window explains it no more than that over the row's set).
    Decided with the window scans' float32 bounds (``OperandFit.held_bounds``) where they
    settle both comparisons; the maps of the other rows are scanned exactly."""
    at = np.nonzero(need)[0]
    r_at = r_kv.index_select(0, torch.as_tensor(at, device=r_kv.device))
    r_lo, r_hi, w_lo, w_hi = (np.zeros(len(need)) for _ in range(4))
    r_lo[at], r_hi[at], w_lo[at], w_hi[at] = fit.held_bounds(
        kv, idx.index_select(0, torch.as_tensor(at, device=idx.device)), r_at)
    m = 1 - RIVAL_MARGIN

    def decide():
        keep_yes = np.fmax(own_set, w_lo[at_ni]) >= m * r_hi[at_ni]
        keep_no = np.fmax(own_set, w_hi[at_ni]) < m * r_lo[at_ni]
        fits_yes, fits_no = own_set >= m * w_hi[at_ni], own_set < m * w_lo[at_ni]
        return keep_yes, fits_yes, ~(keep_yes | keep_no) | ~(fits_yes | fits_no)
    keep, fits, doubt = decide()
    if doubt.any():
        exact = np.unique(at_ni[doubt])
        where = torch.as_tensor(exact, device=r_kv.device)
        r_ex = r_kv.index_select(0, where)
        rival, _, window = fit.rival_beyond_residual(
            r_ex, fit.window_best(kv, idx.index_select(0, where), r_ex))
        r_lo[exact], r_hi[exact], w_lo[exact], w_hi[exact] = rival, rival, window, window
        keep, fits, _ = decide()
    return keep, fits
