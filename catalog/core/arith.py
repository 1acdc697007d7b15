"""Arithmetic ground truth: the four operators, their results and validity rules.

One place defines what a valid ``a op b`` cell is (docs/method.md section 1), so that the
trainer, the prompt grids and the heuristics can never disagree about it.
"""

from __future__ import annotations

import numpy as np

OPERATORS: tuple[str, ...] = ("+", "-", "*", "/")


def check_operator(op: str) -> str:
    """Return ``op`` if it is one of + - * /, else raise a ValueError naming the choices."""
    if op not in OPERATORS:
        raise ValueError(f"unknown operator {op!r}; choose from {', '.join(OPERATORS)}")
    return op


def apply_op(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Result of ``a op b`` elementwise; ``/`` is the integer part (b must be >= 1)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // np.maximum(b, 1)
    raise ValueError(f"unknown operator {op!r}; choose from {', '.join(OPERATORS)}")


def is_valid(op: str, a: np.ndarray, b: np.ndarray, limit: int) -> np.ndarray:
    """Boolean mask of valid cells (docs/method.md): results are non-negative and at most ``limit``.

    ``+``: a + b <= limit; ``-``: b <= a; ``*``: a * b <= limit; ``/``: b >= 1.
    For ``-`` and ``/`` the result never exceeds ``a``; cells whose result would
    still exceed the limit (only possible when operands do) are invalid too.
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if op == "+":
        return a + b <= limit
    if op == "-":
        return (b <= a) & (a - b <= limit)
    if op == "*":
        return a * b <= limit
    if op == "/":
        return (b >= 1) & (a // np.maximum(b, 1) <= limit)
    raise ValueError(f"unknown operator {op!r}; choose from {', '.join(OPERATORS)}")
