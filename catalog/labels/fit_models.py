"""Linear models of maps on one-hot groupings of a grid's cells (an operand's values, the
prompt's layout, an operator's result values), for ``catalog.labels.operand_fit``: the design
and its normal equations, and each model's held-out fit (folds of unordered operand
pairs), which ``Explanations`` reports per map."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from catalog.config.vocab import FOLDS, MAX_LEVELS

# one-hot designs with more cells x columns than this are kept sparse
DENSE_LIMIT = 20_000_000

def levels(values: np.ndarray, most: int = MAX_LEVELS) -> np.ndarray:
    """Each cell's group index: one per distinct value, or ``most`` bins of the distinct
    values by rank where there are more."""
    uniq, g = np.unique(values, return_inverse=True)
    g = g.reshape(-1)
    if len(uniq) > most:
        g = (g * most) // len(uniq)
    return g


class Design:
    """One-hot columns of several groupings of the cells, side by side: ``sums(y)`` is
    X'y for maps y (rows), dense or sparse by size; ``on_cells(c, upto)`` puts column
    values back on the cells."""

    def __init__(self, groups: list[np.ndarray], device) -> None:
        self.sizes = [int(g.max()) + 1 for g in groups]
        offsets = np.cumsum([0] + self.sizes[:-1])
        n_cells = len(groups[0])
        rows = np.concatenate([np.arange(n_cells)] * len(groups))
        cols = np.concatenate([g + o for g, o in zip(groups, offsets, strict=True)])
        self.width = int(sum(self.sizes))
        # each grouping's column of every cell, and where its block of columns ends
        self.cell_cols = [torch.as_tensor(g + o, device=device)
                          for g, o in zip(groups, offsets, strict=True)]
        self.ends = [int(o) + n for o, n in zip(offsets, self.sizes, strict=True)]
        self.dense = n_cells * self.width <= DENSE_LIMIT
        if self.dense:
            x = torch.zeros(n_cells, self.width, dtype=torch.float64, device=device)
            x[torch.as_tensor(rows, device=device), torch.as_tensor(cols, device=device)] = 1
            self.x = x
        else:
            idx = torch.as_tensor(np.stack([cols, rows]), device=device)
            self.xt = torch.sparse_coo_tensor(
                idx, torch.ones(len(rows), dtype=torch.float64, device=device),
                (self.width, n_cells)).coalesce()
        xtx = np.zeros((self.width, self.width))
        for gi, oi in zip(groups, offsets, strict=True):
            for gj, oj in zip(groups, offsets, strict=True):
                np.add.at(xtx, (gi + oi, gj + oj), 1.0)
        self.xtx = xtx

    def sums(self, y: torch.Tensor) -> torch.Tensor:
        """(n, width) X'y of each map."""
        if self.dense:
            return y @ self.x
        return torch.sparse.mm(self.xt, y.T).T

    def on_cells(self, c: torch.Tensor, upto: int) -> torch.Tensor:
        """(n, cells) X c with the groupings of the first ``upto`` columns (the
        coefficients' fit): a gather per grouping, dense or sparse alike."""
        out = torch.zeros(len(c), len(self.cell_cols[0]), dtype=c.dtype, device=c.device)
        for cols, end in zip(self.cell_cols, self.ends, strict=True):
            if end <= upto:
                out += c.index_select(1, cols)
        return out


def pair_folds(a: np.ndarray, b: np.ndarray, folds: int = FOLDS, seed: int = 0) -> np.ndarray:
    """Each cell's fold: unordered operand pairs ({a, b} and {b, a} together) dealt at
    random into ``folds`` folds. A map of a commutative operator is nearly symmetric, and
    a fit that saw (b, a) predicts (a, b) from it whatever it models: a factor whose
    levels nearly name the unordered pair (op1 * op2 on a large grid) would explain every
    symmetric map."""
    a, b = np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)
    key = np.minimum(a, b) * (int(np.abs(np.concatenate([a, b])).max()) + 1) * 2 \
        + np.maximum(a, b)
    uniq, pair = np.unique(key, return_inverse=True)
    deal = np.random.default_rng(seed).permutation(len(uniq)) % folds
    return deal[pair.reshape(-1)]


