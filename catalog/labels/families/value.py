"""The value family: op1, op2 or the result equal to one number."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register
from catalog.labels.heuristics import Cells, Heuristic, Partition, partition

# Values are numbers below 1000 (the pattern family's 3-digit numbers written out in
# full); a one-cell set can never be significant, so sets need two cells.
VALUE_LIMIT = 1000


def value_partitions(cells: Cells, config) -> list[Partition]:
    """One number: op1 = v, op2 = v, result = v (v < 1000, at least two cells)."""
    out = []
    for target in ("op1", "op2", "result"):
        x = cells.values(target)
        labels = np.where(x < VALUE_LIMIT, x, -1).astype(np.int64)
        hs = [Heuristic("value", target, (v,)) for v in range(VALUE_LIMIT)]
        out.append(partition(cells, labels, hs, min_size=2))
    return [p for p in out if p is not None]


VALUE = register(Family(
    name="value",
    doc="one number, `op1 = v`, `op2 = v` or `result = v` (v below 1000, sets of at least "
        "two cells)",
    color="#d62728",
    describe=lambda who, p: f"{who} = {p[0]}",
    test=lambda x, p: x == p[0],
    partitions=value_partitions,
    simplicity=0,
))
