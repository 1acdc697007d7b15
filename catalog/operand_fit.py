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
- ``beyond_p_values``: does a result heuristic's set explain the KV map beyond that fit?
  The partial regression's t-test, classic and heteroscedasticity-robust, the larger
  p-value kept. A result label needs it at the corrected level too (``gate``), so an
  additive map, which the fit explains whole, keeps no result label, while a result set
  with operand effects of any size mixed in keeps its own.
- ``Explanations``: per map, the adjusted R^2 of the competing explanations: the operands
  additively, the result as a factor (one mean per result value), both together, and
  the best other operator's result with the operands (exact least squares; only the
  explained sums of squares are computed, from the group sums). A result
  label of this operator is kept only where its own result explains the map at least as
  well as every other operator's (``gate``): a window of op1 * op2 measured on ``+``
  prompts is not a sum heuristic.
- ``format_maps``: maps that know only how the numbers are written (digits, first digit,
  token counts): the token-format control of every label report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.arith import OPERATORS, apply_op
from catalog.tails import digit_count

# neurons per block of the projections (a block of float64 maps on a [0, 300) grid is
# block x 90,000 x 8 bytes)
BLOCK = 256
# one-hot designs with more cells x columns than this are kept sparse
DENSE_LIMIT = 20_000_000
# a factor with more values than this (op1 * op2 on a large grid) is fit by this many bins
# of its values (consecutive values by rank), so its normal equations stay small
MAX_LEVELS = 1024
# another operator's result must explain this much more of a map's variance (adjusted R^2)
# than this operator's to take its result label away
OTHER_MARGIN = 0.02


def other_result(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Operator ``op``'s result on cells that may not be valid for it (``apply_op``; a
    division by zero is a value of its own, -1)."""
    out = apply_op(op, a, b)
    return np.where(np.asarray(b) > 0, out, -1) if op == "/" else out


def _levels(values: np.ndarray) -> np.ndarray:
    """Each cell's group index: one per distinct value, or ``MAX_LEVELS`` bins of the
    values by rank where there are more."""
    uniq, g = np.unique(values, return_inverse=True)
    g = g.reshape(-1)
    if len(uniq) > MAX_LEVELS:
        g = (g * MAX_LEVELS) // len(uniq)
    return g


class Design:
    """One-hot columns of several groupings of the cells, side by side: ``sums(y)`` is
    X'y for maps y (rows), dense or sparse by size; ``cols(y_sums)`` puts column values
    back on the cells."""

    def __init__(self, groups: list[np.ndarray], device) -> None:
        self.sizes = [int(g.max()) + 1 for g in groups]
        offsets = np.cumsum([0] + self.sizes[:-1])
        n_cells = len(groups[0])
        rows = np.concatenate([np.arange(n_cells)] * len(groups))
        cols = np.concatenate([g + o for g, o in zip(groups, offsets, strict=True)])
        self.width = int(sum(self.sizes))
        self.dense = n_cells * self.width <= DENSE_LIMIT
        if self.dense:
            x = torch.zeros(n_cells, self.width, dtype=torch.float64, device=device)
            x[torch.as_tensor(rows, device=device), torch.as_tensor(cols, device=device)] = 1
            self.x = x
        else:
            idx = torch.as_tensor(np.stack([cols, rows]), device=device)
            self.xt = torch.sparse_coo_tensor(
                idx, torch.ones(len(rows), dtype=torch.float64, device=device),
                (self.width, n_cells)).coalesce()
        xtx = np.zeros((self.width, self.width))
        for gi, oi in zip(groups, offsets, strict=True):
            for gj, oj in zip(groups, offsets, strict=True):
                np.add.at(xtx, (gi + oi, gj + oj), 1.0)
        self.xtx = xtx

    def sums(self, y: torch.Tensor) -> torch.Tensor:
        """(n, width) X'y of each map."""
        if self.dense:
            return y @ self.x
        return torch.sparse.mm(self.xt, y.T).T

    def on_cells(self, c: torch.Tensor, upto: int) -> torch.Tensor:
        """(n, cells) X c with the first ``upto`` columns (the coefficients' fit)."""
        if self.dense:
            return c[:, :upto] @ self.x[:, :upto].T
        head = torch.sparse.mm(self.xt, torch.eye(self.width, upto, dtype=torch.float64,
                                                  device=c.device)).T  # dense (upto, cells)
        return c[:, :upto] @ head


