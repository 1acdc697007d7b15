"""The range family: op1, op2, both operands or the result in a window [start, start + w)."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register
from catalog.labels.heuristics import Cells, Heuristic, Partition, operand_targets, partition


def operand_range_widths(op: str) -> tuple[int, ...]:
    return (3, 5, 10) if op == "*" else (10, 30, 50, 100)


def result_range_widths(op: str) -> tuple[int, ...]:
    return {"+": (10, 30, 50), "-": (10, 30, 50), "*": (10, 30, 50, 100), "/": (2, 10, 100)}[op]


def range_partitions(cells: Cells, config) -> list[Partition]:
    """Operand windows [s, s+w) that tile [lo, hi); overlapping result windows."""
    out = []
    span = cells.hi - cells.lo
    for w in operand_range_widths(cells.op):
        if w >= span:
            continue
        starts = list(range(cells.lo, cells.hi, w))
        ia = (cells.a - cells.lo) // w
        ib = (cells.b - cells.lo) // w
        for target in operand_targets(cells.op):
            labels = {"op1": ia, "op2": ib, "both": np.where(ia == ib, ia, -1)}[target]
            hs = [Heuristic("range", target, (s, w)) for s in starts]
            out.append(partition(cells, labels, hs))
    top = int(cells.result.max())
    for w in result_range_widths(cells.op):
        step = max(w // 3, 10)
        starts = list(range(0, top + 1, step))
        groups = -(-w // step)  # windows j and j + groups never overlap
        for g in range(groups):
            gs = starts[g::groups]
            labels = np.full(len(cells.a), -1, dtype=np.int64)
            for j, s in enumerate(gs):
                labels[(cells.result >= s) & (cells.result < s + w)] = j
            out.append(partition(cells, labels, [Heuristic("range", "result", (s, w))
                                                 for s in gs]))
    return [p for p in out if p is not None]


RANGE = register(Family(
    name="range",
    doc="a number in a window `[s, s + w)`: operand windows tile the grid (widths 10, 30, "
        "50, 100; 3, 5, 10 for `*`), result windows overlap by two thirds",
    color="#1f77b4",
    describe=lambda who, p: f"{who} in [{p[0]}, {p[0] + p[1]})",
    test=lambda x, p: (x >= p[0]) & (x < p[0] + p[1]),
    partitions=range_partitions,
    simplicity=1,
))
