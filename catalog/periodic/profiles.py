"""The profiles of neuron maps along an axis and the null their spectra are tested
against (docs/method.md section 11; ``catalog.periodic.spectra`` uses them): a map's least-squares
fit on the other operands' main effects, plus Gaussian noise projected off the fit (a
closed-form Freedman-Lane null) or plus its own residual profile relabelled."""

from __future__ import annotations

import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

N_NULL = 99  # null profiles per axis: p = 1 / (N_NULL + 1)
ONE_HOT_MAX = 512  # profiles over at most this many values are one matrix product


@dataclass
class AxisProfile:
    """Every map's profile along one axis: ``prof[i, j]`` is map i's mean over the cells
    whose axis value is ``values[j]``, of which there are ``counts[j]``; ``total`` is
    each map's sum of squares about its mean over cells (the variance a fit explains a
    share of)."""

    values: np.ndarray
    counts: np.ndarray
    prof: np.ndarray  # (n, len(values)) float64
    total: np.ndarray  # (n,)

    def weighted(self) -> np.ndarray:
        """sqrt(count) x (profile - its cell-weighted mean): the values whose squares sum
        to the map's variance between axis values, so that a share is a share of the
        map's variance (a least-squares fit over cells), and a value of few cells (the
        ends of a sum's result axis, a prime product), whose mean is noisier, weighs
        less."""
        mean = (self.prof * self.counts).sum(1, keepdims=True) / self.counts.sum()
        return (self.prof - mean) * np.sqrt(self.counts)


def profile(maps: np.ndarray, axis: np.ndarray, total: np.ndarray | None = None) -> AxisProfile:
    """The profiles of ``maps`` (n, cells) along ``axis`` (cells,); ``total``: the maps'
    sums of squares, when the caller has them (one per map set, whatever the axis)."""
    order = np.argsort(axis, kind="stable")
    values, starts, counts = np.unique(axis[order], return_index=True, return_counts=True)
    if len(values) == 0:
        return AxisProfile(values, counts, np.zeros((len(maps), 0)), np.zeros(len(maps)))
    if len(values) <= ONE_HOT_MAX and len(maps) >= 64:
        # one matrix product beats gathering every map's cells (for many maps)
        onehot = np.zeros((len(axis), len(values)), maps.dtype)
        onehot[np.arange(len(axis)), np.searchsorted(values, axis)] = 1
        sums = (maps @ onehot).astype(np.float64)
    else:
        sums = np.add.reduceat(maps[:, order], starts, axis=1).astype(np.float64)
    if total is None:
        total = np.var(maps, axis=1, dtype=np.float64) * maps.shape[1]
    return AxisProfile(values, counts, sums / counts, total)


def _bases(values: np.ndarray, counts: np.ndarray, columns) -> np.ndarray:
    """Per group of columns (functions of the value), an orthonormal basis of their
    count-weighted span with the weighted constant taken out, zero where dependent."""
    w = np.sqrt(counts.astype(np.float64))
    v = values.astype(np.float64)
    out = []
    for group in columns:
        a = np.stack([w] + [f(v) * w for f in group], 1)
        q, r = np.linalg.qr(a)
        keep = np.abs(np.diag(r)) > 1e-9 * max(1.0, float(np.abs(r).max()))
        out.append((q * keep)[:, 1:])  # without the constant's direction
    return np.concatenate(out, 1) if out else np.zeros((len(values), 0))


def _period_bases(values: np.ndarray, counts: np.ndarray, periods: np.ndarray) -> np.ndarray:
    """(len(values), 2 * len(periods)): per period the weighted cos and sin directions."""
    return _bases(values, counts, [
        (lambda v, t=t: np.cos(2 * np.pi * v / t), lambda v, t=t: np.sin(2 * np.pi * v / t))
        for t in periods])


