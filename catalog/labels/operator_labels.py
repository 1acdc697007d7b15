"""One operator's labels from its maps, the one sequence every caller runs: the run's
layers (``CheckpointRun.run_layer``), its controls (relabelled values, token format) and
the label-rule tests.

1. Algorithm 1 scores on the K and KV maps (the caller's ``score``: it knows the
   operator's index and the multi-result family);
2. the config's label rule (``catalog.labels.value_null.label``);
3. with ``result_beyond_operands``, the gate (``catalog.labels.gate.gate``): a result
   label must also explain the KV map beyond both operands' additive effects, and no
   rival's set (``operand_fit``: the config's residue and digit-pattern heuristics of
   every rival axis, ``catalog.labels.rivals``, on these cells) or window of a rival's
   values may explain it clearly better;
4. with the gate, the maps left without a result label that FITS (its set explains the
   map beyond the operands within 10% of the best window of the operator's values) are
   scored again beyond the operands (``rescued``): each result set on the KV map less
   the operands' part of its joint fit with that set (``additive.with_set``). A result
   set with a smooth operand trend of its own size mixed in loses its top cells to the
   trend (the first pass labels a wide window around it, or nothing), and that map gives
   them back. A result row found so passes steps 2 and 3 as every row does, and must
   fit;
5. (catalog 0.11.0, ``beaten``) held out, no rival predicts the KV map better than the
   operator's own result (the comparison stored for the map), and
6. the label's set explains the KV map beyond the operands and each rival axis's factor
   (a nested test at the corrected level): a map that is a function of a rival, or of
   both the result and a rival, keeps no result label.

The explanations of every labelled map (K and KV) are kept for the store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from catalog.config.vocab import FIT_COLS, FIT_OP_COLS
from catalog.core.digest import array_digest
from catalog.labels import fit_store, value_null
from catalog.labels.additive import BLOCK, with_set
from catalog.labels.fit_models import held_bytes
from catalog.labels.gate import gate
from catalog.labels.heuristics import (
    Cells,
    Rescue,
    partitions_for,
    result_partitions,
)
from catalog.labels.matches import Matches
from catalog.labels.operand_fit import (
    HELD_LIMIT,
    Explanations,
    OperandFit,
    labelable_fits,
)
from catalog.labels.rival_rule import beaten, result_rows
from catalog.labels.rivals import AXIS_OP, rival_axes


def gated(config) -> bool:
    """Whether the config's labels pass the gate: ``result_beyond_operands`` under the
    'values' rule (the 'paper' and 'significant' rules stay as they were defined)."""
    return bool(config.result_beyond_operands and config.label_rule == "values")


# operand_fit's fits of this process, newest last: a worker measures checkpoint after
# checkpoint of one model on the same cells, and the fit depends on nothing else (building
# it for a [0, 100) grid takes tens of seconds on one core: pseudo-inverses per fold of
# models thousands of levels wide)
_FITS: OrderedDict[tuple, OperandFit] = OrderedDict()
# the fits of other configs kept hold at most this many bytes (one operator's fit on a
# [0, 100) grid holds about 0.2 GB, on [0, 300) about 0.85 GB; kept eight at a time
# beside another test process, a process slowed 10x)
FITS_KEPT_BYTES = 2 << 30
# the fits of the config asked for last (its operators' and its controls': a run's
# working set, which the run holds anyway) are kept up to this many bytes: a run on
# [0, 300) holds eight fits, 5.7 GB, and under the cap above each checkpoint built all
# eight again (about 200 s on one core) while the next one evicted the last
FAMILY_KEPT_BYTES = 8 << 30


def operand_fit(config, cells, device: str | torch.device | None = "cpu") -> OperandFit:
    """``build_operand_fit``, kept per process for the same config, cells and device (the
    fit holds no state between calls: ``OperandFit.hold`` is released by its caller),
    the fits kept within ``FITS_KEPT_BYTES`` and ``FAMILY_KEPT_BYTES`` (``_evict``), and
    on disk for the next process (``catalog.labels.fit_store``, saved as built: its
    explanation models are stored by ``fold_model``)."""
    digest = array_digest(*(np.asarray(x, dtype=np.int64)
                            for x in (cells.a, cells.b, cells.result)))
    key = (config.config_hash(), cells.op, cells.lo, cells.hi, digest,
           str("cpu" if device is None else device))
    if key in _FITS:
        _FITS.move_to_end(key)
        return _FITS[key]
    fit = fit_store.load("fit", key, OperandFit, device)
    if fit is None:
        fit = build_operand_fit(config, cells, device)
        fit_store.save("fit", key, fit, held_bytes(fit))
    _FITS[key] = fit
    _evict(key)
    return fit


def _family(key: tuple) -> tuple:
    """The part of a ``_FITS`` key that one run's fits share (config, grid, device)."""
    return (key[0], key[2], key[3], key[5])


