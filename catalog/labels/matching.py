"""Heuristic matching scores (docs/method.md section 7, Algorithm 1), for all neurons at once.

For a heuristic H with k = |S_H| and a neuron's map M over the valid cells, the
score is |top-k(M) ∩ S_H| / k. Ties at the k-th value are shared fairly: a cell
tied with the k-th largest value counts as (k - #greater) / #tied, the expected
count under a random tie order. Without this, a flat or sparse (ReLU) map would
"match" whatever heuristic the cell order happened to favour, e.g. op1 in [0, 10).

How it is fast. Each map is sorted once per neuron. A partition's heuristics are
disjoint, so every cell has at most one heuristic, and only cells at sorted
positions below max(k) (extended through ties) can count for any of them. For
those positions we gather the cell's label, test it against its own heuristic's
threshold, and add it to that heuristic's count with one scatter-add. The work
per partition is neurons x max(k) instead of neurons x cells x heuristics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float

from catalog.core.sorting import row_order
from catalog.core.stats import log_n_choose
from catalog.labels import significance
from catalog.labels.heuristics import Cells, Heuristic, Partition
from catalog.labels.matches import Matches
from catalog.labels.score_rows import matches_from_best


@dataclass
class SortedMaps:
    """Maps of many neurons over one operator's cells, sorted descending per neuron."""

    values: torch.Tensor  # (N, C) descending
    order: torch.Tensor  # (N, C) cell index of each sorted position
    ascending: torch.Tensor  # (N, C) values ascending, for searchsorted
    _run: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, maps: Float[torch.Tensor, "neuron cell"]) -> SortedMaps:
        if maps.device.type == "cpu":
            # a sort of packed (value key, cell) words, faster than np.argsort and
            # torch.sort on CPU (catalog.core.sorting); equal values come by cell, though
            # nothing read from the order depends on it (ties are scored fairly)
            order = torch.from_numpy(row_order(maps.numpy(), descending=True))
            values = maps.gather(1, order)
        else:
            values, order = torch.sort(maps, dim=1, descending=True)
        return cls(values=values, order=order, ascending=values.flip(1).contiguous())

    def negated(self) -> SortedMaps:
        """The same maps negated, sorted descending, without a sort: the order reversed
        (-M's largest values are M's smallest). Equal values may come in another order
        than a sort of -M gives; nothing read from the order depends on it (ties are
        scored fairly, here and in the value rule)."""
        return SortedMaps(values=-self.ascending, order=self.order.flip(1).contiguous(),
                          ascending=-self.values)

    def rows(self, idx: torch.Tensor) -> SortedMaps:
        """The same maps for a subset of neurons."""
        return SortedMaps(self.values[idx], self.order[idx], self.ascending[idx])

    def longest_run(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(start, length) per neuron of the longest run of equal values in sorted order:
        the map's mode, e.g. the zeros of a ReLU neuron or the whole of a constant map.
        Computed once per SortedMaps."""
        if self._run is None:
            self._run = self._longest_run()
        return self._run

    def _longest_run(self) -> tuple[torch.Tensor, torch.Tensor]:
        n, c = self.values.shape
        dev = self.values.device
        new = torch.ones(n, c, dtype=torch.bool, device=dev)
        new[:, 1:] = self.values[:, 1:] != self.values[:, :-1]
        run = torch.cumsum(new.long(), dim=1) - 1  # run id of every position
        length = torch.zeros(n, c, dtype=torch.long, device=dev)
        length.scatter_add_(1, run, torch.ones_like(run))
        best = length.argmax(dim=1)
        pos = torch.arange(c, device=dev).expand(n, c)
        start = torch.where(run == best[:, None], pos, c).min(dim=1).values
        return start, length.gather(1, best[:, None])[:, 0]


def _k_of(part: Partition, top_k: int | None, n_cells: int, dev) -> torch.Tensor:
    sizes = torch.as_tensor(part.sizes, device=dev)
    return torch.full_like(sizes, min(top_k, n_cells)) if top_k is not None else sizes


def _threshold_stats(sm: SortedMaps, k: torch.Tensor):
    """k-th largest value per (neuron, heuristic), and how many values exceed / equal it."""
    c = sm.values.shape[1]
    thresh = sm.values[:, k - 1]
    n_le = torch.searchsorted(sm.ascending, thresh, right=True)
    n_lt = torch.searchsorted(sm.ascending, thresh, right=False)
    return thresh, c - n_le, n_le - n_lt


# maps whose most frequent value covers at least this share of the cells are counted
# around that value's run (``_around_mode``); above 1 turns the path off (benchmarks)
AROUND_RUN_SHARE = 0.25


def partition_scores(sm: SortedMaps, part: Partition, top_k: int | None = None) -> torch.Tensor:
    """Tie-aware top-k scores of every neuron for every heuristic of ``part``.

    ``top_k`` replaces each heuristic's k by one fixed K (the released code's count
    of pattern cells among the top-K; score = count / K). Returns float64 (N, H).
    """
    n, c = sm.values.shape
    dev = sm.values.device
    k = _k_of(part, top_k, c, dev)
    thresh, greater, tied = _threshold_stats(sm, k)
    frac = (k[None, :] - greater).double() / tied.double()
    # No counted cell sits at or beyond position greater + tied. Neurons with long
    # runs of equal values (dead or ReLU-sparse maps) reach much further than the
    # rest, so neurons are grouped by reach (powers of two) and each group scans
    # only as far as it must.
    reach = (greater + tied).max(dim=1).values
    has_ties = (tied > 1).any(dim=1)
    labels_all = torch.as_tensor(part.labels, device=dev)
    n_h = len(part.sizes)
    counts = torch.zeros(n, n_h, dtype=torch.float64, device=dev)
    # Maps dominated by one value (dead, constant, ReLU-sparse) would scan that value's
    # whole run; they are counted around it instead (``_around_mode``).
    # (a run that long needs ties reaching that far: maps without such ties skip this)
    around = torch.zeros_like(has_ties)
    if bool((has_ties & (reach >= AROUND_RUN_SHARE * c)).any()):
        run_start, run_len = sm.longest_run()
        around = has_ties & (run_len >= AROUND_RUN_SHARE * c) & (reach > c - run_len)
    if bool(around.any()):
        rows = torch.nonzero(around)[:, 0]
        counts[rows] = _around_mode(sm, rows, part, labels_all, thresh[rows],
                                    frac[rows], run_start[rows], run_len[rows])
    bucket = torch.ceil(torch.log2(reach.double())).long() * 2 + has_ties.long()
    bucket[around] = -1
    for e in torch.unique(bucket).tolist():
        if e < 0:
            continue
        rows = torch.nonzero(bucket == e)[:, 0]
        r = int(reach[rows].max())
        labels = labels_all[sm.order[rows, :r]]
        member = labels >= 0
        h = labels.clamp(min=0)
        if e % 2 == 0:
            # No ties at any threshold: position j counts for its heuristic iff j < k.
            counted = member & (torch.arange(r, device=dev)[None, :] < k[h])
            flat = (torch.arange(len(rows), device=dev)[:, None] * n_h + h)[counted]
            sub = torch.bincount(flat, minlength=len(rows) * n_h).view(len(rows), n_h)
            counts[rows] = sub.double()
            continue
        vals = sm.values[rows, :r]
        t = thresh[rows].gather(1, h)
        contrib = torch.where(vals > t, 1.0, torch.where(vals == t, frac[rows].gather(1, h), 0.0))
        contrib = torch.where(member, contrib, 0.0)
        sub = torch.zeros(len(rows), n_h, dtype=torch.float64, device=dev)
        counts[rows] = sub.scatter_add_(1, h, contrib)
    return counts / k[None, :].double()


def _around_mode(sm: SortedMaps, rows: torch.Tensor, part: Partition,
                 labels_all: torch.Tensor, thresh: torch.Tensor, frac: torch.Tensor,
                 run_start: torch.Tensor, run_len: torch.Tensor) -> torch.Tensor:
    """Tie-aware counts of ``partition_scores`` for maps with one long run of a value m.

    A cell with value v counts f_h(v) = [v > t_h] + frac_h [v = t_h] for its heuristic h
    (t_h the k-th largest value). Every cell of the run has v = m, so the run's cells of
    h add f_h(m) x (|S_h| - h's cells outside the run), and only the cells outside the
    run, above it and below it in sorted order, are visited one by one: a constant map
    visits none. Exact, like the scan it replaces. ``rows`` are the neurons of ``sm`` to
    count, the other arguments theirs. Returns float64 (len(rows), H) counts.
    """
    n, c = len(rows), sm.values.shape[1]
    dev = sm.values.device
    n_h = len(part.sizes)
    above, below = run_start, c - run_start - run_len
    mode = sm.values[rows, run_start][:, None]  # (N, 1)
    f_mode = torch.where(mode > thresh, 1.0, torch.where(mode == thresh, frac, 0.0))
    sizes = torch.as_tensor(part.sizes, device=dev, dtype=torch.float64)
    counts = torch.zeros(n, n_h, dtype=torch.float64, device=dev)
    outside = torch.zeros(n, n_h, dtype=torch.float64, device=dev)
    for span, top in ((above, True), (below, False)):
        w = int(span.max())
        if w == 0:
            continue
        # the widest span of the group; positions beyond a neuron's own span are masked
        if top:
            pos = torch.arange(w, device=dev)
            inside = pos[None, :] < span[:, None]
        else:
            pos = torch.arange(c - w, c, device=dev)
            inside = pos[None, :] >= (c - span)[:, None]
        labels = labels_all[sm.order[rows[:, None], pos[None, :]]]
        member = (labels >= 0) & inside
        h = labels.clamp(min=0)
        vals = sm.values[rows[:, None], pos[None, :]]
        t = thresh.gather(1, h)
        contrib = torch.where(vals > t, 1.0, torch.where(vals == t, frac.gather(1, h), 0.0))
        counts.scatter_add_(1, h, torch.where(member, contrib, 0.0))
        outside.scatter_add_(1, h, member.double())
    return counts + f_mode * (sizes[None, :] - outside)


def value_group_scores(
    sm: SortedMaps, parts: list[Partition], x: np.ndarray, top_ks: list[int | None]
) -> list[torch.Tensor]:
    """Scores for partitions whose heuristics depend on one number x per cell (op1, op2 or
    the result), all from one pass over the sorted maps.

    Walking down each neuron's sorted cells, a histogram of x grows; when it reaches a
    heuristic's k it holds, for every value v, how many of the top k cells have x = v,
    and the heuristic's count is a sum over its values: one gather and one scatter-add
    over the (heuristic, value) memberships of that k, so the cost grows with the
    number of values, not values x heuristics (`*` on [0, 300) has 89,401 result values
    and thousands of result windows). This is exact where no value ties the k-th one;
    neurons with such ties are scored by ``partition_scores``. Returns one float64
    (N, H) tensor per partition.
    """
    n, c = sm.values.shape
    dev = sm.values.device
    x_t = torch.as_tensor(x, device=dev, dtype=torch.long)
    n_vals = int(x_t.max()) + 1
    ks = []
    ent_h, ent_v = [], []  # (heuristic, value) of every membership: one value, one heuristic
    offset = 0
    tie_rows = torch.zeros(n, dtype=torch.bool, device=dev)
    for part, top_k in zip(parts, top_ks, strict=True):
        k = _k_of(part, top_k, c, dev)
        ks.append(k)
        tie_rows |= (_threshold_stats(sm, k)[2] > 1).any(dim=1)
        value_label = torch.full((n_vals,), -1, dtype=torch.long, device=dev)
        lab = torch.as_tensor(part.labels, device=dev)
        value_label[x_t[lab >= 0]] = lab[lab >= 0]
        has = torch.nonzero(value_label >= 0)[:, 0]
        ent_h.append(value_label[has] + offset)
        ent_v.append(has)
        offset += len(part.sizes)
    k_all = torch.cat(ks)
    h_of, v_of = torch.cat(ent_h), torch.cat(ent_v)
    # memberships grouped by their heuristic's k, so that each k reads one slice
    order = torch.argsort(k_all[h_of], stable=True)
    h_of, v_of = h_of[order], v_of[order]
    k_of_entry = k_all[h_of]
    counts = torch.zeros(n, len(k_all), dtype=torch.float64, device=dev)
    fast = torch.nonzero(~tie_rows)[:, 0]
    if len(fast):
        max_k = int(k_all.max())
        xs = x_t[sm.order[fast, :max_k]]  # value of x at each sorted position
        flat = xs + torch.arange(len(fast), device=dev)[:, None] * n_vals
        hist = torch.zeros(len(fast) * n_vals, device=dev)
        prev = 0
        for kv in torch.unique(k_all).tolist():
            seg = flat[:, prev:kv].reshape(-1)
            hist.index_add_(0, seg, torch.ones(len(seg), device=dev))
            prev = kv
            sel = torch.nonzero(k_all == kv)[:, 0]
            lo_e = int(torch.searchsorted(k_of_entry, kv, right=False))
            hi_e = int(torch.searchsorted(k_of_entry, kv, right=True))
            col = torch.searchsorted(sel, h_of[lo_e:hi_e])  # position of each entry in sel
            part_counts = torch.zeros(len(fast), len(sel), device=dev)
            part_counts.index_add_(1, col, hist.view(len(fast), n_vals)[:, v_of[lo_e:hi_e]])
            counts[fast[:, None], sel[None, :]] = part_counts.double()
    out, start = [], 0
    slow = torch.nonzero(tie_rows)[:, 0]
    slow_sm = sm.rows(slow) if len(slow) else None  # one copy for every partition
    for part, top_k, k in zip(parts, top_ks, ks, strict=True):
        block = counts[:, start:start + len(k)] / k[None, :].double()
        if slow_sm is not None:
            block[slow] = partition_scores(slow_sm, part, top_k)
        out.append(block)
        start += len(k)
    return out


def score_partitions(
    k_map: Float[torch.Tensor, "neuron cell"],
    kv_map: Float[torch.Tensor, "neuron cell"],
    partitions: list[Partition],
    floor: float,
    with_bottom: bool,
    pattern_top_k: int = 100,
    cells: Cells | None = None,
    op: int = 0,
    orders: dict | None = None,
    pairs: tuple | None = None,
) -> Matches:
    """Score every neuron against every partition's heuristics; keep scores >= floor.

    Operand heuristics use ``k_map``, result heuristics ``kv_map``. With
    ``with_bottom`` the bottom-k of each map (top-k of its negation) is scored too
    and the larger of the two is kept. With ``cells``, heuristics of one number
    (op1, op2, result) take the faster ``value_group_scores`` path. ``op`` is the
    operator's index, written into every row. ``orders``, where given, receives each
    side's descending sort order, keyed (direct, bottom): the label rule reuses them.
    ``pairs`` (the label rule's second pass, result partitions only: each KV map's set
    and each heuristic's set by key): each map scored against its own set's heuristics
    alone (``catalog.labels.pair_scores``; the same rows as scoring all and keeping
    those).
    """
    if pairs is not None:
        return _score_pairs(k_map, kv_map, partitions, floor, with_bottom, pattern_top_k,
                            cells, op, orders, pairs)
    best: list[torch.Tensor | None] = [None] * len(partitions)
    is_bottom: list[torch.Tensor | None] = [None] * len(partitions)
    top = _sorted_sides(k_map, kv_map, partitions)
    for bottom in (False, True) if with_bottom else (False,):
        sorted_maps = _negated(top) if bottom else top
        if orders is not None:
            orders.update({(direct, bottom): sm.order for direct, sm in sorted_maps.items()})
        _keep_best(best, is_bottom, _side_scores(sorted_maps, partitions, cells, pattern_top_k))
    return matches_from_best(partitions, best, is_bottom, floor, pattern_top_k,
                             k_map.shape[1], op)


def _negated(top: dict[bool, SortedMaps]) -> dict[bool, SortedMaps]:
    """The bottom side: each distinct sorting reversed once (one when the maps are the
    same)."""
    negated = {id(sm): sm.negated() for sm in top.values()}
    return {d: negated[id(sm)] for d, sm in top.items()}


def _keep_best(best: list, is_bottom: list, scores: dict[int, torch.Tensor]) -> None:
    """Each partition's best score so far (and whether it is the bottom side's), updated
    with one side's ``scores``."""
    for i, sc in scores.items():
        prev = best[i]
        if prev is None:
            best[i], is_bottom[i] = sc, torch.zeros_like(sc, dtype=torch.bool)
        else:
            better = sc > prev
            best[i], is_bottom[i] = torch.where(better, sc, prev), better


def _score_pairs(k_map: torch.Tensor, kv_map: torch.Tensor, partitions: list[Partition],
                 floor: float, with_bottom: bool, pattern_top_k: int, cells: Cells | None,
                 op: int, orders: dict | None, pairs: tuple) -> Matches:
    """``score_partitions`` with ``pairs`` (``catalog.labels.pair_scores``): maps whose
    k-th value is tied are scored by ``score_partitions`` itself."""
    from catalog.labels.pair_scores import score_pairs

    def fallback(rows: np.ndarray) -> Matches:
        idx = torch.as_tensor(rows, device=kv_map.device, dtype=torch.long)
        return score_partitions(k_map.index_select(0, idx), kv_map.index_select(0, idx),
                                partitions, floor, with_bottom, pattern_top_k, cells, op)
    return score_pairs(kv_map, SortedMaps.of(kv_map), partitions, floor, with_bottom,
                       pattern_top_k, op, orders, pairs, fallback)


def _sorted_sides(k_map: torch.Tensor, kv_map: torch.Tensor, partitions: list[Partition]
                  ) -> dict[bool, SortedMaps]:
    """Each kind of map sorted (key: a partition's ``direct``, True for the KV map), only
    where a partition reads it (the label rule's second pass scores result heuristics
    alone); one sort where both kinds are one map."""
    same = kv_map is k_map
    needs = {part.direct for part in partitions}
    top: dict[bool, SortedMaps] = {}
    if False in needs or same:
        top[False] = SortedMaps.of(k_map)
    if True in needs:
        top[True] = top[False] if same else SortedMaps.of(kv_map)
    return top


def _side_scores(sorted_maps: dict[bool, SortedMaps], partitions: list[Partition],
                 cells: Cells | None, pattern_top_k: int) -> dict[int, torch.Tensor]:
    """Each partition's scores on one side of the maps: heuristics of one number (op1,
    op2, result) grouped per map kind and number where ``cells`` are given
    (``value_group_scores``), the others one partition at a time."""
    scores: dict[int, torch.Tensor] = {}
    groups: dict[tuple[bool, str], list[int]] = {}
    for i, part in enumerate(partitions):
        target = part.heuristics[0].target
        if cells is not None and target in ("op1", "op2", "result"):
            groups.setdefault((part.direct, target), []).append(i)
        else:
            top_k = pattern_top_k if part.scoring == "count" else None
            scores[i] = partition_scores(sorted_maps[part.direct], part, top_k)
    for (direct, target), idx in groups.items():
        assert cells is not None  # groups are only formed with cells
        parts = [partitions[i] for i in idx]
        top_ks = [pattern_top_k if p.scoring == "count" else None for p in parts]
        for i, sc in zip(idx, value_group_scores(sorted_maps[direct], parts,
                                                 cells.values(target), top_ks), strict=True):
            scores[i] = sc
    return scores


def multi_result_matches(
    kv_map: Float[torch.Tensor, "neuron cell"],
    result: np.ndarray,
    top: int = 50,
    coverage: float = 0.95,
    floor: float = 0.0,
    op: int = 0,
    family: str = "multi_result",
) -> Matches:
    """Division neurons whose top cells fall on 2-5 results covering >= ``coverage``.

    One row per match: the heuristic "result in {...}" and the covered share as its
    score (rows below ``floor`` are dropped; ``op`` is the operator's index). Its base
    rate is the share of cells with one of those results; its p-value is the
    hypergeometric tail of the overlap times the number of result sets of that size
    (the results are chosen after looking at the map).
    """
    n, c = kv_map.shape
    top = min(top, c)
    idx = torch.topk(kv_map, top, dim=1).indices.cpu().numpy()
    uniq, inv = np.unique(result, return_inverse=True)
    res_idx = inv[idx]  # (N, top)
    counts = np.zeros((n, len(uniq)), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n), top), res_idx.ravel()), 1)
    order = np.argsort(-counts, axis=1, kind="stable")
    cum = np.cumsum(np.take_along_axis(counts, order, axis=1), axis=1) / top
    out = []
    for neuron in range(n):
        if cum[neuron, 0] >= coverage:
            continue  # one result alone: a value heuristic, not multi-result
        for r in range(2, min(5, len(uniq)) + 1):
            if cum[neuron, r - 1] >= coverage:
                results = tuple(sorted(int(x) for x in uniq[order[neuron, :r]]))
                share = float(cum[neuron, r - 1])
                if share >= floor:
                    k = int(np.isin(result, results).sum())
                    x = int(round(share * top))
                    log_p = (np.log(max(overlap_tail_at(c, k, top, x), 1e-300))
                             + log_n_choose(len(uniq), r))
                    out.append((neuron, op, Heuristic(family, "result", results),
                                share, False, k / c, float(min(1.0, np.exp(log_p))), False))
                break
    return Matches.from_records(out)


def overlap_tail_at(n_cells: int, k: int, draws: int, x: int) -> float:
    """P(X >= x) of the hypergeometric overlap (catalog.labels.significance.overlap_tail)."""
    return float(significance.overlap_tail(n_cells, k, min(draws, n_cells))[min(x, draws)])
