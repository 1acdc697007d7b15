"""Grid tiers (schema.sketch): full grids round-trip exactly, sketches equal a slow
reference (block means, row and column means) to within half a code step."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

from schema.quantize import max_error, quantize_rows
from schema.sketch import (
    CODEC_RAW,
    CODEC_ZSTD,
    SKETCH_SIDE,
    GridGeometry,
    block_size,
    decode_cells,
    encode_full,
    encode_sketches,
)

from reference import sketch_reference


def _geometry(side: int, kind: str, rng) -> GridGeometry:
    a, b = np.divmod(np.arange(side * side), side)
    if kind == "all":
        valid = np.ones(side * side, dtype=bool)
    elif kind == "minus":  # a - b >= 0: a triangle
        valid = a >= b
    elif kind == "divide":  # b > 0 and b divides a: sparse, empty blocks and columns
        valid = (b > 0) & (a % np.maximum(b, 1) == 0)
    else:
        valid = rng.random(side * side) < 0.3
    return GridGeometry(side, valid)


@pytest.mark.parametrize("side", [7, 32, 33, 100, 300])
@pytest.mark.parametrize("kind", ["all", "minus", "divide", "random"])
@pytest.mark.parametrize("pattern", ["noise", "smooth"])
def test_sketch_equals_the_slow_reference(side, kind, pattern):
    """Noise is stored as plain codes (S1), smooth maps mostly predicted (S2): either
    way the decoded sketch equals the slow reference within half a code step."""
    rng = np.random.default_rng(side)
    g = _geometry(side, kind, rng)
    values = rng.standard_normal((5, g.n_cells)).astype(np.float32) * 3 + 1
    if pattern == "smooth":
        a, b = np.divmod(np.nonzero(g.valid)[0], side)
        values = np.stack([np.sin(a / (5 + i)) * np.cos(b / (9 + i)) + a / side
                           for i in range(5)]).astype(np.float32)
    values[1] = 2.5  # a constant grid: scale 0, reconstructed exactly
    q, scale, vmin = quantize_rows(values)
    sketches = encode_sketches(values, scale, vmin, g)
    assert g.block == block_size(side) and -(-side // g.block) <= SKETCH_SIDE
    for i, data in enumerate(sketches):
        got = decode_cells(data, CODEC_ZSTD, True, scale[i], vmin[i], g)
        grid = np.full(side * side, np.nan, dtype=np.float64)
        grid[g.valid] = values[i]
        cells, rows, cols = sketch_reference(grid.reshape(side, side), g.block)
        tol = max_error(float(scale[i])) + 1e-5
        assert got.sketch and got.block == g.block
        assert np.array_equal(np.isnan(got.values), np.isnan(cells))
        np.testing.assert_allclose(got.values[np.isfinite(cells)], cells[np.isfinite(cells)],
                                   atol=tol, rtol=0)
        assert got.row_means is not None and got.col_means is not None
        for mine, ref in ((got.row_means, rows), (got.col_means, cols)):
            assert np.array_equal(np.isnan(mine), np.isnan(ref))
            np.testing.assert_allclose(mine[np.isfinite(ref)], ref[np.isfinite(ref)],
                                       atol=tol, rtol=0)
    if kind == "all":  # the sketch is far smaller than the grid
        assert max(len(s) for s in sketches) <= 4 + SKETCH_SIDE ** 2 + 2 * side + 64
    heads = [zstandard.ZstdDecompressor().decompress(d)[:2] for d in sketches]
    if pattern == "noise":
        assert heads.count(b"S1") >= 4
    elif side >= 100 and kind in ("all", "minus"):
        assert heads.count(b"S2") >= 3  # the smooth ones, not the constant one


def test_full_grids_round_trip_within_half_a_step():
    rng = np.random.default_rng(0)
    g = _geometry(50, "minus", rng)
    values = rng.standard_normal((4, g.n_cells)).astype(np.float32)
    q, scale, vmin = quantize_rows(values)
    for i, (data, codec) in enumerate(encode_full(q, g)):
        got = decode_cells(data, codec, False, scale[i], vmin[i], g)
        assert not got.sketch and got.row_means is None
        assert np.abs(got.values.reshape(-1)[g.valid] - values[i]).max() <= \
            max_error(float(scale[i])) + 1e-6
        # the same codes as the raw bytes catalogs stored before the tiers
        raw = decode_cells(q[i].tobytes(), CODEC_RAW, False, scale[i], vmin[i], g)
        assert np.array_equal(raw.values, got.values, equal_nan=True)


def test_a_sketch_of_the_wrong_layout_is_refused():
    rng = np.random.default_rng(1)
    g = _geometry(40, "all", rng)
    values = rng.standard_normal((1, g.n_cells)).astype(np.float32)
    q, scale, vmin = quantize_rows(values)
    (data,) = encode_sketches(values, scale, vmin, g)
    with pytest.raises(ValueError, match="block size"):
        decode_cells(data, CODEC_ZSTD, True, scale[0], vmin[0], _geometry(100, "all", rng))
    with pytest.raises(ValueError, match="codes"):
        decode_cells(data, CODEC_ZSTD, True, scale[0], vmin[0], _geometry(40, "minus", rng))
    with pytest.raises(ValueError, match="codec"):
        decode_cells(data, 7, True, scale[0], vmin[0], g)
