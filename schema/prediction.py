"""Lossless 2-D prediction of 8-bit grids, so that zstd sees small residuals.

An activation grid is an image over (operand a, operand b): neighbouring cells of a
trained neuron's map are usually close (ranges, stripes, smooth ramps). zstd alone codes
each byte with no idea of the cell above it, so it spends nearly 8 bits on a ramp.
Coding each cell as its difference from a prediction made of already-coded neighbours
turns ramps and plateaus into runs of small numbers, which zstd codes in a few bits,
and loses nothing: the decoder repeats the prediction and adds the residual back.

Three predictors, all of them exact in modular 8-bit arithmetic and vectorized both
ways (encoding is differences along an axis, decoding is cumulative sums):

- ``left``:   x[a, b] - x[a, b-1]
- ``up``:     x[a, b] - x[a-1, b]
- ``planar``: x[a, b] - (x[a-1, b] + x[a, b-1] - x[a-1, b-1]), the up-difference
  taken again to the left (the gradient predictor of lossless image coding).

Only the valid cells of an operator's grid exist (``b <= a`` for minus, ``a * b <=
limit`` for times, any mask in general). An invalid cell is given the value that makes
its residual 0: for ``left`` and ``up`` the last valid value before it along that axis
(a forward fill), for ``planar`` the same two fills in turn (the up-differences with
invalid cells filled from above, then their left-differences with invalid cells filled
from the left). The decoder knows the mask, so it puts the 0 residuals back before
summing. Residuals are stored for the valid cells only, in the grid layout's order. On
a grid with every cell valid, ``planar`` is exactly the gradient predictor above.

Noise gets no smaller this way (a difference of two noisy cells is noisier), so the
writer tries every predictor and none, and keeps the smallest (schema.sketch).
"""

from __future__ import annotations

import numpy as np

PREDICTORS = ("left", "up", "planar")


def _ffill_index(valid: np.ndarray, axis: int) -> np.ndarray:
    """(side, side): along ``axis``, the position of the last valid cell at or before each
    cell, -1 where there is none yet."""
    pos = np.arange(valid.shape[axis]).reshape((1, -1) if axis == 1 else (-1, 1))
    idx = np.where(valid, np.broadcast_to(pos, valid.shape), -1)
    return np.maximum.accumulate(idx, axis=axis)


def _ffill(img: np.ndarray, valid: np.ndarray, axis: int) -> np.ndarray:
    """Each invalid cell of ``img`` (n, side, side) takes the value of the last valid
    cell before it along ``axis`` of the (side, side) images, 0 where there is none."""
    idx = _ffill_index(valid, axis)
    got = np.take_along_axis(img, np.broadcast_to(np.maximum(idx, 0), img.shape), axis=axis + 1)
    return np.where(idx >= 0, got, np.uint8(0))


def _diff(x: np.ndarray, axis: int) -> np.ndarray:
    """x minus x shifted by one along ``axis`` of (n, side, side), 0 before the first cell,
    in wrapping uint8 arithmetic."""
    out = x.copy()
    if axis == 1:
        out[:, 1:, :] -= x[:, :-1, :]
    else:
        out[:, :, 1:] -= x[:, :, :-1]
    return out


def _image(cells: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(n, n_valid) cells scattered into (n, side, side) images, 0 elsewhere."""
    side = valid.shape[0]
    img = np.zeros((cells.shape[0], side * side), dtype=np.uint8)
    img[:, valid.reshape(-1)] = cells
    return img.reshape(-1, side, side)


def residuals(codes: np.ndarray, valid: np.ndarray, predictor: str) -> np.ndarray:
    """(n, n_valid) uint8 residuals of (n, n_valid) uint8 codes under ``predictor``;
    ``valid`` is the (side, side) mask whose True cells the codes fill, row-major."""
    img = _image(np.asarray(codes, dtype=np.uint8), valid)
    if predictor == "left":
        r = _diff(_ffill(img, valid, 1), 2)
    elif predictor == "up":
        r = _diff(_ffill(img, valid, 0), 1)
    elif predictor == "planar":
        vertical = _diff(_ffill(img, valid, 0), 1)  # 0 at invalid cells
        r = _diff(_ffill(vertical, valid, 1), 2)
    else:
        raise ValueError(f"unknown predictor {predictor!r}; known: {', '.join(PREDICTORS)}")
    return r.reshape(len(img), -1)[:, valid.reshape(-1)]


def restore(res: np.ndarray, valid: np.ndarray, predictor: str) -> np.ndarray:
    """The codes whose ``residuals`` are ``res`` (n, n_valid): the exact inverse."""
    img = _image(np.asarray(res, dtype=np.uint8), valid)
    if predictor == "left":
        x = np.cumsum(img, axis=2, dtype=np.uint8)
    elif predictor == "up":
        x = np.cumsum(img, axis=1, dtype=np.uint8)
    elif predictor == "planar":
        vertical = np.where(valid, np.cumsum(img, axis=2, dtype=np.uint8), np.uint8(0))
        x = np.cumsum(vertical, axis=1, dtype=np.uint8)
    else:
        raise ValueError(f"unknown predictor {predictor!r}; known: {', '.join(PREDICTORS)}")
    return x.reshape(len(img), -1)[:, valid.reshape(-1)]