def layout(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each cell's token layout: the digit counts of op1 and op2 together (how the prompt
    is written: on a digit-level tokenizer, its token count and positions)."""
    return digit_count(np.abs(np.asarray(a))) * 100 + digit_count(np.abs(np.asarray(b)))


def operand_groups(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """The nuisance the rule keeps: op1's value, op2's value and the prompt's layout
    (their digit counts together: "both operands have two digits" is a fact of the
    format, not of the result)."""
    return [np.unique(x, return_inverse=True)[1].reshape(-1)
            for x in (np.asarray(a), np.asarray(b), layout(a, b))]


@dataclass
class AdditiveOperands:
    """f(op1) + g(op2) + h(layout) fit to maps on one operator's cells, exactly (normal
    equations with the pseudo-inverse of X'X, X the one-hot designs side by side): both
    operands' main effects and the prompt's token layout (``operand_groups``)."""

    design: Design
    pinv: torch.Tensor  # (width, width) float64
    n_operands: int  # every column (op1's values, op2's, the layouts)
    rank: int  # dimension of the space (constant included)

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray, device: str | torch.device = "cpu"
           ) -> AdditiveOperands:
        groups = operand_groups(a, b)
        design = Design(groups, device)
        n_op = design.width
        rank = int(np.linalg.matrix_rank(design.xtx, hermitian=True))
        pinv = np.linalg.pinv(design.xtx, hermitian=True)
        return cls(design, torch.as_tensor(pinv, device=device), n_op, rank)

    def fitted(self, maps: torch.Tensor) -> torch.Tensor:
        """(n, cells) float64: each map's least-squares f(op1) + g(op2)."""
        y = maps.double()
        c = self.design.sums(y) @ self.pinv.to(y.device)
        return self.design.on_cells(c, self.n_operands)


def _adjusted(rss: torch.Tensor, tss: torch.Tensor, n: int, p: int) -> torch.Tensor:
    """Adjusted R^2 of a fit with p parameters beyond the constant (NaN where the fit has
    no degrees of freedom left, or the map is constant)."""
    if n - p - 1 <= 0:
        return torch.full_like(rss, float("nan"))
    out = 1.0 - (rss / tss.clamp(min=1e-300)) * (n - 1) / (n - p - 1)
    return torch.where(tss > 0, out, torch.full_like(out, float("nan")))


@dataclass
class Explanations:
    """Adjusted R^2 of each competing explanation of some maps (rows): ``operands``
    (f(op1) + g(op2)), ``result`` (one mean per value of this operator's result),
    ``joint`` (both), ``other`` (the best other operator's result with the operands) and
    ``other_op`` (which operator; '' where none was fit). NaN for constant maps."""

    operands: np.ndarray
    result: np.ndarray
    joint: np.ndarray
    other: np.ndarray
    other_op: np.ndarray  # str, one character or ''

    @property
    def own_result_fits_best(self) -> np.ndarray:
        """True where no other operator's result explains the map (with the operands) by
        more than ``OTHER_MARGIN`` of its variance beyond this operator's: on small grids
        the results of two operators can describe one set almost equally (the corner of
        [0, 30)^2 is both "a + b >= 40" and "a * b large"), and a tie is not evidence."""
        other = np.nan_to_num(self.other, nan=-np.inf)
        return np.nan_to_num(self.joint, nan=-np.inf) + OTHER_MARGIN >= other

    @classmethod
    def empty(cls, n: int = 0) -> Explanations:
        nan = np.full(n, np.nan)
        return cls(nan, nan.copy(), nan.copy(), nan.copy(), np.full(n, "", dtype="<U1"))


@dataclass
class _Model:
    """One explanation as a linear model: its design, the pseudo-inverse of its normal
    equations and its parameters beyond the constant."""

    design: Design
    pinv: torch.Tensor
    params: int

    @classmethod
    def of(cls, groups: list[np.ndarray], device) -> _Model:
        design = Design(groups, device)
        rank = int(np.linalg.matrix_rank(design.xtx, hermitian=True))
        return cls(design, torch.as_tensor(np.linalg.pinv(design.xtx, hermitian=True),
                                           device=device), rank - 1)

    def explained(self, y: torch.Tensor) -> torch.Tensor:
        """The sum of squares the model's least-squares fit explains of each map (y
        centred): s' (X'X)^+ s for s = X'y, no fit put back on the cells."""
        s = self.design.sums(y)
        return ((s @ self.pinv) * s).sum(1)


