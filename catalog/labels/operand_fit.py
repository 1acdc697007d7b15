"""Does a map say more about the result than its two operands say additively?

On ``+`` every map that adds a feature of op1 to a feature of op2 (how many digits each
operand has, whether each is at least 10) is highest where both operands are large, so
it correlates with the result and its top cells look like a result range. Such a map
has no result structure: nothing in it needs the sum. docs/method.md section 7 ("What a
label explains") states the rule this module implements:

- ``AdditiveOperands``: the exact least-squares projection of maps on one operator's
  cells onto the functions f(op1) + g(op2) (both operands' main effects; the cells need
  not be a rectangle: the normal equations are solved with their pseudo-inverse, built
  once per operator).
- ``partial_p``: does a result heuristic's set explain the KV map beyond that fit?
  The partial regression's t-test, classic and heteroscedasticity-robust, the larger
  p-value kept. A result label needs it at the corrected level too
  (``catalog.labels.gate``), so an additive map, which the fit explains whole, keeps no
  result label, while a result set with operand effects of any size mixed in keeps its
  own.
- ``Explanations``: per map, the held-out R^2 of the competing explanations (fit on four
  folds of unordered operand pairs, judged on the fifth): the operands additively, the
  result as a factor (one mean per result value), both together, and the best other
  operator's result with the operands. A result
  label of this operator is kept only where its own result explains the map at least as
  well as every other operator's (``catalog.labels.gate``): a window of op1 * op2 measured on ``+``
  prompts is not a sum heuristic.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.labels.additive import (
    BLOCK,
    AdditiveOperands,
    WindowScan,
    operand_groups,
    screen_t_test,
)
from catalog.labels.fit_models import (
    TSS,
    Explanations,
    FoldModel,
    fold_model,
    held_out_all,
    held_out_r2,
    levels,
    pair_folds,
)
from catalog.labels.rivals import (
    FACTOR_BINS,
    rival_axes,
    width_levels,
)

# the most cells x sets of an operator's own result sets kept for ``may_label`` (float64;
# 16M: 128 MB): on larger grids the second pass looks at every map
LABELABLE_LIMIT = 1 << 24
# the most values (maps x cells) whose residuals ``OperandFit.hold`` keeps (float64:
# 256 MB)
HELD_LIMIT = 1 << 25
# maps x cells per block of the explanations (``held_out_all``), at least ``BLOCK`` maps:
# on Qwen's [0, 30) grid blocks of 512 maps ran 13% faster than 256, and 1,024 no faster
# (median of 4, 3,072 maps); larger grids keep blocks of ``BLOCK``
EXPLAIN_VALUES = 512 * 900
# a result set of another operator must explain this much more of a KV map beyond the
# operands than the label's own set (relative) to take the label away: on small grids
# two operators' results describe one set almost equally (the corner of [0, 30)^2 is
# both "a + b >= 40" and "a * b large"), and a near tie is not evidence
RIVAL_MARGIN = 0.1


def labelable_fits(n_sets: int, n_cells: int) -> bool:
    """Whether ``n_sets`` result sets over ``n_cells`` cells are kept for the second
    pass's screen (``OperandFit.labelable``), under ``LABELABLE_LIMIT``."""
    return n_sets * n_cells <= LABELABLE_LIMIT


