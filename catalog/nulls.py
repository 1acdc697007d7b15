"""The value-permutation null: does a neuron's map single out the heuristic's VALUES?
(docs/method.md section 7, "The label rule").

The cell null (``catalog.significance``) asks whether a map's top cells fall on S_H more
often than on a random set of as many cells. Real maps are never cell-wise random: a
neuron that depends on op1 in an arbitrary way is constant along rows, and its top cells
are whole rows that some residue class or digit pattern always contains. The value null
asks the question the paper's claim needs: would the heuristic look as good if the
operand (or result) VALUES were relabelled at random? It keeps the map whole and
permutes which value each row, column or result class stands for.

**The statistic.** A heuristic on one number x (op1, op2 or the result) is a set V of
values. For k = |S_H| (K for pattern counting), the map's top-k cells (ties shared fairly,
as in scoring) give each value g a share s_g, the fraction of its cells among them. The
m = |V| values of highest share (extended through ties at the m-th) form U, and the
statistic is X = |V ∩ U|: Algorithm 1 again, one level up, on values instead of cells.
Shares, not counts, rank the values, so a value with more cells (a long diagonal of the
result, a long row of ``-``) does not rise by its size when the map is a function of x.

**The null and its exact tail.** Values are exchangeable within strata: by default
values of the same digit count (one-digit against two-digit operands is a tokenisation
fact, not arithmetic), and on grids where values own different numbers of cells also of
the same size class (a factor of two), which keeps the share's noise comparable. Under
that null V ∩ stratum is a uniform random subset of the stratum, so X is a sum of
independent hypergeometric counts, one per stratum; its upper tail is exact
(``value_tail``, checked against brute-force enumeration and Monte Carlo).

**Both operands** (S_H = V_a x V_b: ranges and residues of both operands): the row test
(op1 values, shares of rows) and the column test depend on independent permutations, so
their p-values are independent under the null and combined by Fisher's method
(p = u (1 - ln u), u their product), which stays valid for discrete p-values.
**op1 = op2** is no product set: its p-value is Monte Carlo over permutations of rows
and columns within strata (``identical_p``), with a fixed seed and enough permutations
to reach the corrected level. **Multi-result** sets are picked as the values that cover
the top cells, a choice that any relabelling reproduces: under this null their p-value
is 1. Single values (``op1 = 7``) are tested like any set of one value: the smallest
p-value they can reach is 1 / (values in the stratum), so they are labelled only where
that beats the correction, which a grid of 300 values cannot reach.

**The other numbers held fixed** (``within_class_tail``). A map that is a function of the
result has operand structure only through the result (on `+`, big sums live in big-op1
rows); one that is a function of op1 has result structure only through op1. So an operand
heuristic must also beat the map shuffled within each result, and a result heuristic the
map shuffled within each op1 row and within each op2 column; those tails are bounded
(Hoeffding, Bernstein, Chernoff). A row's p-value is the largest of its tests (an
intersection-union test, valid under each null), corrected per neuron by Tarone's
refinement of Bonferroni (``tarone``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import lgamma

import numpy as np
import torch

from catalog.heuristics import Cells, Heuristic

STRATA = ("digits", "none")
SINGLE_TARGETS = ("op1", "op2", "result")


def digit_count(x: np.ndarray) -> np.ndarray:
    """Decimal digits of non-negative integers (0 has one)."""
    x = np.asarray(x, dtype=np.int64)
    out = np.ones(x.shape, dtype=np.int64)
    for p in range(1, 19):
        out += x >= 10 ** p
    return out


@dataclass(frozen=True)
class ValueGroups:
    """One operator's cells grouped by one number (op1, op2 or the result).

    group: (cells,) index of each cell's value in ``values``; size: cells per value;
    stratum: (values,) id of the stratum each value is permuted within."""

    target: str
    values: np.ndarray
    group: np.ndarray
    size: np.ndarray
    stratum: np.ndarray

    @classmethod
    def of(cls, cells: Cells, target: str, strata: str = "digits") -> ValueGroups:
        if strata not in STRATA:
            raise ValueError(f"null strata must be one of {STRATA}, got {strata!r}")
        values, group, size = np.unique(cells.values(target), return_inverse=True,
                                        return_counts=True)
        digits = digit_count(values) if strata == "digits" else np.zeros_like(values)
        _, stratum = np.unique(digits, return_inverse=True)
        return cls(target, values, group.astype(np.int64), size.astype(np.int64),
                   stratum.astype(np.int64))

    @property
    def n_strata(self) -> int:
        return int(self.stratum.max()) + 1

    def stratum_sizes(self) -> np.ndarray:
        return np.bincount(self.stratum, minlength=self.n_strata)

    def members(self, h: Heuristic) -> np.ndarray:
        """(values,) bool: the values of this number that h's set is made of (for a
        heuristic of both operands, its condition on one of them)."""
        v = self.values
        if h.family == "multi_result":
            return np.isin(v, np.array(h.params))
        probe = Heuristic(h.family, "op1", h.params) if h.target in ("op1", "op2", "both",
                                                                      "result") else h
        return probe.contains(v, v, v)


def _log_comb(a: int, b: int) -> float:
    return lgamma(a + 1) - lgamma(b + 1) - lgamma(a - b + 1)


def _hyper_pmf(n: int, u: int, m: int) -> np.ndarray:
    """P(X = x), x = 0..m: overlap of a fixed m-subset with a random u-subset of n."""
    out = np.zeros(m + 1)
    for x in range(max(0, m - (n - u)), min(m, u) + 1):
        out[x] = np.exp(_log_comb(u, x) + _log_comb(n - u, m - x) - _log_comb(n, m))
    return out


@lru_cache(maxsize=65536)
def value_tail(strata: tuple[tuple[int, int, int], ...]) -> np.ndarray:
    """P(X >= x), x = 0..sum m_s, for X the sum over strata (n_s values, u_s of them in
    the neuron's top set, m_s in the heuristic's) of independent hypergeometric
    overlaps. Read-only; cached (the same layouts recur across neurons)."""
    pmf = np.ones(1)
    for n, u, m in strata:
        if m == 0:
            continue
        pmf = np.convolve(pmf, _hyper_pmf(n, u, m))
    tail = np.minimum(np.cumsum(pmf[::-1])[::-1], 1.0)
    tail.flags.writeable = False
    return tail


def min_p(groups: ValueGroups, member: np.ndarray) -> float:
    """The smallest p-value a heuristic made of ``member`` values can reach (its whole set
    in the top set and nothing else there): what Tarone's correction counts."""
    n_s = groups.stratum_sizes()
    m_s = np.bincount(groups.stratum[member], minlength=len(n_s))
    layout = tuple((int(n), int(m), int(m)) for n, m in zip(n_s, m_s, strict=True))
    return float(value_tail(layout)[-1])