def held_out_r2(press: torch.Tensor, tss: torch.Tensor) -> torch.Tensor:
    """1 - held-out residual sum of squares over the held-out sum of squares about the
    training folds' mean (NaN for constant maps); can be negative."""
    out = 1.0 - press / tss.clamp(min=1e-300)
    return torch.where(tss > 1e-24, out, torch.full_like(out, float("nan")))


@dataclass
class Explanations:
    """Held-out R^2 (``OperandFit.explain``) of each competing explanation of some maps
    (rows): ``operands`` (f(op1) + g(op2) + the layout), ``result`` (one mean per value of
    this operator's result),
    ``joint`` (both), ``other`` (the best other operator's result with the operands) and
    ``other_op`` (which operator; '' where none was fit). NaN for constant maps."""

    operands: np.ndarray
    result: np.ndarray
    joint: np.ndarray
    other: np.ndarray
    other_op: np.ndarray  # str, one character or ''

    @classmethod
    def empty(cls, n: int = 0) -> Explanations:
        nan = np.full(n, np.nan)
        return cls(nan, nan.copy(), nan.copy(), nan.copy(), np.full(n, "", dtype="<U1"))


@dataclass
class FoldModel:
    """One explanation as a linear model on one-hot groupings of the cells, fit on each
    training fold (all cells but one fold) and judged on the held-out fold, through A_f,
    the pseudo-inverse of the training cells' normal equations (the designs are
    rank-deficient: each grouping sums to the constant, and a value no training cell has
    is a zero column; the pseudo-inverse gives the least-norm fit, which puts no weight
    on such directions). A held-out residual comes from the maps' sums per level and
    fold (``held_out_all``) in the cheaper of two ways: where the model is narrow
    against a fold, ``inverse`` holds [A_f | A_f G_f A_f] (G_f = X_f'X_f, the held-out
    fold's normal matrix); where it is wide, ``inverse`` holds P_f = X_f A_f, each
    held-out cell's prediction from the training sums (rows: the fold's cells, padded)."""

    groups: list[torch.Tensor]  # each cell's level per grouping
    keys: list[bytes]  # each grouping's identity (its levels' digest): models share them
    sizes: list[int]  # levels per grouping
    width: int
    folds: np.ndarray  # each cell's fold
    # narrow: (folds, width, 2 width); wide: (folds, width, most cells of a fold), float64
    inverse: torch.Tensor
    wide: bool = False

    @classmethod
    def of(cls, groups: list[np.ndarray], folds: np.ndarray, device) -> FoldModel:
        sizes = [int(g.max()) + 1 for g in groups]
        offsets = np.cumsum([0] + sizes[:-1])
        width = int(sum(sizes))
        n_folds = int(folds.max()) + 1
        per_fold = np.zeros((n_folds, width, width))
        for gi, oi in zip(groups, offsets, strict=True):
            for gj, oj in zip(groups, offsets, strict=True):
                np.add.at(per_fold, (folds, gi + oi, gj + oj), 1.0)
        total = per_fold.sum(0)
        cells_of, most = fold_cells(folds)
        # flops per map and fold: 2 width^2 narrow, width x the fold's cells wide
        wide = most < 2 * width
        out = []
        for f in range(n_folds):
            a = np.linalg.pinv(total - per_fold[f], hermitian=True)
            if wide:
                x_f = np.zeros((most, width))
                own = cells_of[f][cells_of[f] >= 0]
                for g, o in zip(groups, offsets, strict=True):
                    x_f[np.arange(len(own)), g[own] + o] = 1.0
                out.append(torch.as_tensor((x_f @ a).T))
            else:
                out.append(torch.as_tensor(np.concatenate([a, a @ per_fold[f] @ a], 1)))
        keys = [hashlib.sha1(np.ascontiguousarray(g, dtype=np.int64).tobytes()).digest()
                for g in groups]
        return cls([torch.as_tensor(g, device=device) for g in groups], keys, sizes, width,
                   folds, torch.stack(out).to(device), wide)