@dataclass
class Nuisance:
    """The null's reduced model over one operator's cells: least squares of each map on a
    constant and one level per value of each operand named (its ``codes``: each cell's
    value index, of ``sizes`` values). Its normal equations come from the maps' sums per
    operand value, which the op1 and op2 profiles already hold: no pass over the cells."""

    codes: list[np.ndarray]
    sizes: list[int]
    pinv: np.ndarray  # (p, p): the pseudo-inverse of the design's Gram matrix
    df: int  # cells - rank: the residual's degrees of freedom

    @classmethod
    def of(cls, codes: list[np.ndarray], sizes: list[int]) -> Nuisance:
        cols = cls._columns(codes, sizes)
        p = 1 + sum(sizes)
        gram = np.zeros((p, p))
        for i in range(cols.shape[1]):
            for j in range(cols.shape[1]):
                np.add.at(gram, (cols[:, i], cols[:, j]), 1.0)
        w, v = np.linalg.eigh(gram)
        keep = w > w.max() * p * np.finfo(np.float64).eps
        pinv = (v[:, keep] / w[keep]) @ v[:, keep].T
        return cls(codes, sizes, pinv, len(cols) - int(keep.sum()))

    @staticmethod
    def _columns(codes: list[np.ndarray], sizes: list[int]) -> np.ndarray:
        """(cells, 1 + factors): each cell's design columns (the constant is column 0)."""
        offsets = np.cumsum([1] + sizes[:-1])
        return np.stack([np.zeros(len(codes[0]), np.int64)]
                        + [c + o for c, o in zip(codes, offsets, strict=True)], 1)

    def fit(self, xty: np.ndarray, ss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Coefficients (n, p) and residual sums of squares (n,) of maps whose X'y is
        ``xty`` and whose centred sum of squares is ``ss`` (the maps centred: the constant
        takes their mean)."""
        beta = xty @ self.pinv
        return beta, np.maximum(ss - (beta * xty).sum(1), 0.0)

    def xty(self, sums: list[np.ndarray]) -> np.ndarray:
        """X'y of centred maps from their sums per value of each factor (same order)."""
        return np.concatenate([np.zeros((len(sums[0]), 1))] + sums, 1)

    def at_cells(self, beta: np.ndarray) -> np.ndarray:
        """The fit's value at every cell, (n, cells)."""
        return beta[:, self._columns(self.codes, self.sizes)].sum(2)

    def axis_means(self, axis_codes: np.ndarray, n_values: int) -> np.ndarray:
        """(p, n_values): each design column's mean over the cells of each axis value, so
        that ``beta @ axis_means`` is the fit's profile along the axis."""
        cols = self._columns(self.codes, self.sizes)
        out = np.zeros((1 + sum(self.sizes), n_values))
        for i in range(cols.shape[1]):
            np.add.at(out, (cols[:, i], axis_codes), 1.0)
        return out / np.bincount(axis_codes, minlength=n_values)


@dataclass
class AxisNull:
    """The null draws of one axis of one operator's cells, shared by every map (and by
    the K and KV maps): per draw, a profile of projected standard Gaussian noise and a
    relabelling of the axis values. A map's null profiles are ``fitted + sigma * noise``
    and ``fitted + (profile - fitted)[perm]`` (``for_maps``)."""

    nuisance: Nuisance
    means: np.ndarray  # (p, values): each design column's mean per axis value
    noise: np.ndarray  # (N_NULL, values)
    perms: np.ndarray  # (N_NULL, values)

    @classmethod
    def draw(cls, nuisance: Nuisance, axis_codes: np.ndarray, n_values: int,
             rng: np.random.Generator, n_null: int = N_NULL) -> AxisNull:
        xi = rng.standard_normal((n_null, len(axis_codes)))
        xi -= xi.mean(1, keepdims=True)
        unused = np.zeros(n_null)  # the draws' sums of squares are not needed
        xi_sums = [profile(xi, c, unused).prof * np.bincount(c, minlength=k)
                   for c, k in zip(nuisance.codes, nuisance.sizes, strict=True)]
        xi_beta, _ = nuisance.fit(nuisance.xty(xi_sums), unused)
        noise = profile(xi - nuisance.at_cells(xi_beta), axis_codes, unused).prof
        perms = np.stack([rng.permutation(n_values) for _ in range(n_null)])
        return cls(nuisance, nuisance.axis_means(axis_codes, n_values), noise, perms)

    def for_maps(self, sums: list[np.ndarray], ss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fit's profile (n, values) and the residual's standard deviation per cell
        (n,) of maps with these centred sums per value of the nuisance's operands and
        centred sums of squares."""
        beta, rss = self.nuisance.fit(self.nuisance.xty(sums), ss)
        # a map the other operands explain to rounding has no effect of this axis to test
        rss = np.where(rss > 1e-9 * ss, rss, 0.0)
        df = self.nuisance.df
        return beta @ self.means, (np.sqrt(rss / df) if df > 0 else np.zeros(len(rss)))


def _max_share(z: np.ndarray, bases: np.ndarray, n_periods: int) -> np.ndarray:
    """The largest period share of each weighted, centred profile (a row of ``z``)."""
    proj = ((z @ bases) ** 2).reshape(len(z), n_periods, 2).sum(2).max(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return proj / (z ** 2).sum(1)


def _beats(observed: np.ndarray, null_share: np.ndarray) -> np.ndarray:
    """Beaten by more than rounding; a null without variance (0/0) is beaten."""
    return ~(observed <= null_share * (1 + 1e-9) + 1e-12)


def _null_beaten(ap: AxisProfile, null: AxisNull, fitted_prof: np.ndarray,
                 sigma: np.ndarray, bases: np.ndarray, n_periods: int,
                 observed: np.ndarray, chunk: int = 16) -> np.ndarray:
    """Per map, whether the observed dominant share beats the largest share of every
    null profile of both kinds (docs/method.md section 11): the other operands' fit plus
    Gaussian noise, and the other operands' fit plus the observed residual profile with
    its axis values relabelled."""
    fitted = AxisProfile(ap.values, ap.counts, fitted_prof, ap.total).weighted()
    noise = AxisProfile(ap.values, ap.counts, null.noise, np.ones(len(null.noise))).weighted()
    pf, pn = fitted @ bases, noise @ bases
    ff = (fitted ** 2).sum(1)
    fn = fitted @ noise.T  # (n, draws)
    nn = (noise ** 2).sum(1)
    live = np.arange(len(fitted))
    for d0 in range(0, len(noise), chunk):  # the Gaussian draws, a chunk at a time
        d = slice(d0, d0 + chunk)
        sig = sigma[live, None]
        proj = (pf[live, None, :] + sig[:, :, None] * pn[None, d, :]) ** 2
        between = ff[live, None] + 2 * sig * fn[live, d] + sig ** 2 * nn[None, d]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = proj.reshape(len(live), -1, n_periods, 2).sum(3).max(2) / between
        live = live[_beats(observed[live, None], share).all(1)]
        if not len(live):
            return np.zeros(len(fitted), bool)
    # The relabelled nulls, a chunk at a time, by linearity: with R the residual profile
    # and p a relabelling (value v takes R[p[v]]), the null profile F + R[p] projects on
    # the weighted period columns B (orthogonal to the weighted constant) as
    # (w F) B + R (w B)[p^-1], and its weighted sum of squares about its weighted mean
    # comes from R, R^2 and c F against the counts relabelled: no null profile is built.
    c = ap.counts.astype(np.float64)
    wb = np.sqrt(c)[:, None] * bases
    inv = np.argsort(null.perms, axis=1)  # value u goes to inv[u]
    fit = fitted_prof[live]
    resid = ap.prof[live] - fit
    cf = c * fit
    sum_cf, sum_cff = cf.sum(1), (cf * fit).sum(1)
    for d0 in range(0, len(inv), chunk):
        ip = inv[d0:d0 + chunk]  # (draws, values)
        k = len(ip)
        proj = pf[live, None, :] + (resid @ wb[ip].transpose(1, 0, 2).reshape(
            len(c), -1)).reshape(len(live), k, -1)
        top = (proj ** 2).reshape(len(live), k, n_periods, 2).sum(3).max(2)
        c_p = c[ip]  # each value's count, carried to where its residual lands
        sum_cr = resid @ c_p.T  # (live, draws)
        sum_crr = (resid ** 2) @ c_p.T
        sum_cfr = np.einsum("lv,ldv->ld", resid, cf[:, ip])
        between = (sum_cff[:, None] + 2 * sum_cfr + sum_crr
                   - (sum_cf[:, None] + sum_cr) ** 2 / c.sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            share = top / between
        keep = _beats(observed[live, None], share).all(1)
        live, resid, fit = live[keep], resid[keep], fit[keep]
        cf, sum_cf, sum_cff = cf[keep], sum_cf[keep], sum_cff[keep]
        if not len(live):
            break
    out = np.zeros(len(fitted), bool)
    out[live] = True
    return out


def save_nulls(path: Path, nulls: dict[str, AxisNull]) -> None:
    """Write one operator's null draws (``op_nulls``) to ``path`` (.npz), atomically: a
    reader sees the whole file or none (workers share the cache)."""
    arrays: dict[str, np.ndarray] = {}
    for x, n in nulls.items():
        nu = n.nuisance
        arrays.update({f"{x}.pinv": nu.pinv, f"{x}.df": np.array(nu.df),
                       f"{x}.sizes": np.array(nu.sizes, np.int64), f"{x}.means": n.means,
                       f"{x}.noise": n.noise, f"{x}.perms": n.perms})
        arrays.update({f"{x}.code{i}": c for i, c in enumerate(nu.codes)})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_nulls(path: Path) -> dict[str, AxisNull] | None:
    """The null draws ``save_nulls`` wrote, or None where the file is missing or not
    readable as such (it is then drawn again)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    out = {}
    try:
        for x in sorted({k.split(".")[0] for k in arrays}):
            sizes = [int(v) for v in arrays[f"{x}.sizes"]]
            codes = [arrays[f"{x}.code{i}"] for i in range(len(sizes))]
            nu = Nuisance(codes, sizes, arrays[f"{x}.pinv"], int(arrays[f"{x}.df"]))
            out[x] = AxisNull(nu, arrays[f"{x}.means"], arrays[f"{x}.noise"],
                              arrays[f"{x}.perms"])
    except KeyError:
        return None
    return out