def _evict(new: tuple) -> None:
    """Least recently used first: other configs' fits until all kept hold at most
    ``FITS_KEPT_BYTES``, then the asked-for config's own (``new`` last) down to
    ``FAMILY_KEPT_BYTES``; a fit over that alone is not kept. Sizes are taken now: a
    fit's explanation models are built when first used (``OperandFit.models``)."""
    size = {k: held_bytes(f) for k, f in _FITS.items()}
    for limit, ours in ((FITS_KEPT_BYTES, False), (FAMILY_KEPT_BYTES, True)):
        for key in list(_FITS):
            if sum(size.values()) <= limit:
                break
            if (_family(key) == _family(new)) == ours:
                del _FITS[key]
                del size[key]


def build_operand_fit(config, cells, device: str | torch.device | None = "cpu") -> OperandFit:
    """The gate's fit for one operator's cells (``catalog.labels.heuristics.Cells``), with its
    rivals: every residue and digit-pattern result heuristic the config builds for each
    other operator, on the cells where its result is defined (non-negative, no division
    by zero), beside which the fit scans every window of each operator's values
    (``catalog.labels.additive.WindowScan``)."""
    rivals: list[np.ndarray] = []
    ops: list[str] = []
    for name, r in rival_axes(cells.a, cells.b, cells.result).items():
        valid = r >= 0
        if valid.sum() < 2:
            continue
        sub = Cells(AXIS_OP.get(name, "+"), cells.a[valid], cells.b[valid], r[valid],
                    cells.lo, cells.hi)
        for part in partitions_for(sub, config):
            for h in part.heuristics:
                if h.target == "result" and h.spec.rival_sets:
                    rivals.append(np.asarray(h.contains(cells.a, cells.b, r), bool) & valid)
                    ops.append(name)
    sets, first = (unique_rows(np.stack(rivals)) if rivals
                   else (np.zeros((0, len(cells.a)), bool), np.zeros(0, np.int64)))
    # the sets the second pass may label: every partition it scores (result_partitions),
    # packed to bits as they are made (``*`` on [0, 300) has 23,955 of them: 2 GiB as
    # booleans, twice that stacked, before the limit below turned them all away)
    packed, keys = [], []
    for p in result_partitions(partitions_for(cells, config)):
        for i, h in enumerate(p.heuristics):
            packed.append(np.packbits(p.labels == i))
            keys.append(h.key)
    rival_ops = np.array(ops, dtype=object)[first]
    if packed:
        stacked = np.stack(packed)
        first_own, row = unique_packed(stacked, inverse=True)
        if labelable_fits(len(first_own), len(cells.a)):
            uniq = unpacked(stacked[first_own], len(cells.a))
            return OperandFit.of(cells.op, cells.a, cells.b, cells.result, device,
                                 rivals=sets, rival_ops=rival_ops, own=uniq,
                                 own_of=dict(zip(keys, row.tolist(), strict=True)),
                                 moduli=config.modulo_bases())
    # none, or too many to screen (``OperandFit.may_label``: every set scored instead)
    return OperandFit.of(cells.op, cells.a, cells.b, cells.result, device, rivals=sets,
                         rival_ops=rival_ops, moduli=config.modulo_bases())