def fold_cells(folds: np.ndarray) -> tuple[np.ndarray, int]:
    """(folds, most) each fold's cells, padded with -1 to the largest fold's count."""
    n_folds = int(folds.max()) + 1
    counts = np.bincount(folds, minlength=n_folds)
    most = int(counts.max())
    out = np.full((n_folds, most), -1, dtype=np.int64)
    for f in range(n_folds):
        own = np.nonzero(folds == f)[0]
        out[f, :len(own)] = own
    return out, most


TSS = "__tss"  # held_out_all's key of the held-out sum of squares about the training mean


def held_out_all(models: dict[str, FoldModel], y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each model's held-out residual sum of squares of each map (rows of ``y``, float64),
    and under ``TSS`` the held-out sum of squares about the training folds' mean. The
    models share their folds (``pair_folds`` of the same cells) and most groupings: each
    grouping's sums per level and fold (s_f = X_f'y) are taken once (one scatter over
    every cell), and a fold's training sums are the total less its own (t_f). With
    c_f = A_f t_f the training fit's coefficients, a narrow model's held-out residual is
    |y_f - X_f c_f|^2 = y_f'y_f - 2 c_f's_f + c_f'G_f c_f (both terms from one batched
    product of t_f with [A_f | A_f G_f A_f]); a wide model's is |y_f - t_f P_f'|^2."""
    first = next(iter(models.values()))
    n, dev = len(y), y.device
    n_folds = first.inverse.shape[0]
    fold = torch.as_tensor(first.folds, device=dev)
    out: dict[str, torch.Tensor] = {}
    per_fold = torch.zeros(n, n_folds, dtype=torch.float64, device=dev).index_add_(1, fold, y)
    count = torch.bincount(fold, minlength=n_folds).to(torch.float64)
    train_mean = (per_fold.sum(1, keepdim=True) - per_fold) / (len(fold) - count)
    out[TSS] = ((y - train_mean.index_select(1, fold)) ** 2).sum(1)
    yy = torch.zeros(n, n_folds, dtype=torch.float64, device=dev).index_add_(1, fold, y * y)
    held: torch.Tensor | None = None  # (folds, n, most): each fold's cells, padded with 0
    own_sums: dict[bytes, torch.Tensor] = {}  # (folds, n, size): s_f per grouping
    for k, m in models.items():
        blocks = []
        for g, key, size in zip(m.groups, m.keys, m.sizes, strict=True):
            if key not in own_sums:
                s = torch.zeros(n, n_folds * size, dtype=torch.float64, device=dev)
                s.index_add_(1, fold * size + g, y)
                own_sums[key] = s.view(n, n_folds, size).transpose(0, 1)
            blocks.append(own_sums[key])
        own = torch.cat(blocks, 2)  # (folds, n, w)
        train = own.sum(0, keepdim=True) - own
        u = torch.bmm(train, m.inverse)
        if m.wide:
            if held is None:
                cells, _ = fold_cells(first.folds)
                padded = torch.cat([y, torch.zeros(n, 1, dtype=y.dtype, device=dev)], 1)
                at = torch.as_tensor(np.where(cells >= 0, cells, y.shape[1]), device=dev)
                held = padded[:, at.reshape(-1)].view(n, n_folds, -1).transpose(0, 1)
            press = ((held - u) ** 2).sum(2)  # padded cells: 0 - 0
        else:
            w = m.width
            press = yy.T - 2 * (u[:, :, :w] * own).sum(2) + (u[:, :, w:] * train).sum(2)
        out[k] = press.sum(0).clamp(min=0)
    return out
