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


# the ridge of each fold's normal equations, relative to their mean diagonal: the
# designs are rank-deficient (each grouping sums to the constant; a value no training
# cell has is a zero column), and the ridge gives such directions no weight
RIDGE = 1e-9


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
    training fold (all cells but one fold) and judged on the held-out fold: per fold the
    inverse of the ridged normal equations (``RIDGE``)."""

    groups: list[torch.Tensor]  # each cell's level per grouping
    keys: list[bytes]  # each grouping's identity (its levels' digest): models share them
    sizes: list[int]  # levels per grouping
    width: int
    folds: np.ndarray  # each cell's fold
    inverse: torch.Tensor  # (folds, width, width) float64

    @classmethod
    def of(cls, groups: list[np.ndarray], folds: np.ndarray, device) -> FoldModel:
        sizes = [int(g.max()) + 1 for g in groups]
        offsets = np.cumsum([0] + sizes[:-1])
        width = int(sum(sizes))
        inverse = []
        for f in range(int(folds.max()) + 1):
            train = folds != f
            xtx = np.zeros((width, width))
            for gi, oi in zip(groups, offsets, strict=True):
                for gj, oj in zip(groups, offsets, strict=True):
                    np.add.at(xtx, (gi[train] + oi, gj[train] + oj), 1.0)
            lam = RIDGE * max(float(np.trace(xtx)) / width, 1.0)
            chol = torch.linalg.cholesky(torch.as_tensor(xtx + lam * np.eye(width)))
            inverse.append(torch.cholesky_inverse(chol))
        keys = [hashlib.sha1(np.ascontiguousarray(g, dtype=np.int64).tobytes()).digest()
                for g in groups]
        return cls([torch.as_tensor(g, device=device) for g in groups], keys, sizes, width,
                   folds, torch.stack(inverse).to(device))


TSS = "__tss"  # held_out_all's key of the held-out sum of squares about the training mean


def held_out_all(models: dict[str, FoldModel], y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each model's held-out residual sum of squares of each map (rows of ``y``, float64),
    and under ``TSS`` the held-out sum of squares about the training folds' mean. The
    models share their folds (``pair_folds`` of the same cells) and most groupings: each
    grouping's sums per fold are taken once (one scatter over every cell), a fold's
    training sums are the total less its own, and each model's coefficients of every fold
    come from one batched product, read back on each cell from its own fold's."""
    first = next(iter(models.values()))
    n, dev = len(y), y.device
    n_folds = first.inverse.shape[0]
    fold = torch.as_tensor(first.folds, device=dev)
    out: dict[str, torch.Tensor] = {}
    per_fold = torch.zeros(n, n_folds, dtype=torch.float64, device=dev).index_add_(1, fold, y)
    count = torch.bincount(fold, minlength=n_folds).to(torch.float64)
    train_mean = (per_fold.sum(1, keepdim=True) - per_fold) / (len(fold) - count)
    out[TSS] = ((y - train_mean.index_select(1, fold)) ** 2).sum(1)
    train_sums: dict[bytes, torch.Tensor] = {}
    for k, m in models.items():
        blocks = []
        for g, key, size in zip(m.groups, m.keys, m.sizes, strict=True):
            if key not in train_sums:
                s = torch.zeros(n, n_folds * size, dtype=torch.float64, device=dev)
                s.index_add_(1, fold * size + g, y)
                s = s.view(n, n_folds, size)
                train_sums[key] = s.sum(1, keepdim=True) - s
            blocks.append(train_sums[key])
        coef = torch.bmm(torch.cat(blocks, 2).transpose(0, 1), m.inverse)  # (folds, n, w)
        flat = coef.transpose(0, 1).reshape(n, n_folds * m.width)
        pred = torch.zeros_like(y)
        offset = 0
        for g, size in zip(m.groups, m.sizes, strict=True):
            pred += flat.index_select(1, fold * m.width + offset + g)
            offset += size
        out[k] = ((y - pred) ** 2).sum(1)
    return out
