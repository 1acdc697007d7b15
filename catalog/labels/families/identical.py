"""The identical family: op1 = op2."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register
from catalog.labels.heuristics import Cells, Heuristic, Partition, partition


def identical_partitions(cells: Cells, config) -> list[Partition]:
    """op1 = op2."""
    labels = np.where(cells.a == cells.b, 0, -1)
    p = partition(cells, labels, [Heuristic("identical", "both", ())])
    return [p] if p is not None else []


IDENTICAL = register(Family(
    name="identical",
    doc="the two operands are equal, `op1 = op2` (tested by permuting op1's and op2's "
        "values apart)",
    color="#9467bd",
    describe=lambda who, p: "op1 = op2",
    # any single value can be one side of the pair; the rule is on the pair
    test=lambda x, p: np.ones(np.shape(x), dtype=bool),
    pair=lambda a, b, p: a == b,
    partitions=identical_partitions,
    null="diagonal",
    simplicity=4,
))