@dataclass
class OperandFit:
    """What one operator's grid needs for the rule: its additive fit and the competing
    explanations' models."""

    op: str
    additive: AdditiveOperands
    # each explanation's groupings of the cells ("operands", "result", and "joint:" + each
    # operator) and the folds they are judged on; their models are built when first
    # asked for (``models``): only the explanations use them, and the controls, which
    # count labels alone, never do (on [0, 300) they are a third of a fit's bytes and
    # three quarters of its building time)
    specs: dict[str, list[np.ndarray]]
    folds: np.ndarray
    device: str | torch.device
    n_cells: int
    cells: tuple[np.ndarray, np.ndarray, np.ndarray]  # op1, op2, result of each cell
    # the rival axes' names (``catalog.labels.rivals.rival_axes``)
    axes: tuple[str, ...] = ()
    # the cell sets of the heuristics tested so far (rows of a bool array) and their keys
    sets: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    _set_of: dict[str, int] = field(default_factory=dict)
    # the rivals of a result label: other operators' result sets on these cells, less
    # their additive fit (float64, sets x cells), their sums of squares and operators
    rivals: torch.Tensor | None = None
    rival_ss: torch.Tensor | None = None
    rival_ops: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype="<U1"))
    # every operator's windows (built with the rivals)
    scans: dict[str, WindowScan] = field(default_factory=dict)
    # the result sets of this operator that the second pass may label (less their additive
    # fit; ``may_label``), and their sums of squares; None: not known (nothing is skipped)
    labelable: torch.Tensor | None = None
    labelable_ss: torch.Tensor | None = None
    # the same sets as they are (bool; ``catalog.labels.additive.with_set``)
    labelable_sets: torch.Tensor | None = None
    # each heuristic's row in ``labelable`` by key (-1: its set is additive, never labelled)
    labelable_of: dict[str, int] = field(default_factory=dict)
    # maps held with their residuals beyond the operands (``hold``), by identity, the best
    # window of the operator's values of each (NaN: not yet taken; ``window_best``) and
    # the float32 scans' bounds of each (maps x 4: ``rival_bounds``' four, NaN: not yet
    # taken; ``held_bounds``)
    _held: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    _models: dict[str, FoldModel] = field(default_factory=dict)
    # each rival axis's fit with the operands (``rival_rule.projection``), built once
    _projections: dict = field(default_factory=dict)
    # the operands with one label's set (``rival_rule.set_model``), the last used kept
    _set_models: OrderedDict = field(default_factory=OrderedDict)

    @property
    def models(self) -> dict[str, FoldModel]:
        """Each explanation's ``FoldModel``, built the first time (``fold_model``: a model
        of the same groupings and folds that another fit of this process holds is
        shared, as ``+`` and ``*`` on one grid share all but their own result's)."""
        for k, groups in self.specs.items():
            if k not in self._models:
                self._models[k] = fold_model(groups, self.folds, self.device)
        return self._models

    def hold(self, *maps: torch.Tensor) -> None:
        """Take each map's residual beyond the operands once, for every ``beyond`` until
        ``release`` (the gate, the second pass and its gate ask for the same maps'
        residuals, and for the best window of some: ``window_best``); maps over
        ``HELD_LIMIT`` values are taken block by block instead."""
        self._held = []
        for m in maps:
            if m.numel() <= HELD_LIMIT:
                r = torch.empty(m.shape, dtype=torch.float64, device=m.device)
                for s in range(0, len(m), BLOCK):
                    self.additive.residual(m[s:s + BLOCK], out=r[s:s + BLOCK])
                nan = torch.full((len(m),), float("nan"), dtype=torch.float64, device=m.device)
                self._held.append((m, r, nan, torch.full((len(m), 4), float("nan"),
                                                         dtype=torch.float64)))

    def release(self) -> None:
        self._held = []

    def beyond(self, maps: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(len(idx), cells) float64: maps ``idx`` of ``maps`` less their additive fit."""
        for m, r, *_ in self._held:
            if m is maps:
                return r.index_select(0, idx)
        y = maps.index_select(0, idx).double()
        return self.additive.residual(y)

    def window_best(self, maps: torch.Tensor, idx: torch.Tensor,
                    r_y: torch.Tensor) -> torch.Tensor:
        """(len(idx),) the largest sum of squares that one window of the operator's own
        values explains of maps ``idx`` of ``maps`` beyond the operands (``r_y``: their
        residuals), each held map's taken once (the gate and the second pass's screen
        ask for many of the same maps)."""
        scan = self.scans.get(self.op)
        if scan is None:
            return torch.zeros(len(idx), dtype=torch.float64, device=r_y.device)
        for m, _, kept, _ in self._held:
            if m is maps:
                got = kept.index_select(0, idx)
                miss = torch.nonzero(torch.isnan(got))[:, 0]
                if len(miss):
                    new = scan.best(r_y.index_select(0, miss))
                    got[miss] = new
                    kept[idx.index_select(0, miss)] = new
                return got
        return scan.best(r_y)

    def held_bounds(self, maps: torch.Tensor, idx: torch.Tensor, r_y: torch.Tensor,
                    own_only: bool = False) -> tuple[np.ndarray, ...]:
        """``rival_bounds`` of maps ``idx`` of ``maps`` (``r_y``: their residuals), each held
        map's taken once: the first pass's gate, the second pass's screen and its gate
        scan many of the same maps. ``own_only``: only the own operator's window (the
        third and fourth values; the first two are NaN where not taken before). Bounds
        are bounds whichever block of maps took them: every decision made with them is
        the one the exact values make (``catalog.labels.gate``)."""
        held = next((b for m, _, _, b in self._held if m is maps), None)
        if held is None:
            if own_only:
                lo, hi = self.own_bounds(r_y)
                nan = np.full(len(idx), np.nan)
                return nan, nan.copy(), lo, hi
            return self.rival_bounds(r_y)
        rows = idx.cpu()
        got = held.index_select(0, rows)
        cols = slice(2, 4) if own_only else slice(0, 4)
        miss = torch.nonzero(torch.isnan(got[:, cols]).any(1))[:, 0]
        if len(miss):
            r_miss = r_y.index_select(0, miss.to(r_y.device))
            if own_only:
                new = torch.as_tensor(np.stack(self.own_bounds(r_miss), 1))
                got[miss, 2:] = new
                held[rows.index_select(0, miss), 2:] = new
            else:
                new = torch.as_tensor(np.stack(self.rival_bounds(r_miss), 1))
                got[miss] = new
                held[rows.index_select(0, miss)] = new
        out = got.numpy()
        return out[:, 0], out[:, 1], out[:, 2], out[:, 3]

    def own_bounds(self, r_y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``rival_bounds``' last two values: bounds on the best window of the operator's
        own values (zero without a scan)."""
        scan = self.scans.get(self.op)
        if scan is None or not len(r_y):
            zero = np.zeros(len(r_y))
            return zero, zero.copy()
        lo, hi = scan.bounds(r_y)
        return lo.cpu().numpy(), hi.cpu().numpy()

    def set_index(self, heuristics: list) -> np.ndarray:
        """Each heuristic's row in ``sets`` (added the first time it is asked for)."""
        new = [h for h in dict.fromkeys(heuristics) if h.key not in self._set_of]
        if new:
            a, b, r = self.cells
            rows = np.stack([h.contains(a, b, r) for h in new]).astype(bool)
            base = self.sets if self.sets.size else np.zeros((0, len(a)), dtype=bool)
            for i, h in enumerate(new):
                self._set_of[h.key] = len(base) + i
            self.sets = np.concatenate([base, rows])
        return np.array([self._set_of[h.key] for h in heuristics], dtype=np.int64)

    @classmethod
    def of(cls, op: str, a: np.ndarray, b: np.ndarray, result: np.ndarray,
           device: str | torch.device | None = "cpu", rivals: np.ndarray | None = None,
           rival_ops: np.ndarray | None = None, own: np.ndarray | None = None,
           own_of: dict[str, int] | None = None,
           moduli: tuple[int, ...] = tuple(range(2, 11))) -> OperandFit:
        """``rivals``: (sets, cells) bool, other operators' result sets on these cells
        (``catalog.labels.operator_labels.operand_fit`` builds them from the config's
        heuristics for every rival axis, ``catalog.labels.rivals``), and ``rival_ops``
        their axes' names; without them no label is taken for a rival. ``own``: (sets,
        cells) bool, every result set of this operator that a label may name
        (``may_label``), and ``own_of`` each such heuristic's row in it by key.
        ``moduli``: the residues of each rival axis that the held-out comparison fits
        (the config's ``modulo_bases``)."""
        device = "cpu" if device is None else device
        a, b, result = np.asarray(a), np.asarray(b), np.asarray(result)
        add = AdditiveOperands.of(a, b, device)
        groups = operand_groups(a, b)
        folds = pair_folds(a, b)
        axes = rival_axes(a, b, result)
        # the own result by bins too (one mean per product value predicts nothing on
        # products a fold never saw) and every rival axis as the same factors
        specs = {"operands": groups, "result": [levels(result)],
                 "joint": [*groups, levels(result)]}
        specs["joint/width"] = [*groups, width_levels(result, FACTOR_BINS[-1])]
        for bins in FACTOR_BINS:
            specs[f"joint/{bins}"] = [*groups, levels(result, bins)]
            for name, values in axes.items():
                specs[f"joint:{name}/{bins}"] = [*groups, levels(values, bins)]
        # and each rival by equal-width bins of its values (smooth in the value where the
        # values are spread unevenly, as products are) and by its residues: families
        # that predict values no fold holds
        for name, values in axes.items():
            specs[f"joint:{name}/width"] = [*groups, width_levels(values, FACTOR_BINS[-1])]
            for n in moduli:
                specs[f"joint:{name}%{n}"] = [*groups, levels(np.where(values >= 0,
                                                                       values % n, -1))]
        fit = cls(op, add, specs, folds, device, len(a), (a, b, result), tuple(axes))
        if rivals is not None and len(rivals):
            r = torch.as_tensor(np.asarray(rivals), dtype=torch.float64, device=device)
            r = add.residual(r)
            ss = (r * r).sum(1)
            keep = (ss > 1e-12).cpu().numpy()  # an additive set explains nothing beyond
            fit.rivals, fit.rival_ss = r[torch.as_tensor(keep, device=device)], ss[keep]
            fit.rival_ops = np.asarray(rival_ops)[keep].astype(str)
        if rivals is not None:
            fit.scans = {op: WindowScan.of(result, add, device),
                         **{name: WindowScan.of(v, add, device) for name, v in axes.items()}}
        if own is not None and labelable_fits(*np.shape(own)):
            sets = torch.as_tensor(np.asarray(own), dtype=torch.float64, device=device)
            sets = add.residual(sets)
            sets_ss = (sets * sets).sum(1)
            real = sets_ss > 1e-12  # an additive set explains nothing beyond: never labelled
            fit.labelable, fit.labelable_ss = sets[real], sets_ss[real]
            fit.labelable_sets = torch.as_tensor(np.asarray(own, bool), device=device)[real]
            row = np.where(real.cpu().numpy(), np.cumsum(real.cpu().numpy()) - 1, -1)
            fit.labelable_of = {k: int(row[i]) for k, i in (own_of or {}).items()}
        return fit

    def may_label(self, kv: torch.Tensor, k_map: torch.Tensor, reach: float,
                  rows: np.ndarray) -> torch.Tensor | None:
        """(maps, sets) bool: whether result set s (a row of ``labelable``) could keep a
        label of map m (``rows`` of ``kv`` and ``k_map``) through ``gate`` with ``strict``
        (the second pass): explain the KV map beyond the operands within
        ``RIVAL_MARGIN`` of the best window of the operator's values and pass both tests
        beyond the operands. Necessary conditions only, each looser than the gate's (the
        classic t-test alone, one-sided at ``reach`` on both maps; the gate also takes the
        robust test's p-value and tests the K map two-sided), so a pair marked False can
        get no such label. Each condition is taken only for the maps the ones before it
        left a set (the KV test, the K test, the window). The tests' products run in
        float32, each loosened by a bound on its rounding (``_float32_slack``), so that
        the screen stays necessary. None where the sets are not known."""
        if self.labelable is None:
            return None
        from scipy import stats

        assert self.labelable_ss is not None
        n = len(rows)
        out = torch.zeros(n, len(self.labelable), dtype=torch.bool, device=kv.device)
        df = max(self.n_cells - self.additive.rank - 1, 1)
        # a hair looser than the gate, so that no rounding can skip a map it labels
        t2 = float(stats.t.isf(reach, df)) ** 2 * (1 - 1e-9)
        window = self.scans.get(self.op)
        sets, sets_ss = self.labelable.float(), self.labelable_ss

        for s in range(0, n, BLOCK):
            idx = torch.as_tensor(rows[s:s + BLOCK], device=kv.device, dtype=torch.long)
            r = self.beyond(kv, idx)
            e, got = screen_t_test(r, sets, sets_ss, df, t2)
            live = torch.nonzero(got.any(1))[:, 0]
            if not len(live):
                continue
            _, got_k = screen_t_test(self.beyond(k_map, idx.index_select(0, live)), sets,
                                     sets_ss, df, t2)
            got = got.index_select(0, live) & got_k
            if window is not None:
                more = torch.nonzero(got.any(1))[:, 0]
                if not len(more):
                    continue
                got, live = got.index_select(0, more), live.index_select(0, more)
                e = e.index_select(0, live)
                # the window's lower bound: below the best window, still necessary
                best = torch.as_tensor(self.held_bounds(kv, idx.index_select(0, live),
                                                        r.index_select(0, live), True)[2],
                                       device=e.device)
                got &= e >= (1 - RIVAL_MARGIN) * (1 - 1e-9) * best[:, None]
            out[s + live] = got
        return out

    def rival_beyond(self, maps: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per map (rows): the largest sum of squares that one rival (another operator's
        result set, or window of its values) explains beyond the operands' fit (the
        partial regression's (r_y . r_s)^2 / |r_s|^2), that rival's operator ('' without
        rivals), and the largest that a window of this operator's values explains."""
        n = len(maps)
        best, which, own = np.zeros(n), np.full(n, "", dtype=object), np.zeros(n)
        for s in range(0, n, BLOCK):
            y = maps[s:s + BLOCK].double()
            got = self.rival_beyond_residual(self.additive.residual(y))
            best[s:s + BLOCK], which[s:s + BLOCK], own[s:s + BLOCK] = got
        return best, which, own

    def rival_beyond_residual(self, r_y: torch.Tensor, own: torch.Tensor | None = None
                              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rival_beyond`` of maps given as their residuals beyond the operands' fit
        (``own``: the best window of the operator's own values, where already taken)."""
        n = len(r_y)
        if not n or not self.scans:
            return np.zeros(n), np.full(n, "", dtype=object), np.zeros(n)
        others = [o for o in self.scans if o != self.op]
        cand = [self.scans[o].best(r_y) for o in others]
        if self.rivals is not None:
            assert self.rival_ss is not None
            v, i = ((r_y @ self.rivals.T) ** 2 / self.rival_ss).max(1)
            cand.append(v)
        stack = torch.stack(cand).cpu().numpy()
        pick = stack.argmax(0)
        best = stack[pick, np.arange(n)]
        ops = np.array(others + [""], dtype=object)[np.minimum(pick, len(others))]
        if self.rivals is not None:
            at = pick == len(others)
            ops[at] = self.rival_ops[i.cpu().numpy()][at]
        own = self.scans[self.op].best(r_y) if own is None else own
        return best, ops, own.cpu().numpy()

    def rival_bounds(self, r_y: torch.Tensor) -> tuple[np.ndarray, ...]:
        """Bounds on ``rival_beyond_residual``'s first and third values (the best rival,
        the best window of the operator's own values) of residual maps ``r_y``: (rival
        lo, rival hi, window lo, window hi), every window scan in float32
        (``WindowScan.bounds``), the rival sets exactly."""
        n = len(r_y)
        zero = np.zeros(n)
        if not n or not self.scans:
            return zero, zero, zero, zero
        lo, hi = [], []
        for o, scan in self.scans.items():
            if o != self.op:
                a, b = scan.bounds(r_y)
                lo.append(a)
                hi.append(b)
        if self.rivals is not None:
            assert self.rival_ss is not None
            v = ((r_y @ self.rivals.T) ** 2 / self.rival_ss).amax(1)
            lo.append(v)
            hi.append(v)
        w_lo, w_hi = self.own_bounds(r_y)
        return (torch.stack(lo).amax(0).cpu().numpy(), torch.stack(hi).amax(0).cpu().numpy(),
                w_lo, w_hi)

    def explain(self, maps: torch.Tensor) -> Explanations:
        """The held-out R^2 of every explanation of each map: each model fit on four
        fifths of the cells and judged on the fifth it did not see (``pair_folds``), so a
        model with more parameters (the product's many values) gains nothing it cannot
        predict. Adjusted R^2 was not enough: the product's levels on [0, 50)^2 nearly
        name the unordered operand pair and fit any symmetric map (a parity neuron of the
        built-in model: 0.91 against its own sum's 0.41)."""
        n = len(maps)
        out = Explanations.empty(n)
        if not n:
            return out
        keys = list(self.specs)
        cols: dict[str, list] = {k: [] for k in keys}
        step = max(BLOCK, EXPLAIN_VALUES // max(self.n_cells, 1))
        for s in range(0, n, step):
            got = held_out_all({k: self.models[k] for k in keys}, maps[s:s + step])
            for k in keys:
                cols[k].append(held_out_r2(got[k], got[TSS]))
        adj = {k: torch.cat(v).cpu().numpy() for k, v in cols.items()}
        out.operands, out.result = adj["operands"], adj["result"]
        # the own result and each rival as it predicts best: by value or by bins
        out.joint = _best([adj["joint"], adj["joint/width"],
                           *(adj[f"joint/{b}"] for b in FACTOR_BINS)])
        out.rivals = {o: _best([adj[k] for k in keys if k.startswith(f"joint:{o}/")
                                or k.startswith(f"joint:{o}%")]) for o in self.axes}
        out.other, out.other_op = out.best_rival()
        return out


def _best(r2: list[np.ndarray]) -> np.ndarray:
    """Per map, the largest of several models' held-out R^2 (NaN where all are)."""
    stack = np.stack([np.nan_to_num(x, nan=-np.inf) for x in r2])
    best = stack.max(0)
    return np.where(np.isinf(best), np.nan, best)