@dataclass
class OperandFit:
    """What one operator's grid needs for the rule: its additive fit and the competing
    explanations' models."""

    op: str
    additive: AdditiveOperands
    models: dict[str, _Model]  # "operands", "result", and "joint:" + each operator
    n_cells: int
    cells: tuple[np.ndarray, np.ndarray, np.ndarray]  # op1, op2, result of each cell
    # the cell sets of the heuristics tested so far (rows of a bool array) and their keys
    sets: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    _set_of: dict[str, int] = field(default_factory=dict)

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
           device: str | torch.device | None = "cpu") -> OperandFit:
        device = "cpu" if device is None else device
        a, b, result = np.asarray(a), np.asarray(b), np.asarray(result)
        add = AdditiveOperands.of(a, b, device)
        groups = operand_groups(a, b)
        models = {"operands": _Model.of(groups, device),
                  "result": _Model.of([_levels(result)], device)}
        for o in OPERATORS:
            values = result if o == op else other_result(o, a, b)
            models["joint:" + o] = _Model.of([*groups, _levels(values)], device)
        return cls(op, add, models, len(a), (a, b, result))

    def explain(self, maps: torch.Tensor) -> Explanations:
        """The adjusted R^2 of every explanation of each map."""
        n = len(maps)
        out = Explanations.empty(n)
        if not n:
            return out
        keys = ["operands", "result"] + ["joint:" + o for o in OPERATORS]
        cols: dict[str, list] = {k: [] for k in keys}
        for s in range(0, n, BLOCK):
            y = maps[s:s + BLOCK].double()
            y = y - y.mean(1, keepdim=True)
            tss = (y * y).sum(1)
            for k in keys:
                model = self.models[k]
                rss = (tss - model.explained(y)).clamp(min=0)
                cols[k].append(_adjusted(rss, tss, self.n_cells, model.params))
        adj = {k: torch.cat(v).cpu().numpy() for k, v in cols.items()}
        out.operands, out.result = adj["operands"], adj["result"]
        out.joint = adj["joint:" + self.op]
        others = [o for o in OPERATORS if o != self.op]
        stack = np.stack([np.nan_to_num(adj["joint:" + o], nan=-np.inf) for o in others])
        which = stack.argmax(0)
        best = stack[which, np.arange(n)]
        out.other = np.where(np.isinf(best), np.nan, best)
        out.other_op = np.array(others)[which].astype("<U1")
        return out


def beyond_p_values(fit: OperandFit, maps: torch.Tensor, neuron: np.ndarray,
                    members: np.ndarray, bottom: np.ndarray, two_sided: bool = False
                    ) -> np.ndarray:
    """One-sided p-value of each row (``neuron``: index into ``maps``; ``members``: index
    into the cell sets of ``fit.sets``; ``bottom``: the set sits at the map's bottom) for
    "the set explains the map beyond f(op1) + g(op2)": the partial regression of the map
    on the set's indicator with both operands' main effects in the model. Both the classic
    t-test (Student's t, N - rank - 1 degrees of freedom) and the heteroscedasticity-
    robust one (HC0, normal tail) are computed and the larger p-value is kept: maps whose
    spread differs from cell to cell (sparse activations) cannot pass on the classic
    test's variance alone. ``two_sided``: either direction (the K map of a result
    label, whose sign on the set depends on the sign of the lens). Every product is a
    matrix product over the rows' maps and sets."""
    from scipy import stats

    out = np.ones(len(neuron))
    if not len(neuron):
        return out
    add = fit.additive
    df = max(fit.n_cells - add.rank - 1, 1)
    uniq_s, s_of = np.unique(members, return_inverse=True)
    dev = maps.device
    sets = torch.as_tensor(fit.sets[uniq_s], dtype=torch.float64, device=dev)
    r_s = sets - add.fitted(sets)  # (sets, cells)
    ss_s = (r_s * r_s).sum(1)
    s2, s3, s4 = r_s ** 2, r_s ** 3, (r_s ** 4).sum(1)
    sign = np.where(bottom, -1.0, 1.0)
    uniq_n, n_of = np.unique(neuron, return_inverse=True)
    for start in range(0, len(uniq_n), BLOCK):
        stop = min(start + BLOCK, len(uniq_n))
        rows = np.nonzero((n_of >= start) & (n_of < stop))[0]
        y = maps.index_select(0, torch.as_tensor(uniq_n[start:stop], device=dev)).double()
        r_y = y - add.fitted(y)
        ss_y = (r_y * r_y).sum(1)
        dot_all, y2s2, ys3 = r_y @ r_s.T, (r_y ** 2) @ s2.T, r_y @ s3.T
        ni = torch.as_tensor(n_of[rows] - start, device=dev)
        si = torch.as_tensor(s_of[rows], device=dev)
        dot, sss = dot_all[ni, si], ss_s[si]
        beta = dot / sss.clamp(min=1e-300)
        rss = (ss_y[ni] - dot * beta).clamp(min=0)
        t = dot / torch.sqrt(rss / df * sss).clamp(min=1e-300)
        # HC0: sum over cells of rs^2 e^2, e = ry - beta rs, expanded into the products
        hc = (y2s2[ni, si] - 2 * beta * ys3[ni, si] + beta ** 2 * s4[si]).clamp(min=0)
        z = dot / torch.sqrt(hc).clamp(min=1e-300)
        if two_sided:
            p = np.maximum(2 * stats.t.sf(np.abs(t.cpu().numpy()), df),
                           2 * stats.norm.sf(np.abs(z.cpu().numpy())))
        else:
            sg = torch.as_tensor(sign[rows], dtype=torch.float64, device=dev)
            p = np.maximum(stats.t.sf((sg * t).cpu().numpy(), df),
                           stats.norm.sf((sg * z).cpu().numpy()))
        p[(sss <= 1e-12).cpu().numpy()] = 1.0  # the set is additive itself: nothing beyond
        out[rows] = p
    return out


