"""Grid storage tiers: full 8-bit grids for the neurons that matter, sketches for the rest.

A layer's grids are almost all of a catalog's bytes (one byte per valid cell, 90,000
cells per operator at ``--hi 300``) and almost none of them are ever opened. So each
(neuron, operator) grid is stored in one of two tiers (``neuron_grid.sketch``):

- **full**: the 8-bit codes of schema.quantize, every valid cell, compressed with zstd.
  Reconstruction error at most ``scale / 2`` (half a code step), as before.
- **sketch**: the grid pooled into blocks of ``B x B`` cells, ``B = ceil(side / 32)``
  (so at most 32 x 32 blocks; each block the mean of its valid cells), plus the mean of
  every row (operand a) and of every column (operand b) at full resolution. All three
  are coded with the grid's own scale and minimum (a mean lies within the grid's range),
  so a sketch costs at most 1,024 + 2 * side bytes before compression.

Which neurons get full grids is the config's ``full_grids`` (the top N per layer and
operator by rank, by default the circuit size); any other neuron can be filled in later
(a "full grid" job, ``ncat enqueue --full-grid``). Matching always runs on the full
grids in the worker, before storage, so the tier changes only what is drawn.

Payloads: ``codec`` 0 is raw bytes (catalogs written before the tiers), 1 is one zstd
frame. A sketch payload starts with ``b"S1"`` and the block size (uint16, little
endian), then the codes of the non-empty blocks (row-major), rows and columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zstandard

SKETCH_SIDE = 32  # at most this many blocks along each axis
CODEC_RAW, CODEC_ZSTD = 0, 1
ZSTD_LEVEL = 3
_MAGIC = b"S1"
_CHUNK = 256  # neurons pooled at once (bounds memory at 256 x cells x 4 bytes)


def block_size(side: int) -> int:
    """Cells per block side: the smallest B with ceil(side / B) <= SKETCH_SIDE."""
    return max(1, -(-side // SKETCH_SIDE))


@dataclass(frozen=True)
class GridGeometry:
    """Where each valid cell of one operator's grid falls: its row, column and block."""

    side: int
    valid: np.ndarray  # (side * side,) bool, row-major (a, then b)

    @classmethod
    def from_packed(cls, side: int, packed: bytes) -> GridGeometry:
        mask = np.unpackbits(np.frombuffer(packed, dtype=np.uint8))[: side * side]
        return cls(side, mask.astype(bool))

    @cached_property
    def block(self) -> int:
        return block_size(self.side)

    @cached_property
    def blocks_per_side(self) -> int:
        return -(-self.side // self.block)

    @cached_property
    def _cells(self) -> tuple[np.ndarray, np.ndarray]:
        idx = np.nonzero(self.valid)[0]
        return idx // self.side, idx % self.side

    @cached_property
    def n_cells(self) -> int:
        return int(self.valid.sum())

    @cached_property
    def cell_block(self) -> np.ndarray:
        a, b = self._cells
        return (a // self.block) * self.blocks_per_side + b // self.block

    @cached_property
    def _groups(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per grouping (block, row, col): the cell order that makes each group
        contiguous, the group starts in that order, their sizes, and the groups' ids."""
        a, b = self._cells
        out = {}
        for name, key in (("block", self.cell_block), ("row", a), ("col", b)):
            order = np.argsort(key, kind="stable")
            ids, starts, counts = np.unique(key[order], return_index=True, return_counts=True)
            out[name] = (order, starts, counts, ids)
        return out

    def group_ids(self, name: str) -> np.ndarray:
        return self._groups[name][3]

    def means(self, values: np.ndarray, name: str) -> np.ndarray:
        """(n, groups) mean of ``values`` (n, n_cells) over each non-empty group."""
        order, starts, counts, _ = self._groups[name]
        if len(starts) == 0:
            return np.zeros((len(values), 0), dtype=np.float64)
        sums = np.add.reduceat(values[:, order].astype(np.float64), starts, axis=1)
        return sums / counts

    @cached_property
    def sketch_length(self) -> int:
        """Codes in one sketch: non-empty blocks, rows and columns."""
        return sum(len(self.group_ids(n)) for n in ("block", "row", "col"))


def _codes(x: np.ndarray, scale: np.ndarray, vmin: np.ndarray) -> np.ndarray:
    safe = np.where(scale > 0, scale, 1.0)
    q = np.rint((x - vmin[:, None]) / safe[:, None])
    return np.clip(q, 0, 255).astype(np.uint8)


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL)


def encode_full(q: np.ndarray) -> list[bytes]:
    """One zstd frame per row of 8-bit codes (rows, cells)."""
    c = _compressor()
    return [c.compress(row.tobytes()) for row in q]


def encode_sketches(values: np.ndarray, scale: np.ndarray, vmin: np.ndarray,
                    geometry: GridGeometry) -> list[bytes]:
    """One compressed sketch per row of float ``values`` (rows, valid cells), coded with
    each row's quantization ``scale`` and ``vmin`` (schema.quantize.quantize_rows)."""
    c = _compressor()
    head = _MAGIC + np.uint16(geometry.block).astype("<u2").tobytes()
    out: list[bytes] = []
    for s in range(0, len(values), _CHUNK):
        chunk = np.asarray(values[s:s + _CHUNK], dtype=np.float32)
        parts = [geometry.means(chunk, name) for name in ("block", "row", "col")]
        codes = _codes(np.concatenate(parts, axis=1), scale[s:s + _CHUNK], vmin[s:s + _CHUNK])
        out.extend(c.compress(head + row.tobytes()) for row in codes)
    return out


@dataclass
class StoredGrid:
    """One grid as read back. ``values`` is (side, side), NaN where the cell is invalid;
    for a sketch each valid cell holds its block's mean (``block`` cells per side)."""

    values: np.ndarray
    sketch: bool
    block: int
    row_means: np.ndarray | None = None  # (side,) mean over b of each a; NaN if no cells
    col_means: np.ndarray | None = None  # (side,) mean over a of each b


def payload(data: bytes, codec: int) -> bytes:
    """The decompressed bytes of a stored grid."""
    if codec == CODEC_RAW:
        return bytes(data)
    if codec == CODEC_ZSTD:
        return zstandard.ZstdDecompressor().decompress(bytes(data))
    raise ValueError(f"unknown grid codec {codec}; this catalog is newer than the code")


def decode_cells(data: bytes, codec: int, sketch: bool, scale: float, vmin: float,
                 geometry: GridGeometry) -> StoredGrid:
    """A stored grid's values per valid cell, as a StoredGrid over the whole square."""
    raw = payload(data, codec)
    side = geometry.side
    out = np.full(side * side, np.nan, dtype=np.float32)
    if not sketch:
        full = np.frombuffer(raw, dtype=np.uint8)
        out[geometry.valid] = vmin + full.astype(np.float32) * np.float32(scale)
        return StoredGrid(out.reshape(side, side), False, 1)
    if raw[:2] != _MAGIC:
        raise ValueError("not a grid sketch (bad header)")
    block = int(np.frombuffer(raw[2:4], dtype="<u2")[0])
    if block != geometry.block:
        raise ValueError(f"sketch block size {block} does not match the layout's "
                         f"{geometry.block}")
    codes = np.frombuffer(raw[4:], dtype=np.uint8).astype(np.float32) * np.float32(scale) \
        + np.float32(vmin)
    if len(codes) != geometry.sketch_length:
        raise ValueError(f"sketch holds {len(codes)} codes, the layout needs "
                         f"{geometry.sketch_length}")
    nb = len(geometry.group_ids("block"))
    nr = len(geometry.group_ids("row"))
    per_block = np.full(geometry.blocks_per_side ** 2, np.nan, dtype=np.float32)
    per_block[geometry.group_ids("block")] = codes[:nb]
    out[geometry.valid] = per_block[geometry.cell_block]
    rows = np.full(side, np.nan, dtype=np.float32)
    rows[geometry.group_ids("row")] = codes[nb:nb + nr]
    cols = np.full(side, np.nan, dtype=np.float32)
    cols[geometry.group_ids("col")] = codes[nb + nr:]
    return StoredGrid(out.reshape(side, side), True, block, rows, cols)


def sketch_reference(grid: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slow reference of a sketch from a (side, side) grid with NaN for invalid cells:
    per-cell block means, row means and column means (NaN where a group is empty)."""
    side = grid.shape[0]
    out = np.full_like(grid, np.nan)
    for i in range(0, side, block):
        for j in range(0, side, block):
            tile = grid[i:i + block, j:j + block]
            if np.isfinite(tile).any():
                m = np.nanmean(tile)
                out[i:i + block, j:j + block] = np.where(np.isfinite(tile), m, np.nan)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            rows, cols = np.nanmean(grid, axis=1), np.nanmean(grid, axis=0)
    return out, rows, cols
