"""Heuristic matching scores (method.md section 7, Algorithm 1), for all neurons at once.

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

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from catalog.heuristics import Heuristic, Partition


@dataclass
class SortedMaps:
    """Maps of many neurons over one operator's cells, sorted descending per neuron."""

    values: torch.Tensor  # (N, C) descending
    order: torch.Tensor  # (N, C) cell index of each sorted position
    ascending: torch.Tensor  # (N, C) values ascending, for searchsorted

    @classmethod
    def of(cls, maps: Float[torch.Tensor, "neuron cell"]) -> SortedMaps:
        values, order = torch.sort(maps, dim=1, descending=True)
        return cls(values=values, order=order, ascending=values.flip(1).contiguous())


def partition_scores(sm: SortedMaps, part: Partition, top_k: int | None = None) -> torch.Tensor:
    """Tie-aware top-k scores of every neuron for every heuristic of ``part``.

    ``top_k`` replaces each heuristic's k by one fixed K (the released code's count
    of pattern cells among the top-K; score = count / K). Returns float64 (N, H).
    """
    n, c = sm.values.shape
    dev = sm.values.device
    sizes = torch.as_tensor(part.sizes, device=dev)
    k = torch.full_like(sizes, min(top_k, c)) if top_k is not None else sizes
    thresh = sm.values[:, k - 1]  # (N, H) the k-th largest value
    n_le = torch.searchsorted(sm.ascending, thresh, right=True)
    n_lt = torch.searchsorted(sm.ascending, thresh, right=False)
    greater = c - n_le
    tied = n_le - n_lt
    frac = (k[None, :] - greater).double() / tied.double()
    # No counted cell sits at or beyond position greater + tied. Neurons with long
    # runs of equal values (dead or ReLU-sparse maps) reach much further than the
    # rest, so neurons are grouped by reach (powers of two) and each group scans
    # only as far as it must.
    reach = (greater + tied).max(dim=1).values
    bucket = torch.ceil(torch.log2(reach.double())).long()
    labels_all = torch.as_tensor(part.labels, device=dev)
    counts = torch.zeros(n, len(part.sizes), dtype=torch.float64, device=dev)
    for e in torch.unique(bucket).tolist():
        rows = torch.nonzero(bucket == e)[:, 0]
        r = int(reach[rows].max())
        labels = labels_all[sm.order[rows, :r]]
        vals = sm.values[rows, :r]
        h = labels.clamp(min=0)
        t = thresh[rows].gather(1, h)
        contrib = torch.where(vals > t, 1.0, torch.where(vals == t, frac[rows].gather(1, h), 0.0))
        contrib = torch.where(labels >= 0, contrib, 0.0)
        sub = torch.zeros(len(rows), len(part.sizes), dtype=torch.float64, device=dev)
        counts[rows] = sub.scatter_add_(1, h, contrib)
    return counts / k[None, :].double()


def reference_score(values: np.ndarray, member: np.ndarray, k: int | None = None) -> float:
    """Algorithm 1 for one neuron and one heuristic, written plainly (the tests' reference)."""
    if k is None:
        k = int(member.sum())
    kth = np.sort(values)[::-1][k - 1]
    greater = values > kth
    tied = values == kth
    share = (k - greater.sum()) / tied.sum()
    return float(((greater & member).sum() + (tied & member).sum() * share) / k)


@dataclass
class MatchRows:
    """Sparse scores of one (layer, operator): rows with score >= floor.

    neuron, heuristic (index into ``heuristics``), score, bottom (True when the
    bottom-k score was the larger one and is the one stored).
    """

    neuron: np.ndarray
    heuristic: np.ndarray
    score: np.ndarray
    bottom: np.ndarray
    heuristics: list[Heuristic]


def _best_of(top: torch.Tensor, bottom: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if bottom is None:
        return top, torch.zeros_like(top, dtype=torch.bool)
    use_bottom = bottom > top
    return torch.where(use_bottom, bottom, top), use_bottom


def score_partitions(
    k_map: Float[torch.Tensor, "neuron cell"],
    kv_map: Float[torch.Tensor, "neuron cell"],
    partitions: list[Partition],
    floor: float,
    with_bottom: bool,
    pattern_top_k: int = 100,
) -> MatchRows:
    """Score every neuron against every partition's heuristics; keep scores >= floor.

    Operand heuristics use ``k_map``, result heuristics ``kv_map``. With
    ``with_bottom`` the bottom-k of each map (top-k of its negation) is scored too
    and the larger of the two is kept.
    """
    sorted_maps = {False: SortedMaps.of(k_map), True: SortedMaps.of(kv_map)}
    negated = ({False: SortedMaps.of(-k_map), True: SortedMaps.of(-kv_map)}
               if with_bottom else None)
    rows_n, rows_h, rows_s, rows_b = [], [], [], []
    heuristics: list[Heuristic] = []
    for part in partitions:
        top_k = pattern_top_k if part.scoring == "count" else None
        top = partition_scores(sorted_maps[part.direct], part, top_k)
        bot = partition_scores(negated[part.direct], part, top_k) if negated else None
        best, is_bottom = _best_of(top, bot)
        if part.scoring == "count":
            best = torch.where(best >= 0.1, best, torch.zeros_like(best))  # keep >= K/10
        nz = torch.nonzero(best >= floor)
        rows_n.append(nz[:, 0])
        rows_h.append(nz[:, 1] + len(heuristics))
        rows_s.append(best[nz[:, 0], nz[:, 1]])
        rows_b.append(is_bottom[nz[:, 0], nz[:, 1]])
        heuristics.extend(part.heuristics)
    if not rows_n:
        empty = np.zeros(0)
        return MatchRows(empty.astype(np.int32), empty.astype(np.int32),
                         empty.astype(np.float32), empty.astype(bool), heuristics)
    return MatchRows(
        neuron=torch.cat(rows_n).cpu().numpy().astype(np.int32),
        heuristic=torch.cat(rows_h).cpu().numpy().astype(np.int32),
        score=torch.cat(rows_s).cpu().numpy().astype(np.float32),
        bottom=torch.cat(rows_b).cpu().numpy(),
        heuristics=heuristics,
    )


def multi_result_matches(
    kv_map: Float[torch.Tensor, "neuron cell"],
    result: np.ndarray,
    top: int = 50,
    coverage: float = 0.95,
) -> list[tuple[int, Heuristic, float]]:
    """Division neurons whose top cells fall on 2-5 results covering >= ``coverage``.

    Returns (neuron, heuristic "result in {...}", covered share) for each match.
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
                out.append((neuron, Heuristic("multi_result", "result", results),
                            float(cum[neuron, r - 1])))
                break
    return out