def fisher(p1: np.ndarray | float, p2: np.ndarray | float) -> np.ndarray:
    """Fisher's combination of two independent p-values: P(U1 U2 <= u) = u (1 - ln u)."""
    u = np.clip(np.asarray(p1, dtype=np.float64) * np.asarray(p2, dtype=np.float64),
                1e-300, 1.0)
    return np.minimum(1.0, u * (1.0 - np.log(u)))


def top_weights(maps: torch.Tensor, draws: int, kth: torch.Tensor | None = None) -> torch.Tensor:
    """(N, C) float64: 1 for each map's cells above its ``draws``-th largest value (``kth``,
    (N, 1), where known), the fair share (draws - #greater) / #tied for cells equal to it,
    0 below (catalog.matching)."""
    c = maps.shape[1]
    if kth is None:
        kth = torch.topk(maps, min(draws, c), dim=1).values[:, -1:]
    greater = (maps > kth).sum(1, keepdim=True)
    tied = (maps == kth).sum(1, keepdim=True)
    frac = (draws - greater).double() / tied.double()
    return torch.where(maps > kth, 1.0, torch.where(maps == kth, frac, 0.0)).double()


def set_p_values(share: torch.Tensor, member: np.ndarray, groups: ValueGroups) -> np.ndarray:
    """Exact p-value of X = |V ∩ U| per row: ``share`` (R, values) of each row's neuron,
    ``member`` (R, values) bool its heuristic's values V."""
    r = share.shape[0]
    if r == 0:
        return np.zeros(0)
    member_t = torch.as_tensor(member, device=share.device)
    m = member_t.sum(1)
    desc = torch.sort(share, dim=1, descending=True).values
    thr = desc.gather(1, (m - 1).clamp(min=0)[:, None])
    top = share >= thr
    x = (top & member_t).sum(1).cpu().numpy()
    n_strata = groups.n_strata
    onehot = torch.zeros(len(groups.values), n_strata, device=share.device)
    onehot[torch.arange(len(groups.values)), torch.as_tensor(groups.stratum)] = 1.0
    u_s = (top.float() @ onehot).long().cpu().numpy()
    m_s = (member_t.float() @ onehot).long().cpu().numpy()
    n_s = groups.stratum_sizes()
    # rows with the same layout share one tail: one convolution per distinct layout, the
    # layout (u_s, m_s of every stratum) and x packed into one integer per row
    base = len(groups.values) + 1
    code = np.zeros(r, dtype=np.int64)
    for col in np.concatenate([u_s, m_s], axis=1).T:
        code = code * base + col
    order = np.argsort(code, kind="stable")
    bounds = np.flatnonzero(np.r_[True, code[order][1:] != code[order][:-1], True])
    out = np.empty(r)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        rows = order[lo:hi]
        i = rows[0]
        tail = value_tail(tuple((int(n_s[t]), int(u_s[i, t]), int(m_s[i, t]))
                                for t in range(n_strata) if m_s[i, t]))
        out[rows] = tail[np.minimum(x[rows], len(tail) - 1)]
    out[m.cpu().numpy() == 0] = 1.0
    return out


