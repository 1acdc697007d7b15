"""Maps that know only how the numbers are written (digit counts, first digits, token
counts): the token-format control of every label report (``catalog.labels.operator_labels``).
A label on such a map names the prompt's format, not its arithmetic."""

from __future__ import annotations

import numpy as np

FORMAT_KINDS = ("operands", "layout", "answer")


def number_format(values: np.ndarray, token_count=None) -> np.ndarray:
    """(cells, 3) how a number is written: its digit count, its first digit, its token
    count (``token_count``: value -> tokens; the digit count where not given)."""
    v = np.abs(np.asarray(values, dtype=np.int64))
    digits = np.where(v == 0, 1, np.floor(np.log10(np.maximum(v, 1))).astype(np.int64) + 1)
    first = v // 10 ** (digits - 1)
    tokens = digits if token_count is None else np.array([token_count(int(x)) for x in v])
    return np.stack([digits, first, tokens], axis=1)


def format_maps(kind: str, a: np.ndarray, b: np.ndarray, result: np.ndarray, n: int,
                gen: np.random.Generator, token_count=None, noise: float = 0.1) -> np.ndarray:
    """(n, cells) float32 maps that know only how the numbers are written, plus a little
    noise: ``operands``, a random function of op1's format plus one of op2's (digit count,
    first digit, token count: additive across the operands, as a token-count feature
    is); ``layout``, a random function of both operands' digit and token counts together
    ("both operands have two digits"); ``answer``, a random function of the answer's
    digit and token counts."""
    if kind == "operands":
        parts = [number_format(a, token_count), number_format(b, token_count)]
    elif kind == "layout":  # both operands' formats together: the prompt as written
        parts = [np.concatenate([number_format(a, token_count)[:, [0, 2]],
                                 number_format(b, token_count)[:, [0, 2]]], axis=1)]
    elif kind == "answer":
        f = number_format(result, token_count)
        parts = [f[:, [0, 2]]]
    else:
        raise ValueError(f"unknown format kind {kind!r}; known: {', '.join(FORMAT_KINDS)}")
    out = noise * gen.standard_normal((n, len(a)))
    for feats in parts:
        _, inv = np.unique(feats, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        out += gen.standard_normal((n, int(inv.max()) + 1))[:, inv]
    return out.astype(np.float32)
