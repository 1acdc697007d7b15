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
  the best other operator's result with the operands (fit by backfitting). A result
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

from catalog.arith import OPERATORS
from catalog.tails import digit_count

# backfitting steps for the joint fits (descriptive R^2; each step can only raise it)
BACKFIT_STEPS = 12
# neurons per block of the projections (a block of float64 maps on a [0, 300) grid is
# block x 90,000 x 8 bytes)
BLOCK = 256


def other_result(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Operator ``op``'s result on cells that may not be valid for it (division by zero is
    a value of its own, -1; negative differences are values like any other)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return np.where(b > 0, a // np.maximum(b, 1), -1)
    raise ValueError(f"unknown operator {op!r}")


@dataclass
class AdditiveOperands:
    """f(op1) + g(op2) fit to maps on one operator's cells, exactly (normal equations
    with the pseudo-inverse of X'X, X the two one-hot designs side by side). With ``keep``
    (a group per cell: the result's digit-count strata), the fit is joint with a mean per
    group and ``fitted`` returns the operands' part alone: what the operands explain
    beyond what the kept structure explains, so removing it leaves that structure whole."""

    g1: torch.Tensor  # (cells,) index of each cell's op1 value
    g2: torch.Tensor
    n1: int
    n2: int
    pinv: torch.Tensor  # (n1 + n2 [+ groups kept], same) float64
    rank: int  # dimension of the additive space (constant included)
    gk: torch.Tensor | None = None  # (cells,) the kept group of each cell
    nk: int = 0

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray, device: str | torch.device = "cpu",
           keep: np.ndarray | None = None) -> AdditiveOperands:
        _, g1 = np.unique(a, return_inverse=True)
        _, g2 = np.unique(b, return_inverse=True)
        g1, g2 = g1.reshape(-1), g2.reshape(-1)
        n1, n2 = int(g1.max()) + 1, int(g2.max()) + 1
        cols = [g1, n1 + g2]
        nk = 0
        if keep is not None:
            _, gk = np.unique(keep, return_inverse=True)
            gk = gk.reshape(-1)
            nk = int(gk.max()) + 1
            cols.append(n1 + n2 + gk)
        size = n1 + n2 + nk
        xtx = np.zeros((size, size))
        for ci in cols:
            for cj in cols:
                np.add.at(xtx, (ci, cj), 1.0)
        pinv = np.linalg.pinv(xtx, hermitian=True)
        rank = int(np.linalg.matrix_rank(xtx[:n1 + n2, :n1 + n2], hermitian=True))
        return cls(torch.as_tensor(g1, device=device), torch.as_tensor(g2, device=device),
                   n1, n2, torch.as_tensor(pinv, device=device), rank,
                   None if keep is None else torch.as_tensor(gk, device=device), nk)

    def fitted(self, maps: torch.Tensor) -> torch.Tensor:
        """(n, cells) float64: each map's least-squares f(op1) + g(op2) (the operands' part
        of the joint fit, where groups are kept)."""
        y = maps.double()
        parts = [y.new_zeros(len(y), self.n1).index_add_(1, self.g1, y),
                 y.new_zeros(len(y), self.n2).index_add_(1, self.g2, y)]
        if self.gk is not None:
            parts.append(y.new_zeros(len(y), self.nk).index_add_(1, self.gk, y))
        c = torch.cat(parts, dim=1) @ self.pinv.to(y.device)
        return (c[:, :self.n1].index_select(1, self.g1)
                + c[:, self.n1:self.n1 + self.n2].index_select(1, self.g2))


def beyond_operands(fit: AdditiveOperands, maps: torch.Tensor) -> torch.Tensor:
    """The maps less their operands' fit, in the maps' dtype, block by block."""
    out = torch.empty_like(maps)
    for s in range(0, len(maps), BLOCK):
        y = maps[s:s + BLOCK]
        out[s:s + BLOCK] = (y.double() - fit.fitted(y)).to(maps.dtype)
    return out


