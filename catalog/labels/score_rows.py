"""The rows of Algorithm 1's scores (``catalog.labels.matching.score_partitions``): each
partition's best side per neuron and heuristic kept from the floor up, with its set's size,
the top cells drawn, the base rate and the exact p-value."""

from __future__ import annotations

import numpy as np
import torch

from catalog.labels.heuristics import Heuristic, Partition
from catalog.labels.matches import Matches
from catalog.labels.significance import base_rate, p_values


def matches_from_best(partitions: list[Partition], best: list, is_bottom: list,
                      floor: float, pattern_top_k: int, n_cells: int, op: int) -> Matches:
    """The rows of every partition's scores (``best``, (neurons, heuristics) each, and
    ``is_bottom``, whether the bottom side gave it) at ``floor`` or more (pattern counts
    below K/10 dropped), for operator index ``op`` on maps of ``n_cells`` cells."""
    rows_n, rows_h, rows_s, rows_b, rows_k, rows_d = [], [], [], [], [], []
    heuristics: list[Heuristic] = []
    for part, sc_or_none, bot_or_none in zip(partitions, best, is_bottom, strict=True):
        assert sc_or_none is not None and bot_or_none is not None  # every partition scored
        sc, bot = sc_or_none, bot_or_none
        if part.scoring == "count":
            sc = torch.where(sc >= 0.1, sc, torch.zeros_like(sc))  # keep >= K/10
        nz = torch.nonzero(sc >= floor)
        rows_n.append(nz[:, 0])
        rows_h.append(nz[:, 1] + len(heuristics))
        rows_s.append(sc[nz[:, 0], nz[:, 1]])
        rows_b.append(bot[nz[:, 0], nz[:, 1]])
        # |S_H| of each row and the top cells drawn: k itself, or K for pattern counting
        sizes = torch.as_tensor(part.sizes, device=nz.device)[nz[:, 1]]
        rows_k.append(sizes)
        rows_d.append(sizes if part.scoring == "topk"
                      else torch.full_like(sizes, min(pattern_top_k, n_cells)))
        heuristics.extend(part.heuristics)
    if not rows_n:
        out = Matches.empty()
        out.heuristics = heuristics
        return out
    neuron = torch.cat(rows_n).cpu().numpy().astype(np.int32)
    score64 = torch.cat(rows_s).cpu().numpy()
    score = score64.astype(np.float32)
    k = torch.cat(rows_k).cpu().numpy()
    draws = torch.cat(rows_d).cpu().numpy()
    # the overlap in cells from the float64 score, not the stored float32 one (whose
    # rounding loses a whole cell when the count is near an integer)
    p_value = p_values(score64, k, n_cells, draws)
    return Matches(
        neuron=neuron,
        op=np.full(len(neuron), op, dtype=np.int8),
        heuristic=torch.cat(rows_h).cpu().numpy().astype(np.int32),
        score=score,
        bottom=torch.cat(rows_b).cpu().numpy(),
        heuristics=heuristics,
        base_rate=base_rate(k, n_cells).astype(np.float32),
        p_value=p_value,
    )