def gate(m, fit: OperandFit, kv: torch.Tensor, k_map: torch.Tensor, reach: float):
    """The result labels of one operator's rows ``m`` (neuron indices into the maps) that
    stand beyond the operands: each result row the value rule labels has its p-value
    raised to its tests beyond f(op1) + g(op2) on the KV map (one-sided, the side scored)
    and on the K map (two-sided: the activation must carry the set, not only the lens;
    ``beyond_p_values``), and
    keeps its label only where that p-value is at most ``reach`` (the corrected level) and
    this operator's result explains the KV map at least as well as every other operator's
    result does (``Explanations.own_result_fits_best``). Returns the rows, the indices of
    the maps that the value rule labelled (before this gate) and their explanations on the
    K and KV maps."""
    result_row = np.array([h.target == "result" and h.family != "multi_result"
                           for h in m.heuristics] or [False], dtype=bool)[m.heuristic]
    rows = np.nonzero(result_row & m.implements)[0]
    # every map the value rule labels gets its explanations, kept or not: they say why
    labelled = np.unique(m.neuron[m.implements])
    if len(rows):
        members = fit.set_index([m.heuristics[i] for i in m.heuristic[rows]])
        # the activation itself must carry the set beyond both operands: a KV map that is
        # an additive activation times the neuron's lens has result structure from the
        # lens alone (the neuron pushes some answer digits whatever the prompt's result)
        p = np.fmax(beyond_p_values(fit, kv, m.neuron[rows], members, m.bottom[rows]),
                    beyond_p_values(fit, k_map, m.neuron[rows], members, m.bottom[rows],
                                    two_sided=True))
        m.p_value[rows] = np.fmax(m.p_value[rows], p)
        m.implements[rows] &= p <= reach
    idx = torch.as_tensor(labelled, device=kv.device, dtype=torch.long)
    ex_kv = fit.explain(kv.index_select(0, idx)) if len(labelled) else Explanations.empty()
    ex_k = fit.explain(k_map.index_select(0, idx)) if len(labelled) else Explanations.empty()
    if len(labelled):
        loses = labelled[~ex_kv.own_result_fits_best]
        m.implements = m.implements & ~(result_row & np.isin(m.neuron, loses))
    return m, labelled, ex_k, ex_kv


# ------------------------------------------------------------------ the token-format control

FORMAT_KINDS = ("operands", "layout", "answer")


def number_format(values: np.ndarray, token_count=None) -> np.ndarray:
    """(cells, 3) how a number is written: its digit count, its first digit, its token
    count (``token_count``: value -> tokens; the digit count where not given)."""
    v = np.abs(np.asarray(values, dtype=np.int64))
    digits = np.where(v == 0, 1, np.floor(np.log10(np.maximum(v, 1))).astype(np.int64) + 1)
    first = v // 10 ** (digits - 1)
    tokens = digits if token_count is None else np.array([token_count(int(x)) for x in v])
    return np.stack([digits, first, tokens], axis=1)


def format_maps(kind: str, a: np.ndarray, b: np.ndarray, result: np.ndarray, n: int,
                gen: np.random.Generator, token_count=None, noise: float = 0.1) -> np.ndarray:
    """(n, cells) float32 maps that know only how the numbers are written, plus a little
    noise: ``operands``, a random function of op1's format plus one of op2's (digit count,
    first digit, token count: additive across the operands, as a token-count feature
    is); ``layout``, a random function of both operands' digit and token counts together
    ("both operands have two digits"); ``answer``, a random function of the answer's
    digit and token counts."""
    if kind == "operands":
        parts = [number_format(a, token_count), number_format(b, token_count)]
    elif kind == "layout":  # both operands' formats together: the prompt as written
        parts = [np.concatenate([number_format(a, token_count)[:, [0, 2]],
                                 number_format(b, token_count)[:, [0, 2]]], axis=1)]
    elif kind == "answer":
        f = number_format(result, token_count)
        parts = [f[:, [0, 2]]]
    else:
        raise ValueError(f"unknown format kind {kind!r}; known: {', '.join(FORMAT_KINDS)}")
    out = noise * gen.standard_normal((n, len(a)))
    for feats in parts:
        _, inv = np.unique(feats, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        out += gen.standard_normal((n, int(inv.max()) + 1))[:, inv]
    return out.astype(np.float32)