def _group_fit(y: torch.Tensor, g: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each map's mean per group, put back on the cells."""
    sums = y.new_zeros(len(y), len(counts)).index_add_(1, g, y)
    return (sums / counts.clamp(min=1)).index_select(1, g)


def _adjusted(rss: torch.Tensor, tss: torch.Tensor, n: int, p: int) -> torch.Tensor:
    """Adjusted R^2 of a fit with p parameters beyond the constant (NaN where the fit has
    no degrees of freedom left)."""
    if n - p - 1 <= 0:
        return torch.full_like(rss, float("nan"))
    return 1.0 - (rss / tss.clamp(min=1e-300)) * (n - 1) / (n - p - 1)


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
        """True where this operator's result explains the map (with the operands) at least
        as well as every other operator's result does."""
        other = np.nan_to_num(self.other, nan=-np.inf)
        return np.nan_to_num(self.joint, nan=-np.inf) >= other

    @classmethod
    def empty(cls, n: int = 0) -> Explanations:
        nan = np.full(n, np.nan)
        return cls(nan, nan.copy(), nan.copy(), nan.copy(), np.full(n, "", dtype="<U1"))


@dataclass
class OperandFit:
    """What one operator's grid needs for the rule: its additive fit, and a factor per
    operator's result on its cells."""

    op: str
    additive: AdditiveOperands
    scoring: AdditiveOperands  # the operands' part beside the result's digit strata
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]  # op -> (group, counts)
    n_cells: int
    cells: tuple[np.ndarray, np.ndarray, np.ndarray]  # op1, op2, result of each cell
    _dof: dict[str, int] = field(default_factory=dict)
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
           device: str | torch.device | None = "cpu", strata: str = "digits"
           ) -> OperandFit:
        device = "cpu" if device is None else device
        add = AdditiveOperands.of(a, b, device)
        kept = digit_count(np.abs(np.asarray(result))) if strata == "digits" else None
        scoring = AdditiveOperands.of(a, b, device, keep=kept) if kept is not None else add
        factors, dof = {}, {}
        for o in OPERATORS:
            values = np.asarray(result) if o == op else other_result(o, a, b)
            _, g = np.unique(values, return_inverse=True)
            counts = np.bincount(g).astype(np.float64)
            factors[o] = (torch.as_tensor(g, device=device), torch.as_tensor(counts,
                                                                             device=device))
            # the factor's functions that are already additive: a line in the result of
            # + and - (a + b, a - b); for * and / only the constant
            overlap = 1 if o in "+-" and len(counts) > 2 else 0
            dof[o] = len(counts) - 1 - overlap
        return cls(op, add, scoring, factors, len(a), (np.asarray(a), np.asarray(b),
                                              np.asarray(result)), dof)

    def explain(self, maps: torch.Tensor) -> Explanations:
        """The adjusted R^2 of every explanation of each map."""
        n = len(maps)
        out = Explanations.empty(n)
        if not n:
            return out
        cols: dict[str, list] = {"operands": [], "result": [], "joint": [], "other": [],
                                 "other_op": []}
        p_add = self.additive.rank - 1
        for s in range(0, n, BLOCK):
            y = maps[s:s + BLOCK].double()
            y = y - y.mean(1, keepdim=True)
            tss = (y * y).sum(1)
            fa = self.additive.fitted(y)
            cols["operands"].append(_adjusted(((y - fa) ** 2).sum(1), tss, self.n_cells, p_add))
            g, c = self.factors[self.op]
            fr = _group_fit(y, g, c)
            cols["result"].append(_adjusted(((y - fr) ** 2).sum(1), tss, self.n_cells,
                                            len(c) - 1))
            joint = {}
            for o in self.factors:
                joint[o] = _adjusted(self._joint_rss(y, fa, o), tss, self.n_cells,
                                     p_add + self._dof[o])
            cols["joint"].append(joint[self.op])
            others = [o for o in self.factors if o != self.op]
            if others:
                stack = torch.stack([torch.nan_to_num(joint[o], nan=-torch.inf)
                                     for o in others])
                best, which = stack.max(0)
                cols["other"].append(torch.where(torch.isinf(best), torch.nan, best))
                cols["other_op"].append(np.array(others)[which.cpu().numpy()])
            else:
                cols["other"].append(torch.full_like(tss, torch.nan))
                cols["other_op"].append(np.full(len(tss), ""))
        for key in ("operands", "result", "joint", "other"):
            setattr(out, key, torch.cat(cols[key]).cpu().numpy())
        out.other_op = np.concatenate(cols["other_op"]).astype("<U1")
        return out

    def _joint_rss(self, y: torch.Tensor, fa: torch.Tensor, o: str) -> torch.Tensor:
        """Residual sum of squares of f(op1) + g(op2) + h(result of o), by backfitting from
        the additive fit ``fa`` (each step is a projection, so the residual only falls)."""
        g, c = self.factors[o]
        add = fa
        fo = _group_fit(y - add, g, c)
        for _ in range(BACKFIT_STEPS - 1):
            add = self.additive.fitted(y - fo)
            fo = _group_fit(y - add, g, c)
        r = y - add - fo
        return (r * r).sum(1)


