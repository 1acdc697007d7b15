"""The pattern family: digits at fixed places of the zero-padded three-digit number."""

from __future__ import annotations

import numpy as np

from catalog.labels.families import Family, register
from catalog.labels.heuristics import Cells, Heuristic, Partition, partition, value_targets

# Fixed-digit positions of the zero-padded 3-digit number; prefix patterns
# ("1..", "12.") are left to the range family, full numbers are values.
PATTERN_SHAPES = ((2,), (1,), (1, 2), (0, 2))


def pattern_partitions(cells: Cells, config) -> list[Partition]:
    """Digit patterns with wildcards, e.g. ``..3``, ``.2.``, ``1.3`` (not for / results)."""
    out = []
    scoring = "count" if config.heuristic_variant == "code" else "topk"
    seen: set[bytes] = set()
    for target in value_targets(cells.op):
        x = cells.values(target)
        digits = [(x // 100) % 10, (x // 10) % 10, x % 10]
        for shape in PATTERN_SHAPES:
            code = np.zeros_like(x)
            for pos in shape:
                code = code * 10 + digits[pos]
            labels = np.where(x < 1000, code, -1)
            # The same cell grouping under another shape (e.g. "0.3" when every
            # number is below 100) would only repeat heuristics: skip it.
            _, canon = np.unique(labels, return_inverse=True)
            sig = target.encode() + canon.astype(np.int64).tobytes()
            if sig in seen:
                continue
            seen.add(sig)
            hs = []
            for c in range(10 ** len(shape)):
                pat = ["."] * 3
                for i, pos in enumerate(shape):
                    pat[pos] = str((c // 10 ** (len(shape) - 1 - i)) % 10)
                hs.append(Heuristic("pattern", target, ("".join(pat),)))
            out.append(partition(cells, labels, hs, scoring=scoring))
    return [p for p in out if p is not None]


def matches_pattern(x: np.ndarray, p: tuple) -> np.ndarray:
    """Whether each number (below 1000) has the pattern's digits at its fixed places."""
    ok = x < 1000
    for pos, ch in enumerate(p[0]):
        if ch != ".":
            ok &= (x // 10 ** (2 - pos)) % 10 == int(ch)
    return ok


PATTERN = register(Family(
    name="pattern",
    doc="digits at fixed places of the three-digit number, e.g. `..3` (ends in 3), `.2.`, "
        "`1.3`, for op1, op2 and the result (not `/`'s)",
    color="#2ca02c",
    describe=lambda who, p: f"{who} matches {p[0]}",
    test=matches_pattern,
    partitions=pattern_partitions,
    simplicity=3,
    rival_sets=True,
))
