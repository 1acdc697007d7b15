"""Scores of the label rule's second pass (``catalog.labels.operator_labels.rescued``): each
map there is one (map, set) pair, the KV map less the operands' part of its joint fit
with ONE result set, and only the heuristics of that set can be kept from it. Scoring
every heuristic of every result partition on each such map, as ``score_partitions``
does for the first pass, spent most of the second pass's scoring on rows it then
dropped: on Qwen2.5-Coder-0.5B's [0, 30) grid a pair map names one set of the 167 it may
label, and 20 partitions (108 heuristics) were scored on it.

``score_pairs`` counts each pair map's top cells in its own heuristics' sets alone: with
t the k-th largest value, a heuristic's count is the number of its cells above t, and
the cells at t share the remaining places fairly (Algorithm 1's tie rule,
``catalog.labels.matching``). Where t is not tied (one cell holds it) the count is a
whole number, the cells at or above t, the same number ``score_partitions`` finds; a map
whose k-th value is tied on either side is scored by ``score_partitions`` itself (one
formula for ties, so rows equal to the last bit). Rows come out in ``score_partitions``'
order (partition, map, heuristic), with the same columns and the same heuristic list."""

from __future__ import annotations

import numpy as np
import torch

from catalog.labels.heuristics import Partition
from catalog.labels.matches import Matches
from catalog.labels.significance import base_rate, p_values

# pair maps x cells compared at a time (float32: 64 MB)
PAIR_VALUES = 1 << 24


def candidates(partition: Partition, row_set: np.ndarray, set_of: dict[str, int]
               ) -> tuple[np.ndarray, np.ndarray]:
    """(map, heuristic) of every heuristic of ``partition`` whose set (``set_of`` by key;
    absent: none) is its map's (``row_set``), ordered by map, then heuristic."""
    at = np.array([set_of.get(h.key, -1) for h in partition.heuristics], dtype=np.int64)
    by_set = np.argsort(at, kind="stable")  # heuristics by set, in their order within one
    lo = np.searchsorted(at[by_set], row_set, side="left")
    hi = np.searchsorted(at[by_set], row_set, side="right")
    hi = np.where(row_set >= 0, hi, lo)
    count = hi - lo
    rows = np.repeat(np.arange(len(row_set)), count)
    start = np.repeat(lo - np.cumsum(np.r_[0, count[:-1]]), count)
    return rows, by_set[np.arange(len(rows)) + start]