# sequential Monte Carlo (Besag and Clifford 1991): a map stops drawing permutations once
# this many are at least as large as its own, with p-value STOP_AFTER / permutations drawn
STOP_AFTER = 10


def identical_p(weights: torch.Tensor, cells: Cells, rows: ValueGroups, cols: ValueGroups,
                permutations: int, seed: int) -> np.ndarray:
    """Monte Carlo p-value of op1 = op2 per map (``weights`` (N, C) from ``top_weights``):
    the top-cell weight on the diagonal against the weight on (pi(v), sigma(v)) for row and
    column permutations within strata, drawn in blocks. A map whose count of permutations
    at least as large reaches ``STOP_AFTER`` stops there with p = STOP_AFTER / drawn (valid,
    Besag and Clifford 1991: far from any label after a block or two); the others go on to
    ``permutations``, with p = (1 + #as large) / (1 + permutations)."""
    n = weights.shape[0]
    side_r, side_c = len(rows.values), len(cols.values)
    dense = torch.zeros(n, side_r * side_c, dtype=torch.float64, device=weights.device)
    flat = torch.as_tensor(rows.group * side_c + cols.group, device=weights.device)
    dense[:, flat] = weights
    common = np.intersect1d(rows.values, cols.values)
    ri = np.searchsorted(rows.values, common)
    ci = np.searchsorted(cols.values, common)
    observed = dense[:, torch.as_tensor(ri * side_c + ci)].sum(1)
    gen = np.random.default_rng(seed)
    exceed = torch.zeros(n, dtype=torch.long)
    drawn = torch.zeros(n, dtype=torch.long)
    active = torch.ones(n, dtype=torch.bool)
    for start in range(0, permutations, 1024):
        live = torch.nonzero(active)[:, 0]
        if not len(live):
            break
        b = min(1024, permutations - start)
        perm_r = _strata_permutations(rows.stratum, b, gen)[:, ri]
        perm_c = _strata_permutations(cols.stratum, b, gen)[:, ci]
        idx = torch.as_tensor(perm_r * side_c + perm_c).reshape(-1)  # (b x |common|)
        null = dense[live][:, idx].view(len(live), b, -1).sum(2)
        hit = null >= observed[live, None] - 1e-9
        # where a map reaches STOP_AFTER inside the block, it stops at that permutation
        cum = exceed[live, None] + torch.cumsum(hit.long(), dim=1)
        reached = cum >= STOP_AFTER
        stop_at = torch.where(reached.any(1), reached.float().argmax(1) + 1,
                              torch.full((len(live),), b))
        exceed[live] = torch.minimum(cum[:, -1], torch.full_like(cum[:, -1], STOP_AFTER))
        drawn[live] += stop_at
        active[live] = ~reached.any(1)
    stopped = ~active & (exceed >= STOP_AFTER)
    p = torch.where(stopped, exceed.double() / drawn.double(),
                    (1 + exceed.double()) / (1 + permutations))
    return p.clamp(max=1.0).cpu().numpy()


