"""The value null's tails (docs/method.md section 7): the exact upper tail of the
overlap X as a sum of per-stratum hypergeometrics (``value_tail``), the Monte Carlo tail
of op1 = op2 (``identical_p``), the bounded within-class tails (``within_class_tail``)
and Tarone's correction. The hypergeometric itself and Fisher's combination are
``catalog.core.stats``'. ``catalog.labels.value_null`` puts them together into a label."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from catalog.config.vocab import NULL_STRATA
from catalog.core.stats import hypergeom_pmf
from catalog.labels.heuristics import Cells, Heuristic

STRATA = NULL_STRATA  # how values are grouped: by digit count, or not at all

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
        return np.asarray(h.spec.test(self.values, h.params), dtype=bool)


@lru_cache(maxsize=65536)
def value_tail(strata: tuple[tuple[int, int, int], ...]) -> np.ndarray:
    """P(X >= x), x = 0..sum m_s, for X the sum over strata (n_s values, u_s of them in
    the neuron's top set, m_s in the heuristic's) of independent hypergeometric
    overlaps. Read-only; cached (the same layouts recur across neurons)."""
    pmf = np.ones(1)
    for n, u, m in strata:
        if m == 0:
            continue
        pmf = np.convolve(pmf, hypergeom_pmf(n, u, m))
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


def top_weights(maps: torch.Tensor, draws: int, kth: torch.Tensor | None = None) -> torch.Tensor:
    """(N, C) float64: 1 for each map's cells above its ``draws``-th largest value (``kth``,
    (N, 1), where known), the fair share (draws - #greater) / #tied for cells equal to it,
    0 below (catalog.labels.matching)."""
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
                permutations: int, seed: int, limit: np.ndarray | None = None) -> np.ndarray:
    """Monte Carlo p-value of op1 = op2 per map (``weights`` (N, C) from ``top_weights``):
    the top-cell weight on the diagonal against the weight on (pi(v), sigma(v)) for row and
    column permutations within strata, drawn in blocks. A map whose count of permutations
    at least as large reaches ``STOP_AFTER`` stops there with p = STOP_AFTER / drawn (valid,
    Besag and Clifford 1991: far from any label after a block or two); the others go on to
    ``permutations`` (or their own ``limit``, (N,), at most ``permutations``), with p =
    (1 + #as large) / (1 + permutations drawn). The draws are the same whatever the limits:
    a map's p-value does not depend on the other maps of the call."""
    n = weights.shape[0]
    side_r, side_c = len(rows.values), len(cols.values)
    dev = weights.device
    # each map's top-cell weights on the (op1 value, op2 value) square, in float32: the
    # null statistic of a block of permutations is then one matrix product against their
    # one-hot (value pair) indicators, not a gather per map and permutation. Sums of at
    # most |common| weights, each a multiple of 1/#tied: float32 rounding stays far below
    # the 1/#tied steps (>= 1/cells) between distinct sums; the margin, well inside those
    # steps, counts a near-equal null sum as at least as large (conservative)
    dense = torch.zeros(n, side_r * side_c, dtype=torch.float32, device=dev)
    flat = torch.as_tensor(rows.group * side_c + cols.group, device=dev)
    dense[:, flat] = weights.float()
    common = np.intersect1d(rows.values, cols.values)
    ri = np.searchsorted(rows.values, common)
    ci = np.searchsorted(cols.values, common)
    observed = dense[:, torch.as_tensor(ri * side_c + ci, device=dev)].sum(1)
    margin = 1e-5 * (1.0 + observed)
    gen = np.random.default_rng(seed)
    exceed = torch.zeros(n, dtype=torch.long, device=dev)
    drawn = torch.zeros(n, dtype=torch.long, device=dev)
    active = torch.ones(n, dtype=torch.bool, device=dev)
    cap = torch.as_tensor(np.full(n, permutations) if limit is None
                          else np.minimum(limit, permutations), device=dev)
    for start in range(0, permutations, 1024):
        live = torch.nonzero(active)[:, 0]
        if not len(live):
            break
        b = min(1024, permutations - start)
        perm_r = strata_permutations(rows.stratum, b, gen)[:, ri]
        perm_c = strata_permutations(cols.stratum, b, gen)[:, ci]
        idx = torch.as_tensor(perm_r * side_c + perm_c, device=dev)  # (b, |common|)
        onehot = torch.zeros(b, side_r * side_c, dtype=torch.float32, device=dev)
        onehot.scatter_(1, idx, 1.0)
        null = dense[live] @ onehot.T  # (live, b)
        hit = null >= (observed - margin)[live, None]
        # permutations past a map's own limit do not count for it
        hit &= torch.arange(start, start + b, device=dev)[None, :] < cap[live, None]
        # where a map reaches STOP_AFTER inside the block, it stops at that permutation
        cum = exceed[live, None] + torch.cumsum(hit.long(), dim=1)
        reached = cum >= STOP_AFTER
        stop_at = torch.where(reached.any(1), reached.float().argmax(1) + 1,
                              torch.full((len(live),), b, device=dev))
        exceed[live] = torch.minimum(cum[:, -1], torch.full_like(cum[:, -1], STOP_AFTER))
        drawn[live] += torch.minimum(stop_at, (cap[live] - start).clamp(min=0))
        active[live] = ~reached.any(1) & (cap[live] > start + b)
    stopped = exceed >= STOP_AFTER
    p = torch.where(stopped, exceed.double() / drawn.double(),
                    (1 + exceed.double()) / (1 + cap.double()))
    return p.clamp(max=1.0).cpu().numpy()


def strata_permutations(stratum: np.ndarray, b: int, gen: np.random.Generator) -> np.ndarray:
    """(b, n) permutations of 0..n-1 that map each index within its stratum."""
    n = len(stratum)
    out = np.tile(np.arange(n), (b, 1))
    for s in np.unique(stratum):
        idx = np.nonzero(stratum == s)[0]
        out[:, idx] = idx[np.argsort(gen.random((b, len(idx))), axis=1)]
    return out


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
