"""8-bit grids: each activation grid stored as bytes with its own scale and offset.

Grids are the bulk of the catalog (one value per neuron, operator and prompt), so
each (neuron, operator) grid is stored as one byte per valid cell:
``q = round((x - vmin) / scale)`` with ``vmin = min(x)`` and
``scale = (max(x) - min(x)) / 255``. Reconstruction ``vmin + q * scale`` is off by
at most ``scale / 2``: 1/510 of the grid's own range (0.2%), which is far below what
a heatmap shows or a heuristic score depends on. A constant grid has scale 0 and is
reconstructed exactly.
"""

from __future__ import annotations

import numpy as np


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize each row of ``x`` (rows, cells): returns uint8 q, float32 scale and vmin."""
    x = np.asarray(x, dtype=np.float32)
    lo = x.min(axis=1)
    hi = x.max(axis=1)
    scale = ((hi - lo) / 255.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)
    q = np.rint((x - lo[:, None]) / safe[:, None])
    return np.clip(q, 0, 255).astype(np.uint8), scale, lo.astype(np.float32)


def dequantize(q: bytes | np.ndarray, scale: float, vmin: float) -> np.ndarray:
    """float32 values of one quantized grid."""
    arr = np.frombuffer(q, dtype=np.uint8) if isinstance(q, bytes | bytearray | memoryview) \
        else np.asarray(q, dtype=np.uint8)
    return (vmin + arr.astype(np.float32) * np.float32(scale)).astype(np.float32)


def max_error(scale: float) -> float:
    """Largest reconstruction error of a grid with this scale."""
    return scale / 2