def beyond_p_values(fit: OperandFit, maps: torch.Tensor, neuron: np.ndarray,
                    members: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """One-sided p-value of each row (``neuron``: index into ``maps``; ``members``: index
    into the cell sets of ``fit.sets``; ``bottom``: the set sits at the map's bottom) for
    "the set explains the map beyond f(op1) + g(op2)": the partial regression of the map
    on the set's indicator with both operands' main effects in the model. Both the classic
    t-test (Student's t, N - rank - 1 degrees of freedom) and the heteroscedasticity-
    robust one (HC0, normal tail) are computed and the larger p-value is kept: maps whose
    spread differs from cell to cell (sparse activations) cannot pass on the classic
    test's variance alone."""
    from scipy import stats

    out = np.ones(len(neuron))
    if not len(neuron):
        return out
    add = fit.additive
    df = max(fit.n_cells - add.rank - 1, 1)
    uniq_n, n_of = np.unique(neuron, return_inverse=True)
    uniq_s, s_of = np.unique(members, return_inverse=True)
    dev = maps.device
    sets = torch.as_tensor(fit.sets[uniq_s], dtype=torch.float64, device=dev)
    r_s = sets - add.fitted(sets)
    ss_s = (r_s * r_s).sum(1)
    sign = np.where(bottom, -1.0, 1.0)
    for start in range(0, len(uniq_n), BLOCK):
        block = np.arange(start, min(start + BLOCK, len(uniq_n)))
        y = maps.index_select(0, torch.as_tensor(uniq_n[block], device=dev)).double()
        r_y = y - add.fitted(y)
        ss_y = (r_y * r_y).sum(1)
        rows = np.nonzero((n_of >= block[0]) & (n_of <= block[-1]))[0]
        for u in np.unique(s_of[rows]):
            sel = rows[s_of[rows] == u]
            ry = r_y[torch.as_tensor(n_of[sel] - block[0], device=dev)]
            rs = r_s[u]
            if float(ss_s[u]) <= 1e-12:  # the set is additive itself: nothing beyond
                continue
            dot = ry @ rs
            beta = dot / ss_s[u]
            rss = (ss_y[torch.as_tensor(n_of[sel] - block[0], device=dev)]
                   - dot * beta).clamp(min=0)
            t = dot / torch.sqrt(rss / df * ss_s[u]).clamp(min=1e-300)
            e = ry - beta[:, None] * rs[None]
            hc = torch.sqrt(((rs * rs)[None] * e * e).sum(1)).clamp(min=1e-300)
            z = dot / hc
            sg = torch.as_tensor(sign[sel], dtype=torch.float64, device=dev)
            p_t = stats.t.sf((sg * t).cpu().numpy(), df)
            p_z = stats.norm.sf((sg * z).cpu().numpy())
            out[sel] = np.maximum(p_t, p_z)
    return out


def gate(m, fit: OperandFit, kv: torch.Tensor, k_map: torch.Tensor, reach: float):
    """The result labels of one operator's rows ``m`` (neuron indices into the maps) that
    stand beyond the operands: each stored result row's p-value is raised to its test
    beyond f(op1) + g(op2) on the KV map (``beyond_p_values``), and a result label is kept
    only where that p-value is at most ``reach`` (the corrected level) and this operator's
    result explains the KV map at least as well as every other operator's result does
    (``Explanations.own_result_fits_best``). Returns the rows, the indices of the maps
    that the value rule labelled (before this gate) and their explanations on the K and KV
    maps."""
    result_row = np.array([h.target == "result" and h.family != "multi_result"
                           for h in m.heuristics] or [False], dtype=bool)[m.heuristic]
    rows = np.nonzero(result_row)[0]
    # every map the value rule labels gets its explanations, kept or not: they say why
    labelled = np.unique(m.neuron[m.implements])
    if len(rows):
        members = fit.set_index([m.heuristics[i] for i in m.heuristic[rows]])
        p = beyond_p_values(fit, kv, m.neuron[rows], members, m.bottom[rows])
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

FORMAT_KINDS = ("operands", "answer")


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
    is); ``answer``, a random function of the answer's digit and token counts."""
    if kind == "operands":
        parts = [number_format(a, token_count), number_format(b, token_count)]
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
