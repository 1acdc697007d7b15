"""2-D prediction of 8-bit grids (schema.prediction) against a slow cell-by-cell
reference, exact round trips on every kind of mask, and the writer's choice of codec
(schema.sketch.encode_full): smooth maps get smaller, noise never gets larger."""

from __future__ import annotations

import numpy as np
import pytest

from schema.prediction import PREDICTORS, residuals, restore
from schema.sketch import CODEC_PREDICTED, CODEC_ZSTD, GridGeometry, encode_full, full_codes


def _mask(side: int, kind: str, rng) -> np.ndarray:
    a, b = np.divmod(np.arange(side * side), side)
    valid = {"all": np.ones(side * side, dtype=bool), "minus": a >= b,
             "times": a * b <= side, "divide": (b > 0) & (a % np.maximum(b, 1) == 0),
             "random": rng.random(side * side) < 0.3,
             "none": np.zeros(side * side, dtype=bool)}[kind]
    return valid.reshape(side, side)


def _fill_then_diff(x: np.ndarray, valid: np.ndarray, axis: int) -> np.ndarray:
    """Cell by cell: invalid cells take the previous cell's value along ``axis`` (0 at the
    edge); then each cell minus the previous one, modulo 256."""
    side = x.shape[0]
    filled = np.zeros_like(x, dtype=np.int64)
    out = np.zeros_like(x, dtype=np.int64)
    for i in range(side):
        for j in range(side):
            prev_pos = (i - 1, j) if axis == 0 else (i, j - 1)
            prev = filled[prev_pos] if min(prev_pos) >= 0 else 0
            filled[i, j] = x[i, j] if valid[i, j] else prev
            out[i, j] = (filled[i, j] - prev) % 256
    return out


def _slow(codes: np.ndarray, valid: np.ndarray, predictor: str) -> np.ndarray:
    side = valid.shape[0]
    x = np.zeros((side, side), dtype=np.int64)
    x[valid] = codes
    if predictor == "left":
        r = _fill_then_diff(x, valid, 1)
    elif predictor == "up":
        r = _fill_then_diff(x, valid, 0)
    else:
        r = _fill_then_diff(_fill_then_diff(x, valid, 0), valid, 1)
    return r[valid].astype(np.uint8)


@pytest.mark.parametrize("kind", ["all", "minus", "times", "divide", "random", "none"])
@pytest.mark.parametrize("side", [1, 2, 9, 31])
def test_residuals_equal_the_cell_by_cell_reference_and_invert(side, kind):
    rng = np.random.default_rng(side)
    valid = _mask(side, kind, rng)
    codes = rng.integers(0, 256, (3, int(valid.sum())), dtype=np.uint8)
    for predictor in PREDICTORS:
        got = residuals(codes, valid, predictor)
        for i in range(len(codes)):
            assert np.array_equal(got[i], _slow(codes[i], valid, predictor)), predictor
        assert np.array_equal(restore(got, valid, predictor), codes), predictor


def test_planar_is_the_gradient_predictor_on_a_full_grid():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (12, 12)).astype(np.int64)
    pad = np.zeros((13, 13), dtype=np.int64)
    pad[1:, 1:] = x
    want = (x - pad[:-1, 1:] - pad[1:, :-1] + pad[:-1, :-1]) % 256
    got = residuals(x.reshape(1, -1).astype(np.uint8), np.ones((12, 12), dtype=bool), "planar")
    assert np.array_equal(got[0], want.reshape(-1))


def test_unknown_predictor_is_named():
    with pytest.raises(ValueError, match="'diagonal'"):
        residuals(np.zeros((1, 4), dtype=np.uint8), np.ones((2, 2), dtype=bool), "diagonal")


def test_the_writer_keeps_the_smallest_frame_and_every_code():
    """A smooth map and a blocky one come out predicted and smaller than plain zstd;
    noise stays plain zstd; every grid decodes to its exact codes on a triangle mask."""
    side = 120
    rng = np.random.default_rng(0)
    valid = _mask(side, "minus", rng)
    a, b = np.nonzero(valid)
    smooth = 127 + 100 * np.sin(a / 17) * np.cos(b / 23)
    blocks = ((a // 10) % 3) * 80.0 + ((b // 7) % 2) * 40.0
    noise = rng.random(len(a)) * 255
    q = np.clip(np.rint(np.stack([smooth, blocks, noise])), 0, 255).astype(np.uint8)
    geometry = GridGeometry(side, valid.reshape(-1))
    coded = encode_full(q, geometry)
    plain = encode_full(q)
    assert [c for _, c in plain] == [CODEC_ZSTD] * 3
    assert coded[0][1] == coded[1][1] == CODEC_PREDICTED
    assert len(coded[0][0]) < 0.7 * len(plain[0][0])
    assert len(coded[1][0]) < len(plain[1][0])
    assert coded[2] == plain[2]  # prediction would only add to noise
    for (data, codec), want in zip(coded, q, strict=True):
        assert np.array_equal(full_codes(data, codec, geometry), want)


def test_a_bad_predictor_id_or_length_is_refused():
    import zstandard

    geometry = GridGeometry(4, np.ones(16, dtype=bool))
    c = zstandard.ZstdCompressor()
    with pytest.raises(ValueError, match="predictor 9"):
        full_codes(c.compress(bytes([9]) + bytes(16)), CODEC_PREDICTED, geometry)
    with pytest.raises(ValueError, match="holds 15 codes"):
        full_codes(c.compress(bytes([1]) + bytes(15)), CODEC_PREDICTED, geometry)