def _strata_permutations(stratum: np.ndarray, b: int, gen: np.random.Generator) -> np.ndarray:
    """(b, n) permutations of 0..n-1 that map each index within its stratum."""
    n = len(stratum)
    out = np.tile(np.arange(n), (b, 1))
    for s in np.unique(stratum):
        idx = np.nonzero(stratum == s)[0]
        out[:, idx] = idx[np.argsort(gen.random((b, len(idx))), axis=1)]
    return out


def relabelled(cells: Cells, strata: str, gen: np.random.Generator) -> Cells:
    """The same cells with op1, op2 and result values each permuted at random within the
    null's strata (``ValueGroups``): heuristics built on them are about values the maps
    never saw, so any label they get is a false one (the relabelled-values control)."""
    out = {}
    for t in SINGLE_TARGETS:
        g = ValueGroups.of(cells, t, strata)
        perm = _strata_permutations(g.stratum, 1, gen)[0]
        out[t] = g.values[perm][g.group]
    return Cells(cells.op, out["op1"], out["op2"], out["result"], cells.lo, cells.hi)


def tarone(min_ps: np.ndarray, level: float) -> int:
    """Tarone's refinement of Bonferroni: the smallest K with at most K tests able to reach
    level / K (a test whose smallest possible p-value is above it can never be rejected,
    so it need not be paid for). Labelling at p <= level / K keeps the family-wise error
    at most ``level``."""
    p = np.sort(np.asarray(min_ps, dtype=np.float64))
    for k in range(1, len(p) + 1):
        if int(np.searchsorted(p, level / k, side="right")) <= k:
            return k
    return max(len(p), 1)


