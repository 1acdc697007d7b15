"""The modulo family: op1, op2, both operands or the result = m (mod n)."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register
from catalog.labels.heuristics import Cells, Heuristic, Partition, partition


def modulo_partitions(cells: Cells, config) -> list[Partition]:
    """x = m (mod n) for op1, op2, both operands and the result (not for /)."""
    out = []
    targets = ("op1", "op2", "both") + (("result",) if cells.op != "/" else ())
    for n in config.modulo_bases():
        for target in targets:
            if target == "both":
                ra, rb = cells.a % n, cells.b % n
                labels = np.where(ra == rb, ra, -1)
            else:
                labels = cells.values(target) % n
            hs = [Heuristic("modulo", target, (n, m)) for m in range(n)]
            out.append(partition(cells, labels, hs))
    return [p for p in out if p is not None]


MODULO = register(Family(
    name="modulo",
    doc="a residue `x = m (mod n)` of op1, op2, both operands (the same residue) or the "
        "result (not for `/`), n from the config's moduli",
    color="#ff7f0e",
    describe=lambda who, p: f"{who} = {p[1]} (mod {p[0]})",
    test=lambda x, p: x % p[0] == p[1],
    partitions=modulo_partitions,
    simplicity=2,
    rival_sets=True,
))
