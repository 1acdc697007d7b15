"""Linear models of maps on one-hot groupings of a grid's cells (an operand's values, the
prompt's layout, an operator's result values), for ``catalog.labels.operand_fit``: the design
and its normal equations, and each model's held-out fit (folds of unordered operand
pairs), which ``Explanations`` reports per map."""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.config.vocab import FOLDS, MAX_LEVELS
from catalog.core.digest import array_digest
from catalog.labels import fit_store

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


def held_bytes(obj, seen: set | None = None) -> int:
    """The bytes of the tensors and arrays an object holds (through its attributes,
    dicts, lists and tuples; a sparse tensor by its indices and values)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse:
            return held_bytes(obj._indices(), seen) + held_bytes(obj._values(), seen)
        return obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(held_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(held_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__"):
        return held_bytes(vars(obj), seen)
    return 0


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
                (self.width, n_cells), check_invariants=False).coalesce()
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
        coefficients' fit): one product with the design where it is dense (a gather per
        grouping reads the coefficients cell by cell, several times slower), else a
        gather per grouping."""
        if self.dense:
            k = max([e for e in self.ends if e <= upto], default=0)
            return c[:, :k] @ self.x[:, :k].T
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


# held-out R^2 within this of the best rival's is a tie (``Explanations.best_rival``)
RIVAL_TIE = 1e-6


@dataclass
class Explanations:
    """Held-out R^2 (``OperandFit.explain``) of each competing explanation of some maps
    (rows): ``operands`` (f(op1) + g(op2) + the layout), ``result`` (one mean per value of
    this operator's result), ``joint`` (both; the own result by value or by bins,
    whichever predicts better), ``other`` (the best rival with the operands: another
    operator's result or an interaction of the operands, ``catalog.labels.rivals``) and
    ``other_op`` (that rival's name; '' where none was fit). NaN for constant maps."""

    operands: np.ndarray
    result: np.ndarray
    joint: np.ndarray
    other: np.ndarray
    other_op: np.ndarray  # str (object): a rival axis's name, or ''
    # each rival axis's held-out R^2 (with the operands), by name: not stored, for the
    # rule's comparison of each label with the rivals that are not its aliases
    rivals: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def empty(cls, n: int = 0) -> Explanations:
        nan = np.full(n, np.nan)
        return cls(nan, nan.copy(), nan.copy(), nan.copy(), np.full(n, "", dtype=object))

    def best_rival(self, leave_out: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Per map, the best rival's held-out R^2 and name, ``leave_out`` left out (NaN
        and '' where none is left)."""
        names = [o for o in self.rivals if o not in leave_out]
        n = len(self.joint)
        if not names:
            return np.full(n, np.nan), np.full(n, "", dtype=object)
        stack = np.stack([np.nan_to_num(self.rivals[o], nan=-np.inf) for o in names])
        best = stack.max(0)
        # rivals within RIVAL_TIE of the best are one tie, named by the first in the fixed
        # order: max and min fit some maps equally (equal in exact arithmetic), and which
        # of the two came out ahead by a rounding followed the thread count
        which = (stack >= best - RIVAL_TIE).argmax(0)
        return (np.where(np.isinf(best), np.nan, best),
                np.where(np.isinf(best), "", np.array(names, dtype=object)[which]))


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
    held-out cell's prediction from the training sums (rows: the fold's cells, padded).
    ``inverse`` is float32 (the products run on maps less their mean, in float32, at
    about twice float64's rate); what the mean contributes is taken exactly, in float64,
    from ``const_press`` and ``const_cross`` (``held_out_all``)."""

    groups: list[torch.Tensor]  # each cell's level per grouping
    keys: list[bytes]  # each grouping's identity (its levels' digest): models share them
    sizes: list[int]  # levels per grouping
    width: int
    folds: np.ndarray  # each cell's fold
    # narrow: (folds, width, 2 width); wide: (folds, width, most cells of a fold), float32
    inverse: torch.Tensor
    # the held-out residual of the constant map 1 is e (nonzero where a held-out cell has
    # a level no training cell has: the least-norm fit predicts it a shrunken constant);
    # const_press = |e|^2, and const_cross (cells, float64) is w with e . r(y) = w . y for
    # every map y (r(y): y's held-out residual), so that the held-out residual sum of
    # squares of mu + y is that of y + 2 mu w . y + mu^2 |e|^2
    const_press: float = 0.0
    const_cross: torch.Tensor = field(
        default_factory=lambda: torch.zeros(0, dtype=torch.float64))
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
        col = np.stack([g + o for g, o in zip(groups, offsets, strict=True)], 1)
        cross, const_press = np.zeros(len(folds)), 0.0
        for f in range(n_folds):
            a = np.linalg.pinv(total - per_fold[f], hermitian=True)
            const_press += _constant_terms(a, col, folds == f, width, cross)
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
                   folds, torch.stack(out).to(device, torch.float32), const_press,
                   torch.as_tensor(cross, device=device), wide)