def _counts(maps: torch.Tensor, sides: list, labels: torch.Tensor, rows: np.ndarray,
            h: np.ndarray, k: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per side (``sides``: (sign, sign x the maps sorted descending), top first): (cells
    of h at or above the k-th largest value of sign x its map, whether that value is
    tied) of each (map, heuristic) pair. In blocks of ``PAIR_VALUES``, each block's maps
    and sets gathered once for every side."""
    n_cells = maps.shape[1]
    dev = maps.device
    out = [(torch.zeros(len(rows), dtype=torch.float64, device=dev),
            torch.zeros(len(rows), dtype=torch.bool, device=dev)) for _ in sides]
    step = max(1, PAIR_VALUES // max(n_cells, 1))
    for s in range(0, len(rows), step):
        r = torch.as_tensor(rows[s:s + step], device=dev)
        kk = torch.as_tensor(k[s:s + step], device=dev)
        y = maps.index_select(0, r)
        own = labels[None, :] == torch.as_tensor(h[s:s + step], device=dev)[:, None]
        for (sign, sm), (above, tied) in zip(sides, out, strict=True):
            v = sm.values.index_select(0, r)
            t = v.gather(1, (kk - 1)[:, None])
            # tied: the value before or after the k-th in sorted order equals it
            tie = (kk > 1) & (v.gather(1, (kk - 2).clamp(min=0)[:, None])[:, 0] == t[:, 0])
            tied[s:s + step] = tie | (
                (kk < n_cells) & (v.gather(1, kk.clamp(max=n_cells - 1)[:, None])[:, 0]
                                  == t[:, 0]))
            # untied, the k-th cell itself is one of the top k: its own cells at or above
            above[s:s + step] = (own & (y * sign >= t)).sum(1).double()
    return out


def score_pairs(kv_map: torch.Tensor, top, partitions: list[Partition], floor: float,
                with_bottom: bool, pattern_top_k: int, op: int, orders: dict | None,
                pairs: tuple[np.ndarray, dict[str, int]], fallback) -> Matches:
    """``score_partitions`` of result partitions on pair maps (``kv_map``, sorted: ``top``,
    its ``SortedMaps``; ``pairs``: each map's set and each heuristic's set by key), only
    the rows of each map's own set's heuristics; ``fallback(rows)``:
    ``score_partitions``' Matches of maps ``rows`` alone (maps with a tie at a k-th
    value). ``orders`` receives the sort orders the value rule reads, as
    ``score_partitions`` gives them."""
    assert all(p.direct for p in partitions), "pairs are scored on result partitions"
    row_set, set_of = np.asarray(pairs[0], dtype=np.int64), pairs[1]
    n_cells = kv_map.shape[1]
    heuristics = [h for p in partitions for h in p.heuristics]
    offsets = np.cumsum([0] + [len(p.heuristics) for p in partitions])
    cols: dict[str, list] = {c: [] for c in ("part", "map", "h", "score", "p", "bottom", "k")}
    tie_maps: list[np.ndarray] = [np.zeros(0, np.int64)]
    if len(kv_map):
        sides = [(1.0, top)] + ([(-1.0, top.negated())] if with_bottom else [])
        if orders is not None:
            for side, (_, sm) in enumerate(sides):
                orders[(True, side == 1)] = sm.order
        for pi, part in enumerate(partitions):
            rows, h = candidates(part, row_set, set_of)
            if len(rows):
                got, tied = _partition_rows(kv_map, sides, part, rows, h, floor,
                                            pattern_top_k)
                got["part"] = np.full(len(got["map"]), pi)
                for c, v in got.items():
                    cols[c].append(v)
                tie_maps.append(tied)
    ties = np.unique(np.concatenate(tie_maps))
    if len(ties):
        # a map with a tie at any of its heuristics' k-th values is scored the long way
        # whole (a set named by a heuristic of k cells and one counted among K top cells
        # may tie at one k and not the other): none of its rows from here
        for i, mp in enumerate(cols["map"]):
            out = ~np.isin(mp, ties)
            for c in cols:
                cols[c][i] = cols[c][i][out]
        _add_fallback(cols, fallback(ties), ties, row_set, set_of, partitions, offsets)
    if not cols["map"]:
        empty = Matches.empty()
        empty.heuristics = heuristics
        return empty
    got = {c: np.concatenate(v) for c, v in cols.items()}
    order = np.lexsort((got["h"], got["map"], got["part"]))
    got = {c: v[order] for c, v in got.items()}
    return Matches(
        neuron=got["map"].astype(np.int32), op=np.full(len(order), op, dtype=np.int8),
        heuristic=(offsets[got["part"]] + got["h"]).astype(np.int32),
        score=got["score"].astype(np.float32), bottom=got["bottom"].astype(bool),
        heuristics=heuristics, base_rate=base_rate(got["k"], n_cells).astype(np.float32),
        p_value=got["p"].astype(np.float64))


def _partition_rows(kv_map: torch.Tensor, sides: list, part: Partition, rows: np.ndarray,
                    h: np.ndarray, floor: float, pattern_top_k: int
                    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The rows from ``floor`` up of the (map, heuristic) pairs ``rows``, ``h`` of one
    partition (map, h, score, p-value, side, k), and the maps with a tie at one of their
    k-th values (``sides``: (sign, the maps times it sorted descending), top first)."""
    n_cells = kv_map.shape[1]
    sizes = np.asarray(part.sizes, dtype=np.int64)[h]
    count_scored = part.scoring == "count"
    k = np.full(len(h), min(pattern_top_k, n_cells)) if count_scored else sizes
    labels = torch.as_tensor(part.labels, device=kv_map.device)
    best: np.ndarray | None = None
    bottom, tied = np.zeros(len(rows), dtype=bool), np.zeros(len(rows), dtype=bool)
    for above, tie in _counts(kv_map, sides, labels, rows, h, k):
        sc = (above / torch.as_tensor(k, dtype=torch.float64, device=above.device)
              ).cpu().numpy()
        tied |= tie.cpu().numpy()
        if best is None:
            best = sc
        else:
            bottom = sc > best
            best = np.where(bottom, sc, best)
    assert best is not None
    if count_scored:
        best = np.where(best >= 0.1, best, 0.0)
    keep = best >= floor
    return ({"map": rows[keep], "h": h[keep], "score": best[keep].astype(np.float32),
             "p": p_values(best[keep], sizes[keep], n_cells, k[keep]),
             "bottom": bottom[keep], "k": sizes[keep]}, rows[tied])


def _add_fallback(cols: dict[str, list], m: Matches, maps: np.ndarray, row_set: np.ndarray,
                  set_of: dict[str, int], partitions: list[Partition],
                  offsets: np.ndarray) -> None:
    """Add the rows of ``m`` (``score_partitions`` of maps ``maps``, every heuristic of
    ``partitions``, neuron indices into ``maps``) of each map's own set's heuristics to
    ``cols``, with their scores and p-values."""
    if not len(m):
        return
    part = np.searchsorted(offsets, m.heuristic, side="right") - 1
    h = m.heuristic - offsets[part]
    at = np.array([set_of.get(x.key, -1) for x in m.heuristics] or [-1])[m.heuristic]
    mp = maps[m.neuron]
    keep = (at >= 0) & (at == row_set[mp])
    sizes = np.array([int(partitions[q].sizes[i]) for q, i in zip(part, h, strict=True)],
                     dtype=np.int64)
    for c, v in (("part", part), ("map", mp), ("h", h), ("score", m.score),
                 ("p", m.p_value), ("bottom", m.bottom), ("k", sizes)):
        cols[c].append(np.asarray(v)[keep])