def unique_rows(rows: np.ndarray, inverse: bool = False) -> tuple:
    """``np.unique(rows, axis=0, return_index=True)`` of boolean rows (sets over cells),
    the same rows in the same order (with ``inverse``, also each row's index among
    them), through ``unique_packed``. numpy's row unique sorts a record of one field per
    cell, field by field: 2.5 s of the 6.0 s that building the fit for ``*`` on [0, 100)
    took on one core."""
    rows = np.ascontiguousarray(rows, dtype=bool)
    got = unique_packed(np.packbits(rows, axis=1), inverse)
    return (rows[got[0]], *got)


def unique_packed(packed: np.ndarray, inverse: bool = False) -> tuple:
    """(first, [back]) of rows of cells packed to bits (``np.packbits`` along each row:
    the first cell in the highest bit, so the bytes compare as the rows do): each
    distinct row's first index, in the rows' order, and with ``inverse`` each row's
    index among the distinct ones."""
    packed = np.ascontiguousarray(packed)
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
    _, first, back = np.unique(keys, return_index=True, return_inverse=True)
    return (first, back.reshape(-1)) if inverse else (first,)


def unpacked(packed: np.ndarray, n_cells: int) -> np.ndarray:
    """Boolean rows of ``n_cells`` cells from rows packed by ``np.packbits``."""
    return np.unpackbits(packed, axis=1, count=n_cells).astype(bool)


@dataclass
class OperatorLabels:
    """The labelled rows of one operator (neuron indices into the maps given) and the
    explanations of each labelled map (``labelled``: those indices)."""

    matches: Matches
    labelled: np.ndarray
    k: Explanations
    kv: Explanations


# the caller's scoring of some maps: score(k_map, kv_scored, orders, rescue) -> Matches,
# with neuron indices into the maps given; ``rescue``: False, or the second pass (step 4):
# True or a ``Rescue``, the partitions of ``rescue_partitions`` (result heuristics of one
# value set only, no operand heuristics, no multi-result sets; less the partitions whose
# every heuristic the ``Rescue`` skips)
Score = Callable[[torch.Tensor, torch.Tensor, dict, bool | Rescue], Matches]


def label_operator(config, k_map: torch.Tensor, kv: torch.Tensor, score: Score,
                   n_tests: int, null: value_null.ValueNull | None, fit: OperandFit | None,
                   timed: Callable | None = None, explain: bool = True,
                   explain_k: bool = True) -> OperatorLabels:
    """Score, label and gate one operator's live maps (steps 1-4 of the module doc).
    ``timed(phase, fn, *args)`` times each phase where given (the run's clock);
    ``explain``: the labelled maps' explanations (the controls count labels alone);
    ``explain_k``: their K maps' too (they decide nothing: NaN where not computed)."""
    def run(phase, fn, *args):
        return fn(*args) if timed is None else timed(phase, fn, *args)

    beyond = fit is not None and gated(config)
    orders: dict = {}
    m = run("matching", score, k_map, kv, orders, False)
    m = run("significance", value_null.label, m, config, n_tests, null, k_map, kv, orders)
    orders.clear()  # the sorted maps: the second pass sorts its own
    if not beyond:
        return OperatorLabels(m, np.zeros(0, np.int64), Explanations.empty(),
                              Explanations.empty())
    assert fit is not None
    reach = config.significance_level / max(n_tests, 1)
    value_labelled = np.unique(m.neuron[m.implements])
    run("significance", fit.hold, kv, k_map)
    try:
        m, fitting = run("significance", gate, m, fit, kv, k_map, reach)
        r = run("matching", rescued, fitting, config, kv, k_map, score, n_tests, null, fit,
                reach)
        r, _ = run("significance", gate, r, fit, kv, k_map, reach, True)
    finally:
        fit.release()
    m = merged(m, r)
    # the held-out comparison decides too (``beaten``): every map with a result label
    # still standing is explained, and so are, for the store, the maps the value rule
    # labels in the first pass (whether or not the gate keeps the label: their
    # explanations say why) and those the second pass labels
    standing = np.unique(m.neuron[m.implements & result_rows(m)])
    labelled = (np.union1d(np.union1d(value_labelled, r.neuron[r.implements]), standing)
                if explain else standing)
    ex_k, ex_kv = run("explanations", explain_maps, fit, k_map if explain_k else None, kv,
                      labelled)
    m = beaten(m, fit, kv, labelled, ex_kv, reach)
    if not explain:
        labelled, ex_k, ex_kv = np.zeros(0, np.int64), Explanations.empty(), Explanations.empty()
    # a row the gate unlabels is kept only where it is among its family's best
    return OperatorLabels(m.compact(config.scores_per_family), labelled, ex_k, ex_kv)