@dataclass
class ValueNull:
    """The value null of one operator's grid: its value groups, and the draws (k, or K
    for pattern counting) of each heuristic scored on it."""

    cells: Cells
    groups: dict[str, ValueGroups]
    draws: dict[str, int]
    seed: int
    permutations: int  # Monte Carlo draws for op1 = op2
    _member: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, cells: Cells, partitions: list, strata: str, seed: int, pattern_top_k: int,
           n_tests: int, level: float) -> ValueNull:
        n_cells = len(cells.a)
        draws = {}
        for part in partitions:
            for h, k in zip(part.heuristics, part.sizes, strict=True):
                draws[h.key] = int(k) if part.scoring == "topk" else min(pattern_top_k, n_cells)
        # enough permutations that the Monte Carlo p-value can reach level / n_tests
        b = int(min(1_000_000, max(1_000, np.ceil(2 * n_tests / level))))
        return cls(cells, {t: ValueGroups.of(cells, t, strata) for t in SINGLE_TARGETS},
                   draws, seed, b)

    def member(self, h: Heuristic, target: str) -> np.ndarray:
        key = (h.key, target)
        if key not in self._member:
            self._member[key] = self.groups[target].members(h)
        return self._member[key]

    def min_p(self, h: Heuristic) -> float:
        """The smallest p-value heuristic h can get under this null (Tarone)."""
        if h.family == "multi_result":
            return 1.0
        if h.family == "identical":
            return 1.0 / (1 + self.permutations)
        if h.target == "both":
            return float(fisher(min_p(self.groups["op1"], self.member(h, "op1")),
                                min_p(self.groups["op2"], self.member(h, "op2"))))
        return min_p(self.groups[h.target], self.member(h, h.target))

    def p_values(self, k_map: torch.Tensor, kv_map: torch.Tensor, heuristics: list[Heuristic],
                 neuron: np.ndarray, heuristic: np.ndarray, bottom: np.ndarray,
                 score: np.ndarray, orders: dict | None = None,
                 threshold: float = 0.0, decide_at: float = 1.0) -> np.ndarray:
        """P-value of each row (neuron index into the maps, heuristic index into
        ``heuristics``, bottom-k or not, its score) under the value null: the value test's
        exact (for op1 = op2, Monte Carlo) p-value, raised to the conditional tests' bound
        where they decide a label: the value test at most ``decide_at`` (the corrected
        level) and the score at least ``threshold``. Elsewhere the row is not labelled
        whatever they say, and they could only raise its p-value. ``orders``: each side's
        descending sort order of every map, keyed (direct, bottom), where the scoring has
        them (``score_partitions``)."""
        out = np.ones(len(neuron))
        if not len(neuron):
            return out
        direct = np.array([h.direct for h in heuristics], dtype=bool)[heuristic]
        draws = np.array([self.draws.get(h.key, 0) for h in heuristics])[heuristic]
        side_key = direct.astype(np.int64) * 2 + bottom.astype(np.int64)
        pending: list[tuple] = []  # the conditional tests, computed together at the end
        for sk in np.unique(side_key[draws > 0]):
            is_direct, is_bottom = bool(sk // 2), bool(sk % 2)
            on_side = np.nonzero((side_key == sk) & (draws > 0))[0]
            neurons = np.unique(neuron[on_side])
            maps = (kv_map if is_direct else k_map)[torch.as_tensor(neurons)]
            maps = -maps if is_bottom else maps
            order = None
            if orders is not None and (is_direct, is_bottom) in orders:
                order = orders[(is_direct, is_bottom)][torch.as_tensor(neurons)]
            for d, rows, sums, dense in self._top_sums(maps, on_side, draws, order):
                pos = np.searchsorted(neurons, neuron[rows])
                hs = [heuristics[i] for i in heuristic[rows]]
                p = self._rows_p(sums, pos, hs, dense)
                near = np.nonzero((p <= decide_at) & (score[rows] >= threshold))[0]
                if len(near):
                    counts = score[rows[near]].astype(np.float64) * d
                    pending += self._conditional_p(sums, pos[near], [hs[i] for i in near],
                                                   counts, rows[near])
                out[rows] = p
        for t in {t for t, *_ in pending}:
            parts = [x for x in pending if x[0] == t]
            p = within_class_tail(torch.cat([x[2] for x in parts]),
                                  torch.cat([x[3] for x in parts]),
                                  torch.as_tensor(self.groups[t].size, dtype=torch.float64),
                                  torch.as_tensor(np.concatenate([x[4] for x in parts])))
            rows = np.concatenate([x[1] for x in parts])
            np.maximum.at(out, rows, p)
        return out

    def _top_sums(self, maps: torch.Tensor, rows: np.ndarray, draws: np.ndarray,
                  order: torch.Tensor | None = None):
        """For each draws value d of ``rows`` (ascending): (d, its rows, target -> (neurons,
        values) top-cell weight per value, a function giving the (neurons, cells) weights of
        some neurons). One walk down each map's sorted cells: the counts per value grow
        segment by segment, so each d costs a segment, not a pass over every cell. Maps
        whose d-th value is tied are recounted with the fair share of ties (``top_weights``)."""
        n, c = maps.shape
        if order is None:
            order = torch.from_numpy(np.argsort(-maps.cpu().numpy(), axis=1,
                                                kind="stable")).to(maps.device)
        vals = maps.gather(1, order)
        gid = {t: torch.as_tensor(g.group, device=maps.device) for t, g in self.groups.items()}
        hist = {t: torch.zeros(n, len(g.values), dtype=torch.float64, device=maps.device)
                for t, g in self.groups.items()}
        prev = 0
        for d in np.unique(draws[rows]).tolist():
            seg = order[:, prev:d]
            for t in hist:
                hist[t].scatter_add_(1, gid[t][seg], torch.ones(seg.shape, dtype=torch.float64,
                                                                device=maps.device))
            prev = d
            kth = vals[:, d - 1]
            tied = torch.zeros(n, dtype=torch.bool, device=maps.device)
            if d < c:
                tied |= vals[:, d] == kth
            if d > 1:
                tied |= vals[:, d - 2] == kth
            sums = hist
            if bool(tied.any()):
                idx = torch.nonzero(tied)[:, 0]
                w = top_weights(maps[idx], d, kth[idx, None])
                sums = {t: h.clone() for t, h in hist.items()}
                for t in sums:
                    fixed = torch.zeros(len(idx), sums[t].shape[1], dtype=torch.float64,
                                        device=maps.device).index_add_(1, gid[t], w)
                    sums[t][idx] = fixed

            def dense(pos: np.ndarray, _d: int = d) -> torch.Tensor:
                return top_weights(maps[torch.as_tensor(pos)], _d)
            yield d, rows[draws[rows] == d], sums, dense

    def class_counts(self, h: Heuristic, t: str) -> np.ndarray:
        """(values of t,) how many of h's cells have each value of number t."""
        key = (h.key, "classes", t)
        if key not in self._member:
            g = self.groups[t]
            self._member[key] = np.bincount(g.group[self.cell_member(h)],
                                            minlength=len(g.values)).astype(np.float64)
        return self._member[key]

    def cell_member(self, h: Heuristic) -> np.ndarray:
        key = (h.key, "cells")
        if key not in self._member:
            c = self.cells
            self._member[key] = h.contains(c.a, c.b, c.result)
        return self._member[key]

    def _conditional_p(self, sums: dict[str, torch.Tensor], pos: np.ndarray,
                       hs: list[Heuristic], counts: np.ndarray, rows: np.ndarray) -> list:
        """The other numbers held fixed: an operand heuristic must beat maps shuffled within
        each result (a function of the result has no operand structure of its own), a
        result heuristic maps shuffled within each op1 row and within each op2 column.
        ``counts``: each row's top-cell weight on its set (score x draws). The largest of
        these p-values and the value null's is the row's p-value (an intersection-union
        test, valid under each null). Returns the tests to compute, (number, rows, class
        weights, class counts, counts), for ``within_class_tail``."""
        out = []
        direct = np.array([h.direct for h in hs])
        multi = np.array([h.family == "multi_result" for h in hs])
        for conds, sel in ((("result",), ~direct & ~multi), (("op1", "op2"), direct & ~multi)):
            idx = np.nonzero(sel)[0]
            if not len(idx):
                continue
            keys = [id(hs[i]) for i in idx]  # rows share the heuristic objects of their list
            uniq = list(dict.fromkeys(keys))
            where = {k: j for j, k in enumerate(uniq)}
            first = {id(hs[i]): hs[i] for i in idx}
            h_of = torch.as_tensor([where[k] for k in keys])
            for t in conds:
                s_c = torch.as_tensor(np.stack([self.class_counts(first[k], t) for k in uniq]),
                                      device=sums[t].device)
                out.append((t, rows[idx], sums[t][torch.as_tensor(pos[idx])],
                            s_c[h_of.to(s_c.device)], counts[idx]))
        return out

    def _rows_p(self, sums: dict[str, torch.Tensor], pos: np.ndarray, hs: list[Heuristic],
                dense) -> np.ndarray:
        out = np.ones(len(hs))
        target = np.array([h.target if h.family != "identical" else "identical" for h in hs])
        fam = np.array([h.family for h in hs])

        def share_of(t: str) -> torch.Tensor:
            size = torch.as_tensor(self.groups[t].size, dtype=torch.float64)
            return sums[t] / size.to(sums[t].device)

        def single(sel: np.ndarray, t: str) -> np.ndarray:
            keys = [id(hs[i]) for i in sel]  # rows share the heuristic objects of their list
            uniq = list(dict.fromkeys(keys))
            index = {k: j for j, k in enumerate(uniq)}
            first = {id(hs[i]): hs[i] for i in sel}
            table = np.stack([self.member(first[k], t) for k in uniq])
            member = table[np.array([index[k] for k in keys])]
            return set_p_values(share_of(t)[torch.as_tensor(pos[sel])], member, self.groups[t])

        for t in SINGLE_TARGETS:
            sel = np.nonzero((target == t) & (fam != "multi_result"))[0]
            if len(sel):
                out[sel] = single(sel, t)
        sel = np.nonzero(target == "both")[0]
        if len(sel):
            out[sel] = fisher(single(sel, "op1"), single(sel, "op2"))
        sel = np.nonzero(target == "identical")[0]
        if len(sel):
            out[sel] = identical_p(dense(pos[sel]), self.cells,
                                   self.groups["op1"], self.groups["op2"], self.permutations,
                                   self.seed)
        return out


def n_value_tests(null: ValueNull, partitions: list, with_bottom: bool, level: float) -> int:
    """The correction's K for one operator under the value null (``tarone``): every
    heuristic scored, twice when the bottom-k is scored too. Sets the null's Monte Carlo
    permutations for op1 = op2 to the fewest that can reach level / K (its smallest
    p-value, 1 / (1 + permutations), is then still within the level K counts)."""
    min_ps = [null.min_p(h) for part in partitions for h in part.heuristics]
    k = tarone(np.array(min_ps * (2 if with_bottom else 1)), level)
    null.permutations = int(min(null.permutations, max(1_000, np.ceil(k / level))))
    return k


def label_values(m, null: ValueNull, k_map: torch.Tensor, kv_map: torch.Tensor,
                 threshold: float, level: float, n_tests: int, per_family: int,
                 orders: dict | None = None):
    """The 'values' label rule on one operator's rows (``catalog.matching.Matches``, neuron
    indices into the maps): rows scoring at least ``threshold`` get their value-null
    p-value and are labelled where it is at most level / n_tests, and the rows to store are
    chosen (``Matches.compact``); every stored score carries its p-value under the rule."""
    # the rows that could be stored: every row that could be labelled, and the best rows
    # of each family (Matches.compact keeps them whatever the labels): one pass over them
    m.implements = m.score >= threshold
    keep = m.compact(per_family)
    p = null.p_values(k_map, kv_map, keep.heuristics, keep.neuron, keep.heuristic, keep.bottom,
                      keep.score, orders, threshold, level / n_tests)
    keep.p_value = p
    keep.implements = (keep.score >= threshold) & (p <= level / n_tests)
    return keep.compact(per_family)


def within_class_tail(w_c: torch.Tensor, s_c: torch.Tensor, n_c: torch.Tensor,
                      t_obs: torch.Tensor) -> np.ndarray:
    """Upper bound on P(T >= t_obs) per row, T the top-cell weight on a set when the map is
    shuffled within classes: class c (n_c cells) keeps its top-cell weight w_c, and the
    set's s_c cells of it draw their share without replacement, so T is a sum of
    independent bounded terms with known means and variances. The least of Hoeffding's and
    Bernstein's inequalities and a Chernoff bound (each class's draws dominated in convex
    order by a binomial, Hoeffding 1963; lambda by a few Newton steps, any lambda being
    valid): an upper bound on the exact tail, so the test stays valid."""
    n_c = n_c.to(w_c.device)[None, :]
    t_obs = t_obs.to(w_c.device).double()
    q = (w_c / n_c).clamp(0.0, 1.0)
    mu = (s_c * q).sum(1)
    var = (s_c * q * (1 - q) * (n_c - s_c) / (n_c - 1).clamp(min=1)).sum(1)
    r = torch.minimum(torch.minimum(s_c, n_c - s_c),
                      torch.minimum(torch.ceil(w_c - 1e-9), torch.ceil(n_c - w_c - 1e-9)))
    r = r.clamp(min=0)
    dev_t = (t_obs - mu - 1e-6 * (1 + t_obs)).clamp(min=0)
    hoeffding = torch.exp(-2 * dev_t ** 2 / (r ** 2).sum(1).clamp(min=1e-12))
    bernstein = torch.exp(-dev_t ** 2 / (2 * (var + r.max(1).values * dev_t / 3))
                          .clamp(min=1e-12))
    # Chernoff: min over lambda > 0 of sum_c s_c log(1 - q + q e^lambda) - lambda t
    t = (t_obs - 1e-6 * (1 + t_obs))[:, None]
    lam = torch.ones_like(t)
    for _ in range(8):
        e = torch.exp(lam)
        denom = 1 - q + q * e
        grad = (s_c * q * e / denom).sum(1, keepdim=True) - t
        hess = (s_c * q * (1 - q) * e / denom ** 2).sum(1, keepdim=True).clamp(min=1e-12)
        lam = (lam - grad / hess).clamp(1e-6, 50.0)
    log_bound = (s_c * torch.log1p(q * torch.expm1(lam))).sum(1) - lam[:, 0] * t[:, 0]
    chernoff = torch.exp(log_bound.clamp(max=0.0))
    p = torch.minimum(torch.minimum(hoeffding, bernstein), chernoff)
    return torch.where(dev_t > 0, p, torch.ones_like(p)).clamp(max=1.0).cpu().numpy()


def label(m, config, n_tests: int, null: ValueNull | None, k_map: torch.Tensor,
          kv_map: torch.Tensor, orders: dict | None = None):
    """Apply the config's label rule to one operator's rows (neuron indices into the maps)
    and keep the rows to store: the one place CheckpointRun and the tests label."""
    if config.label_rule == "values":
        assert null is not None, "the values rule needs the operator's ValueNull"
        return label_values(m, null, k_map, kv_map, config.match_threshold,
                            config.significance_level, n_tests, config.scores_per_family,
                            orders)
    return m.label(config.match_threshold, config.label_rule, config.significance_level,
                   n_tests).compact(config.scores_per_family)
