"""Grid storage tiers: full 8-bit grids for the neurons that matter, sketches for the rest.

A layer's grids are almost all of a catalog's bytes (one byte per valid cell, 90,000
cells per operator at ``--hi 300``) and almost none of them are ever opened. So each
(neuron, operator) grid is stored in one of two tiers (``neuron_grid.sketch``):

- **full**: the 8-bit codes of schema.quantize, every valid cell, compressed with zstd,
  after a lossless 2-D prediction where that makes the frame smaller
  (schema.prediction). Reconstruction error at most ``scale / 2`` (half a code step),
  as before.
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
frame of the codes, 2 (full grids only) one zstd frame of a predictor's id (one byte,
1-based in ``schema.prediction.PREDICTORS``) and the residuals of the valid cells. A
sketch payload starts with ``b"S1"`` and the block size (uint16, little endian), then
the codes of the non-empty blocks (row-major), rows and columns; ``b"S2"`` the same with
the block codes replaced by their planar residuals over the block image and the row and
column codes by their successive differences (modulo 256), whichever compresses smaller.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zstandard

from schema.prediction import PREDICTORS, residuals, restore

SKETCH_SIDE = 32  # at most this many blocks along each axis
CODEC_RAW, CODEC_ZSTD, CODEC_PREDICTED = 0, 1, 2
ZSTD_LEVEL = 3
_MAGIC = b"S1"  # codes as they are
_MAGIC_PREDICTED = b"S2"  # block means planar-predicted, row and column means differenced
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
    def block_mask(self) -> np.ndarray:
        """(blocks_per_side, blocks_per_side) True where a block holds a valid cell."""
        mask = np.zeros(self.blocks_per_side ** 2, dtype=bool)
        mask[self.group_ids("block")] = True
        return mask.reshape(self.blocks_per_side, self.blocks_per_side)

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


def encode_full(q: np.ndarray, geometry: GridGeometry | None = None
                ) -> list[tuple[bytes, int]]:
    """(payload, codec) per row of 8-bit codes ``q`` (rows, valid cells): the smallest of
    the plain zstd frame and, given the grid's ``geometry``, the frames of each
    predictor's residuals (schema.prediction)."""
    c = _compressor()
    q = np.asarray(q, dtype=np.uint8)
    best = [(c.compress(row.tobytes()), CODEC_ZSTD) for row in q]
    if geometry is None or len(q) == 0:
        return best
    mask = geometry.valid.reshape(geometry.side, geometry.side)
    for s in range(0, len(q), _CHUNK):
        for pid, name in enumerate(PREDICTORS, start=1):
            res = residuals(q[s:s + _CHUNK], mask, name)
            for i, row in enumerate(res, start=s):
                data = c.compress(bytes([pid]) + row.tobytes())
                if len(data) < len(best[i][0]):
                    best[i] = (data, CODEC_PREDICTED)
    return best


def _predict_sketch(codes: np.ndarray, geometry: GridGeometry) -> np.ndarray:
    """(n, sketch codes) -> the same with the block means replaced by their planar
    residuals over the block image and the row and column means by their differences
    along the axis (schema.prediction): smooth maps pool into smooth sketches."""
    nb = len(geometry.group_ids("block"))
    nr = len(geometry.group_ids("row"))
    out = codes.copy()
    out[:, :nb] = residuals(codes[:, :nb], geometry.block_mask, "planar")
    for lo, hi in ((nb, nb + nr), (nb + nr, codes.shape[1])):
        out[:, lo + 1:hi] -= codes[:, lo:hi - 1]
    return out


def _restore_sketch(codes: np.ndarray, geometry: GridGeometry) -> np.ndarray:
    """The inverse of _predict_sketch for one sketch's codes."""
    nb = len(geometry.group_ids("block"))
    nr = len(geometry.group_ids("row"))
    out = codes.copy()
    out[:nb] = restore(codes[None, :nb], geometry.block_mask, "planar")[0]
    for lo, hi in ((nb, nb + nr), (nb + nr, len(codes))):
        out[lo:hi] = np.cumsum(codes[lo:hi], dtype=np.uint8)
    return out