# the fold models some fit of this process holds, by what they are built from: fits of
# one grid share most (``+`` and ``*`` on the same cells: every model but their own
# result's); a model no fit holds any more is freed
_MODELS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def fold_model(groups: list[np.ndarray], folds: np.ndarray, device) -> FoldModel:
    """``FoldModel.of(groups, folds, device)``, the same object for the same groupings
    (as partitions of the cells, level numbers included), folds and device while any
    holder keeps it, and on disk for the next process (``catalog.labels.fit_store``)."""
    key = (array_digest(*(np.asarray(x, dtype=np.int64) for x in (*groups, folds))),
           str(device))
    model = _MODELS.get(key)
    if model is None:
        model = fit_store.load("fold-model", key, FoldModel, device)
        if model is None:
            model = FoldModel.of(groups, folds, device)
            fit_store.save("fold-model", key, model, held_bytes(model))
        _MODELS[key] = model
    return model


def _constant_terms(a: np.ndarray, col: np.ndarray, held: np.ndarray, width: int,
                    cross: np.ndarray) -> float:
    """One fold's part of ``FoldModel.const_press`` (returned) and ``const_cross`` (added
    to ``cross``): ``a`` the training cells' pseudo-inverse, ``col`` each cell's column
    per grouping, ``held`` the fold's cells. With e the constant's held-out residual,
    e . r_f(y) = e . y_f - (A X_f' e) . (X_t' y_t) (X_t, y_t: the training cells')."""
    train = ~held
    coef = a @ np.bincount(col[train].ravel(), minlength=width)  # the fit to 1
    e = 1.0 - coef[col[held]].sum(1)
    v = a @ np.bincount(col[held].ravel(), weights=np.repeat(e, col.shape[1]),
                        minlength=width)
    cross[held] += e
    cross[train] -= v[col[train]].sum(1)
    return float(e @ e)


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
    """Each model's held-out residual sum of squares of each map (rows of ``y``, float32 or
    float64, taken as their values; float64 out), and under ``TSS`` the held-out sum of
    squares about the training folds' mean.
    The maps less their means are fit in float32 (the residuals' sums of squares within
    about 1e-5 of their sums of squares, against a float64 fit); each mean's part is added
    exactly (``FoldModel.const_press``, ``const_cross``). The
    models share their folds (``pair_folds`` of the same cells) and most groupings: each
    distinct grouping's sums per level and fold (s_f = X_f'y) are taken once, side by
    side (one scatter of the cells per grouping), and a fold's training sums are the
    total less its own (t_f). With c_f = A_f t_f the training fit's coefficients, a narrow
    model's held-out residual is |y_f - X_f c_f|^2 = y_f'y_f - 2 c_f's_f + c_f'G_f c_f
    (both terms from one batched product of t_f with [A_f | A_f G_f A_f]); a wide model's
    is |y_f - P_f t_f|^2, the product accumulated onto y_f. A model reads its groupings'
    sums where they lie (the runs of ``_runs``), so no model's sums are copied; the maps
    run along the last axis throughout (each fold's cells are rows to gather)."""
    first = next(iter(models.values()))
    n, n_cells, dev = len(y), y.shape[1], y.device
    n_folds = first.inverse.shape[0]
    fold = torch.as_tensor(first.folds, device=dev)
    onehot = torch.zeros(n_cells, n_folds, dtype=torch.float64, device=dev)
    onehot[torch.arange(n_cells, device=dev), fold] = 1.0
    # float64 from here (a float32 map is promoted in the pass that takes its mean out)
    mu = y.sum(1, keepdim=True, dtype=torch.float64) / n_cells
    y64 = y - mu
    # (n, folds) sums per fold and each model's e . r(y) (what the means add, exactly), in
    # one product; then the sums of squares per fold
    got = y64 @ torch.cat([onehot, *(m.const_cross[:, None] for m in models.values())], 1)
    per_fold, cross = got[:, :n_folds], got[:, n_folds:]
    yy = (y64 * y64) @ onehot
    count = onehot.sum(0)
    mean = (per_fold.sum(1, keepdim=True) - per_fold) / (n_cells - count)
    # sum over the fold's cells of (y - m_f)^2 = y_f'y_f - 2 m_f 1'y_f + n_f m_f^2
    out: dict[str, torch.Tensor] = {
        TSS: (yy - 2 * mean * per_fold + count * mean * mean).sum(1).clamp(min=0)}
    dtype = torch.float32
    yy = yy.float()
    # (cells, n) float32, transposed and rounded in one copy
    yt = torch.empty(n_cells, n, dtype=dtype, device=dev).copy_(y64.T)
    at: dict[bytes, int] = {}  # each distinct grouping's first row in the sums
    todo: list[torch.Tensor] = []  # each distinct grouping's levels, in that order
    width = 0
    for m in models.values():
        for g, key, size in zip(m.groups, m.keys, m.sizes, strict=True):
            if key not in at:
                at[key], width = width, width + size
                todo.append(g)
    sums = torch.zeros(n_folds * width, n, dtype=dtype, device=dev)
    for grouping, start in zip(todo, at.values(), strict=True):
        sums.index_add_(0, fold * width + start + grouping, yt)
    own = sums.view(n_folds, width, n)  # s_f
    train = own.sum(0, keepdim=True) - own  # t_f
    held: torch.Tensor | None = None  # (folds, most, n): each fold's cells, padded with 0
    for i, (k, m) in enumerate(models.items()):
        runs = _runs(m, at)
        if m.wide:
            if held is None:
                cells, _most = fold_cells(first.folds)
                padded = torch.cat([yt, torch.zeros(1, n, dtype=dtype, device=dev)])
                rows = torch.as_tensor(np.where(cells >= 0, cells, n_cells), device=dev)
                held = padded.index_select(0, rows.reshape(-1)).view(n_folds, -1, n)
            # y_f - P_f t_f (padded cells: 0 - 0); the first run's product makes it
            a, b, ma, mb = runs[0]
            left = torch.baddbmm(held, m.inverse[:, ma:mb].transpose(1, 2), train[:, a:b],
                                 alpha=-1)
            for a, b, ma, mb in runs[1:]:
                left.baddbmm_(m.inverse[:, ma:mb].transpose(1, 2), train[:, a:b], alpha=-1)
            press = left.square_().sum(1)
        else:
            w = m.width
            a, b, ma, mb = runs[0]  # [A_f | A_f G_f A_f]' t_f
            u = torch.bmm(m.inverse[:, ma:mb].transpose(1, 2), train[:, a:b])
            for a, b, ma, mb in runs[1:]:
                u.baddbmm_(m.inverse[:, ma:mb].transpose(1, 2), train[:, a:b])
            press = yy.T.clone()
            for a, b, ma, mb in runs:
                press -= 2 * (u[:, ma:mb] * own[:, a:b]).sum(1)
                press += (u[:, w + ma:w + mb] * train[:, a:b]).sum(1)
        out[k] = (press.sum(0).double() + 2 * mu[:, 0] * cross[:, i]
                  + mu[:, 0] ** 2 * m.const_press).clamp(min=0)
    return out


def _runs(m: FoldModel, at: dict[bytes, int]) -> list[tuple[int, int, int, int]]:
    """(first row, end row in the sums; first column, end column of the model) of each run
    of the model's groupings that lie side by side in the sums (``at``: each grouping's
    first row there)."""
    runs: list[list[int]] = []
    col = 0
    for key, size in zip(m.keys, m.sizes, strict=True):
        if runs and runs[-1][1] == at[key]:
            runs[-1][1] += size
            runs[-1][3] += size
        else:
            runs.append([at[key], at[key] + size, col, col + size])
        col += size
    return [(a, b, c, d) for a, b, c, d in runs]
