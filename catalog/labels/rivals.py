"""What a result label competes with: the explanations of a map that are not the result.

A result label says the neuron follows the operator's result. On a square grid most of
what makes max(op1, op2), min(op1, op2) or |op1 - op2| differ from an additive map is a
function of op1 + op2 (their non-additive parts are functions of |op1 - op2|, which the
sum's level sets cut), so removing both operands' main effects cannot tell them from the
sum; they must compete with the label by name. ``rival_axes`` lists them, one value per
cell on EVERY cell of the operator's grid, in forms that do not depend on the operands'
order (a rival masked to half of the grid, as op1 - op2 to op2 <= op1, never competes on
the other half):

- every other operator's result: op1 + op2, |op1 - op2|, op1 * op2, max // min (the
  larger operand divided by the smaller, -1 where the smaller is 0);
- the operands' order statistics: max(op1, op2) and min(op1, op2).

An axis is left out where it is not a rival on these cells: a function of the operator's
own result (on ``-`` prompts, where op2 <= op1, |op1 - op2| IS the result), a function of
one operand alone (there max is op1 and min op2: the additive fit has them), or the same
partition of the cells as an axis before it. Monotone transforms need no axis of their
own: sqrt(op1 * op2) has the product's windows and level sets.

The gate (``catalog.labels.gate``) scans every window of each axis and every residue and
digit-pattern set of its values as rivals of the label's set, beyond the operands; the
held-out comparison (``catalog.labels.operand_fit.OperandFit.explain``) fits each axis as
a factor that generalises to values a fold did not see (``FACTOR_BINS`` bins by rank
where an axis has more values: one mean per product value predicts nothing on products
it never saw).
"""

from __future__ import annotations

import numpy as np

# the order-free axes, in the order they are kept (an axis with the same partition as an
# earlier one is left out): each other operator's result, then the order statistics
AXES = ("op1 + op2", "|op1 - op2|", "op1 * op2", "max // min", "max(op1, op2)",
        "min(op1, op2)")
# the operator whose result each axis is, on cells where that result is defined
AXIS_OP = {"op1 + op2": "+", "|op1 - op2|": "-", "op1 * op2": "*", "max // min": "/"}
# the held-out comparison fits each axis (and the own result) as a factor of at most
# these many bins of its values by rank, each count a model of its own, the better one
# kept: fine bins follow residues and windows (the window scans use as many:
# ``additive.SCAN_BINS``), coarse ones a smooth trend that fine bins fit with too many
# parameters to predict held-out cells as well
FACTOR_BINS = (64, 16)
# the nested test (``OperandFit.beyond_rivals``) fits an axis with one mean per value
# where its values hold at least this many cells on average (the sum's parity on [0, 100)
# is then in the rival, as on smaller grids), else ``FACTOR_BINS[0]`` bins: one mean per
# product value nearly names the unordered operand pair and would leave no set anything
# to explain
CELLS_PER_VALUE = 8


def nested_levels(values: np.ndarray) -> np.ndarray:
    """Each cell's level of an axis in the nested test: its value, or ``FACTOR_BINS[0]``
    bins of the values by rank where they hold fewer than ``CELLS_PER_VALUE`` cells on
    average."""
    uniq, g = np.unique(values, return_inverse=True)
    g = g.reshape(-1)
    if len(values) < CELLS_PER_VALUE * len(uniq) and len(uniq) > FACTOR_BINS[0]:
        g = (g * FACTOR_BINS[0]) // len(uniq)
    return g


def width_levels(values: np.ndarray, bins: int) -> np.ndarray:
    """Each cell's bin of ``bins`` equal-width bins of the defined (non-negative) values; one
    level of its own for the undefined ones."""
    v = np.asarray(values, dtype=np.float64)
    ok = v >= 0
    out = np.full(len(v), bins, dtype=np.int64)
    if ok.any():
        lo, hi = v[ok].min(), v[ok].max()
        span = max(hi - lo, 1e-12)
        out[ok] = np.minimum(((v[ok] - lo) / span * bins).astype(np.int64), bins - 1)
    return np.unique(out, return_inverse=True)[1].reshape(-1)


def axis_values(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One axis's value on each cell (int64; -1 where it is undefined)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    if name == "op1 + op2":
        return a + b
    if name == "|op1 - op2|":
        return hi - lo
    if name == "op1 * op2":
        return a * b
    if name == "max // min":
        return np.where(lo > 0, hi // np.maximum(lo, 1), -1)
    if name == "max(op1, op2)":
        return hi
    if name == "min(op1, op2)":
        return lo
    raise ValueError(f"unknown rival axis {name!r}; choose from {', '.join(AXES)}")


def _pairs(x: np.ndarray, y: np.ndarray) -> int:
    """How many distinct (x, y) pairs the cells hold."""
    return len(np.unique(np.stack([x, y], 1), axis=0)) if len(x) else 0


def is_function_of(y: np.ndarray, x: np.ndarray) -> bool:
    """Whether ``y`` takes one value on each level of ``x`` (x's partition refines y's)."""
    return _pairs(x, y) == len(np.unique(x))


def rival_axes(a: np.ndarray, b: np.ndarray, result: np.ndarray) -> dict[str, np.ndarray]:
    """The rival axes of one operator's cells (op1 ``a``, op2 ``b``, the operator's
    ``result``), by name, in ``AXES`` order: those that are not a function of the result,
    of op1 alone or of op2 alone, and not the same partition of the cells as one kept
    before."""
    a, b, result = (np.asarray(x, dtype=np.int64) for x in (a, b, result))
    out: dict[str, np.ndarray] = {}
    for name in AXES:
        v = axis_values(name, a, b)
        if len(np.unique(v)) < 2 or any(is_function_of(v, x) for x in (result, a, b)):
            continue
        if any(is_function_of(v, w) and is_function_of(w, v) for w in out.values()):
            continue
        out[name] = v
    return out