def explain_maps(fit: OperandFit, k_map: torch.Tensor | None, kv: torch.Tensor,
                 labelled: np.ndarray) -> tuple[Explanations, Explanations]:
    """The explanations of maps ``labelled`` (indices), on the K and the KV map (the K
    maps' left NaN where ``k_map`` is None: each map's explanations are its own, so the
    KV maps' do not depend on it)."""
    if not len(labelled):
        return Explanations.empty(), Explanations.empty()
    idx = torch.as_tensor(labelled, device=kv.device, dtype=torch.long)
    ex_k = (Explanations.empty(len(labelled)) if k_map is None
            else fit.explain(k_map.index_select(0, idx)))
    return ex_k, fit.explain(kv.index_select(0, idx))


# a residual below this share of its map's norm is the float32 rounding of the fit
RESIDUAL_FLOOR = 1e-5


def rescued(fitting: np.ndarray, config, kv: torch.Tensor, k_map: torch.Tensor,
            score: Score, n_tests: int, null: value_null.ValueNull | None,
            fit: OperandFit, reach: float = 0.0) -> Matches:
    """Step 4 of the module doc: the result rows that the label rule labels on the KV map
    less the operands' part of its joint fit with the row's set (``with_set``; where the
    sets are not known, a large grid: less the additive fit alone), of the maps not in
    ``fitting`` (those with a result
    label whose set fits: ``catalog.labels.gate.gate``); neuron indices into the maps
    (every row is labelled by the value rule; the strict gate is still to pass). Only the
    (map, set) pairs that could pass the strict gate at ``reach``
    (``OperandFit.may_label``) are looked at: maps with none are not scored, the
    partitions with none of their sets are not scored, and rows of other pairs are not
    tested (a row's score and p-value are its own: each row labelled here is labelled
    when every row is scored and tested)."""
    todo = np.setdiff1d(np.arange(len(kv)), fitting)
    pairs = None
    if len(todo) and reach > 0:
        pairs = fit.may_label(kv, k_map, reach, todo)
        if pairs is not None:
            some = pairs.any(1)
            todo, pairs = todo[some.cpu().numpy()], pairs[some]
    if not len(todo):
        return Matches.empty()
    idx = torch.as_tensor(todo, device=kv.device, dtype=torch.long)
    kv_sub = kv.index_select(0, idx)
    r_kv = fit.beyond(kv, idx)
    # a map the operands explain to its last digits (a constant one) has nothing left
    left = (r_kv.norm(dim=1) > RESIDUAL_FLOOR * kv_sub.double().norm(dim=1)).cpu()
    todo, r_kv = todo[left.numpy()], r_kv[left.to(r_kv.device)]
    if pairs is not None:
        pairs = pairs[left.to(pairs.device)]
    if not len(todo):
        return Matches.empty()
    if pairs is None:  # the sets are not known (a large grid): the residual itself
        return _rescue_rows(config, k_map, r_kv.to(kv.dtype), todo, score, Rescue(), n_tests,
                            null)
    sets = set(np.nonzero(pairs.any(0).cpu().numpy())[0].tolist())
    rescue = Rescue(frozenset(k for k, i in fit.labelable_of.items() if i not in sets))
    # one map per (map, set) pair: the map less the operands' part of its joint fit with
    # that set (``with_set``), scored for that set alone
    at, j = torch.nonzero(pairs, as_tuple=True)
    assert fit.labelable is not None and fit.labelable_ss is not None
    assert fit.labelable_sets is not None
    out = []
    step = max(1, HELD_LIMIT // max(kv.shape[1], 1))
    for s in range(0, len(at), step):
        a_s, j_s = at[s:s + step], j[s:s + step]
        # the pair maps made BLOCK at a time: whole blocks of float64 copies of the maps
        # and sets (256 MB each on [0, 100)) took most of the second pass there
        y = torch.empty(len(a_s), kv.shape[1], dtype=kv.dtype, device=kv.device)
        for u in range(0, len(a_s), BLOCK):
            a_u, j_u = a_s[u:u + BLOCK], j_s[u:u + BLOCK]
            y[u:u + BLOCK] = with_set(r_kv.index_select(0, a_u),
                                      fit.labelable.index_select(0, j_u),
                                      fit.labelable_ss.index_select(0, j_u),
                                      fit.labelable_sets.index_select(0, j_u).double())
        sets_of = (j_s.cpu().numpy(), fit.labelable_of)
        out.append(_rescue_rows(config, k_map, y, todo[a_s.cpu().numpy()], score,
                                replace(rescue, pairs=sets_of), n_tests, null, sets_of))
    return Matches.concat(out) if out else Matches.empty()


def _rescue_rows(config, k_map: torch.Tensor, y: torch.Tensor, maps: np.ndarray,
                 score: Score, rescue: Rescue, n_tests: int,
                 null: value_null.ValueNull | None, sets: tuple | None = None) -> Matches:
    """The result rows the label rule labels on maps ``y`` (row i: a map of map ``maps[i]``
    of ``k_map``'s operator), neuron indices into the maps; ``sets``: (each row's set,
    each heuristic's set by key), only rows of their own map's set kept."""
    k_sub = k_map.index_select(0, torch.as_tensor(maps, device=k_map.device,
                                                  dtype=torch.long))
    orders: dict = {}
    r = score(k_sub, y, orders, rescue)
    r = r._select(result_rows(r))
    if sets is not None:
        r = r._select(_pair_allowed(r, *sets))
    r = value_null.label(r, config, n_tests, null, k_sub, y, orders)
    r = r._select(r.implements)
    r.neuron = maps[r.neuron].astype(np.int32)
    return r


def _pair_allowed(r: Matches, set_of: np.ndarray, row_of: dict[str, int]) -> np.ndarray:
    """Per row of ``r``, whether its heuristic's set (``row_of``: its row in the sets;
    -1, never) is the set of the map it was scored on (``set_of``: each map's set)."""
    at = np.array([row_of.get(h.key, -1) for h in r.heuristics] or [-1])[r.heuristic]
    return (at >= 0) & (at == set_of[r.neuron])


def merged(m: Matches, r: Matches) -> Matches:
    """``m`` with the labelled rows of ``r`` (rescued), in place of any row of ``m`` for
    the same neuron and heuristic."""
    r = r._select(r.implements)
    if not len(r):
        return m
    # each (neuron, heuristic key) as one integer: the keys numbered over both lists
    code: dict[str, int] = {}
    m_key = np.array([code.setdefault(h.key, len(code)) for h in m.heuristics] or [0])
    r_key = np.array([code.setdefault(h.key, len(code)) for h in r.heuristics] or [0])
    width = max(len(code), 1)
    taken = r.neuron.astype(np.int64) * width + r_key[r.heuristic]
    drop = np.isin(m.neuron.astype(np.int64) * width + m_key[m.heuristic], taken)
    return Matches.concat([m._select(~drop), r])


def fit_columns(d_mlp: int, n_ops: int) -> dict[str, np.ndarray]:
    """Empty explanation columns of one layer (NaN / '': not computed)."""
    cols: dict[str, np.ndarray] = {c: np.full((d_mlp, n_ops), np.nan, np.float32)
                                   for c in FIT_COLS}
    cols.update({c: np.full((d_mlp, n_ops), "", dtype=object) for c in FIT_OP_COLS})
    return cols


def set_fit_columns(cols: dict[str, np.ndarray], neurons: np.ndarray, o: int,
                    out: OperatorLabels) -> None:
    """Write one operator's explanations (``neurons``: the layer's index of each map
    ``out`` was given) into the layer's columns."""
    at = neurons[out.labelled]
    for prefix, ex in (("", out.k), ("kv_", out.kv)):
        for name in ("operands", "result", "joint", "other"):
            cols[f"{prefix}fit_{name}"][at, o] = getattr(ex, name)
        cols[f"{prefix}fit_other_op"][at, o] = ex.other_op