def encode_sketches(values: np.ndarray, scale: np.ndarray, vmin: np.ndarray,
                    geometry: GridGeometry) -> list[bytes]:
    """One compressed sketch per row of float ``values`` (rows, valid cells), coded with
    each row's quantization ``scale`` and ``vmin`` (schema.quantize.quantize_rows): the
    smaller of the plain (``S1``) and the predicted (``S2``) coding."""
    c = _compressor()
    block = np.uint16(geometry.block).astype("<u2").tobytes()
    out: list[bytes] = []
    for s in range(0, len(values), _CHUNK):
        chunk = np.asarray(values[s:s + _CHUNK], dtype=np.float32)
        parts = [geometry.means(chunk, name) for name in ("block", "row", "col")]
        codes = _codes(np.concatenate(parts, axis=1), scale[s:s + _CHUNK], vmin[s:s + _CHUNK])
        predicted = _predict_sketch(codes, geometry)
        for plain, pred in zip(codes, predicted, strict=True):
            a = c.compress(_MAGIC + block + plain.tobytes())
            b = c.compress(_MAGIC_PREDICTED + block + pred.tobytes())
            out.append(b if len(b) < len(a) else a)
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
    """The decompressed bytes of a stored grid (for codec 2, the predictor's id and the
    residuals: ``full_codes`` turns them back into codes)."""
    if codec == CODEC_RAW:
        return bytes(data)
    if codec in (CODEC_ZSTD, CODEC_PREDICTED):
        return zstandard.ZstdDecompressor().decompress(bytes(data))
    raise ValueError(f"unknown grid codec {codec}; this catalog is newer than the code")


def full_codes(data: bytes, codec: int, geometry: GridGeometry) -> np.ndarray:
    """The 8-bit codes (valid cells, in layout order) of a stored full grid."""
    raw = payload(data, codec)
    predictor = None
    if codec == CODEC_PREDICTED:
        pid = raw[0] if raw else 0
        if not 1 <= pid <= len(PREDICTORS):
            raise ValueError(f"unknown grid predictor {pid}; this catalog is newer than "
                             "the code")
        predictor, raw = PREDICTORS[pid - 1], raw[1:]
    codes = np.frombuffer(raw, dtype=np.uint8)
    if len(codes) != geometry.n_cells:
        raise ValueError(f"full grid holds {len(codes)} codes, the layout has "
                         f"{geometry.n_cells} valid cells")
    if predictor is None:
        return codes
    mask = geometry.valid.reshape(geometry.side, geometry.side)
    return restore(codes[None, :], mask, predictor)[0]


def decode_cells(data: bytes, codec: int, sketch: bool, scale: float, vmin: float,
                 geometry: GridGeometry) -> StoredGrid:
    """A stored grid's values per valid cell, as a StoredGrid over the whole square."""
    side = geometry.side
    out = np.full(side * side, np.nan, dtype=np.float32)
    if not sketch:
        full = full_codes(data, codec, geometry)
        out[geometry.valid] = vmin + full.astype(np.float32) * np.float32(scale)
        return StoredGrid(out.reshape(side, side), False, 1)
    raw = payload(data, codec)
    if raw[:2] not in (_MAGIC, _MAGIC_PREDICTED):
        raise ValueError("not a grid sketch (bad header)")
    block = int(np.frombuffer(raw[2:4], dtype="<u2")[0])
    if block != geometry.block:
        raise ValueError(f"sketch block size {block} does not match the layout's "
                         f"{geometry.block}")
    stored = np.frombuffer(raw[4:], dtype=np.uint8)
    if len(stored) != geometry.sketch_length:
        raise ValueError(f"sketch holds {len(stored)} codes, the layout needs "
                         f"{geometry.sketch_length}")
    if raw[:2] == _MAGIC_PREDICTED:
        stored = _restore_sketch(stored, geometry)
    codes = stored.astype(np.float32) * np.float32(scale) + np.float32(vmin)
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
