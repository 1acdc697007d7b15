"""Periodic structure of neuron maps (docs/method.md section 11): per neuron and operator,
the spectrum of its K map along op1, op2 and the result, of its KV map along the result,
a helix fit on the result, and a value-permutation null for the dominant period.

Definitions, for one map y over the operator's valid cells and one axis x (op1, op2 or
the result of each cell):

- the axis profile p(v) is the mean of y over the cells whose axis value is v, for every
  value v present (a `*` grid's results are not contiguous: only the present values);
- the share of period T is the fraction of the centred profile's variance that a
  least-squares fit of cos(2 pi v / T) and sin(2 pi v / T) explains. On a contiguous axis
  of N values with T dividing N this is the discrete Fourier power at frequency N / T
  (twice it, below the Nyquist frequency) over the total: the test checks it against
  numpy's FFT. Periods run from 2 to min(100, span // 2), span = max(v) - min(v) + 1: at
  least two cycles on the axis; slower change is the linear (magnitude) part;
- the dominant period is the period of the largest share; the linear share is the
  fraction a straight line in v explains (a magnitude, or low-frequency, profile);
- the fit R^2 is the fraction of the MAP's variance (over cells, not the profile)
  explained by a line in the axis value plus cos and sin at the profile's TOP periods;
- the helix R^2 (result axis only) is that fraction for a line plus cos and sin at
  HELIX_PERIODS, the periods Kantamneni & Tegmark (2025) fit numbers with;
- the dominant period is significant when its share beats the largest share of every
  one of N_PERM profiles whose axis values are permuted at random (the same
  permutations for every neuron): a permutation p-value of 1 / (N_PERM + 1), so about
  1 in N_PERM + 1 maps without periodic structure is called periodic by chance; and
  when it explains more of the profile than a line does (a ramp has power at the
  longest periods too, and beats permuted profiles there: it is a magnitude map).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_PERIOD = 100
TOP = 3  # periods in the fit R^2
HELIX_PERIODS = (2, 5, 10, 100)
N_PERM = 99
AXES = ("op1", "op2", "result", "kv")  # kv: the KV map along the result


@dataclass
class AxisSpectrum:
    """One axis of every neuron's map (arrays over neurons; NaN / -1 where not measured)."""

    period: np.ndarray  # int16: dominant period, -1 where none (too short an axis, constant)
    share: np.ndarray  # float32: its share of the profile's variance
    linear: np.ndarray  # float32: the share a line explains (magnitude, low frequency)
    fit_r2: np.ndarray  # float32: map variance explained by a line and the TOP periods
    significant: np.ndarray  # bool: the dominant share beats every permuted profile

    @classmethod
    def empty(cls, n: int) -> AxisSpectrum:
        nan = np.full(n, np.nan, np.float32)
        return cls(np.full(n, -1, np.int16), nan, nan.copy(), nan.copy(), np.zeros(n, bool))


def periods_for(values: np.ndarray) -> np.ndarray:
    """The candidate periods of an axis with these (sorted, distinct) values."""
    span = int(values.max() - values.min()) + 1 if len(values) else 0
    return np.arange(2, min(MAX_PERIOD, span // 2) + 1)


def profile(maps: np.ndarray, axis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, (n, len(values)) profiles): each map's mean over the cells of each value."""
    order = np.argsort(axis, kind="stable")
    values, starts, counts = np.unique(axis[order], return_index=True, return_counts=True)
    if len(values) == 0:
        return values, np.zeros((len(maps), 0))
    sums = np.add.reduceat(maps[:, order].astype(np.float64), starts, axis=1)
    return values, sums / counts


def _period_bases(values: np.ndarray, periods: np.ndarray) -> np.ndarray:
    """(len(values), 2 * len(periods)): per period an orthonormal basis of the centred
    cos and sin columns on these values (one column where they are dependent)."""
    out = []
    v = values.astype(np.float64)
    for t in periods:
        a = np.stack([np.cos(2 * np.pi * v / t), np.sin(2 * np.pi * v / t)], 1)
        a -= a.mean(0)
        q, r = np.linalg.qr(a)
        keep = np.abs(np.diag(r)) > 1e-9 * max(1.0, float(np.abs(r).max()))
        q = q * keep  # a column of zeros where sin vanishes on these values (T = 2)
        out.append(q)
    return np.concatenate(out, 1) if out else np.zeros((len(values), 0))


def period_shares(prof: np.ndarray, values: np.ndarray,
                  periods: np.ndarray) -> np.ndarray:
    """(n, len(periods)) share of each centred profile's variance per period."""
    p = prof - prof.mean(1, keepdims=True)
    total = (p ** 2).sum(1)
    proj = (p @ _period_bases(values, periods)) ** 2
    shares = proj.reshape(len(p), len(periods), 2).sum(2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total[:, None] > 0, shares / total[:, None], np.nan)


def linear_share(prof: np.ndarray, values: np.ndarray) -> np.ndarray:
    p = prof - prof.mean(1, keepdims=True)
    v = values.astype(np.float64) - values.mean()
    denom = (p ** 2).sum(1) * (v ** 2).sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (p @ v) ** 2 / denom, np.nan)


def fit_r2(maps: np.ndarray, axis: np.ndarray, periods_per_map: np.ndarray) -> np.ndarray:
    """Per map, the R^2 over cells of a least-squares fit of an intercept, a line in the
    axis value and cos and sin at that map's periods (a row of ``periods_per_map``;
    entries < 2 are left out).

    The regressors are functions of the axis value, so the fit over cells is the fit of
    the profile weighted by each value's cell count, and the map's variance within a
    value is left unexplained: one small weighted problem per map, solved all at once."""
    values, prof = profile(maps, axis)
    _, counts = np.unique(axis, return_counts=True)
    y = maps.astype(np.float64)
    total = ((y - y.mean(1, keepdims=True)) ** 2).sum(1)
    v = values.astype(np.float64)
    per = np.asarray(periods_per_map, np.float64)
    k = per.shape[1]
    cols = [np.ones((len(maps), len(v))), np.broadcast_to(v, (len(maps), len(v)))]
    for j in range(k):
        t = per[:, j:j + 1]
        use = t >= 2
        arg = 2 * np.pi * v[None, :] / np.where(use, t, 1.0)
        cols += [np.where(use, np.cos(arg), 0.0), np.where(use, np.sin(arg), 0.0)]
    w = np.sqrt(counts.astype(np.float64))
    design = np.stack(cols, 2) * w[None, :, None]  # (n, values, 2 + 2k)
    target = prof * w[None, :]
    coef = np.linalg.pinv(design, rcond=1e-10) @ target[:, :, None]
    resid = ((target - (design @ coef)[:, :, 0]) ** 2).sum(1)
    mean = (prof * counts).sum(1, keepdims=True) / counts.sum()
    between = (counts * (prof - mean) ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (between - resid) / total, np.nan)


def helix_r2(maps: np.ndarray, result: np.ndarray) -> np.ndarray:
    """R^2 of a line in the result plus cos and sin at HELIX_PERIODS, per map."""
    return fit_r2(maps, result, np.tile(np.array(HELIX_PERIODS), (len(maps), 1)))


def axis_spectrum(maps: np.ndarray, axis: np.ndarray, rng: np.random.Generator,
                  n_perm: int = N_PERM) -> AxisSpectrum:
    """The spectrum of every map (rows of ``maps``, over cells) along one axis."""
    n = len(maps)
    out = AxisSpectrum.empty(n)
    if n == 0:
        return out
    values, prof = profile(maps, axis)
    periods = periods_for(values)
    if len(periods) == 0:
        return out
    shares = period_shares(prof, values, periods)
    ok = np.isfinite(shares).all(1)
    if not ok.any():
        return out
    order = np.argsort(-np.where(ok[:, None], shares, -1), axis=1, kind="stable")
    best = order[:, 0]
    out.period[ok] = periods[best[ok]].astype(np.int16)
    out.share[ok] = shares[ok, best[ok]]
    out.linear[ok] = linear_share(prof[ok], values)
    top = np.where(ok[:, None], periods[order[:, :min(TOP, len(periods))]], 0)
    out.fit_r2[ok] = fit_r2(maps[ok], axis, top[ok])
    # the null: the same profiles over permuted values; significant where the observed
    # dominant share beats the largest share of every permuted profile
    beaten = np.ones(int(ok.sum()), bool)
    observed = out.share[ok]
    live = prof[ok]
    bases = _period_bases(values, periods)
    centred = live - live.mean(1, keepdims=True)
    total = (centred ** 2).sum(1)
    for _ in range(n_perm):
        perm = rng.permutation(len(values))
        proj = (centred[:, perm] @ bases) ** 2
        null = proj.reshape(len(live), len(periods), 2).sum(2).max(1) / total
        beaten &= observed > null
        if not beaten.any():
            break
    # a line (magnitude, low frequency) that explains more is not a period: a ramp's
    # profile also has power at the longest periods, and beats permuted profiles there
    out.significant[ok] = beaten & (observed > out.linear[ok])
    return out


@dataclass
class Spectra:
    """Every axis of one operator's maps in one layer, and the helix fit."""

    axes: dict[str, AxisSpectrum]
    helix_r2: np.ndarray  # float32 over neurons


def op_spectra(k_map: np.ndarray, kv_map: np.ndarray | None, a: np.ndarray, b: np.ndarray,
               result: np.ndarray, seed: int) -> Spectra:
    """Spectra of one operator's maps (rows: neurons; columns: its valid cells with
    operands ``a``, ``b`` and ``result``). Seeded: the same maps give the same null."""
    rng = np.random.default_rng([seed, 9])
    axes = {"op1": axis_spectrum(k_map, a, rng), "op2": axis_spectrum(k_map, b, rng),
            "result": axis_spectrum(k_map, result, rng)}
    axes["kv"] = (axis_spectrum(kv_map, result, rng) if kv_map is not None
                  else AxisSpectrum.empty(len(k_map)))
    helix = helix_r2(k_map, result).astype(np.float32) if len(k_map) else np.zeros(0, np.float32)
    return Spectra(axes, helix)


# neuron_op's columns (migration 0023): periods as smallint (-1 / NULL: none), shares and
# R^2 in ten-thousandths as smallint (4 bytes saved per value: the spectra stay under 10%
# of neuron_op's bytes), ``spec_periodic`` a bit per axis whose period is significant
PERIOD_COLS = tuple(f"{x}_period" for x in AXES)
SHARE_COLS = tuple(f"{x}_share" for x in AXES)
FIT_COLS = ("op1_fit", "op2_fit", "result_fit")
LINEAR_COLS = ("op1_linear", "op2_linear", "result_linear")
SPECTRUM_COLS = ("spec_periodic",) + PERIOD_COLS + SHARE_COLS + FIT_COLS + LINEAR_COLS + (
    "helix_r2",)
SCALE = 10_000  # a stored share or R^2 is round(value * SCALE)


@dataclass
class LayerSpectra:
    """(d_mlp, n_ops) arrays of one layer, in SPECTRUM_COLS order (-1: not measured)."""

    cols: dict[str, np.ndarray]

    @classmethod
    def empty(cls, d_mlp: int, n_ops: int) -> LayerSpectra:
        cols = {c: np.full((d_mlp, n_ops), -1, np.int16) for c in SPECTRUM_COLS}
        cols["spec_periodic"][:] = 0
        return cls(cols)

    def set(self, neurons: np.ndarray, o: int, s: Spectra) -> None:
        """Column ``o`` of ``neurons`` (the rows of ``s``)."""
        def scaled(x: np.ndarray) -> np.ndarray:
            x = np.asarray(x, np.float64)
            return np.where(np.isfinite(x), np.round(np.clip(x, -1, 1) * SCALE),
                            -1).astype(np.int16)
        bits = np.zeros(len(neurons), np.int16)
        for i, x in enumerate(AXES):
            ax = s.axes[x]
            self.cols[f"{x}_period"][neurons, o] = ax.period
            self.cols[f"{x}_share"][neurons, o] = scaled(ax.share)
            bits |= (ax.significant.astype(np.int16) << i)
            if x != "kv":
                self.cols[f"{x}_fit"][neurons, o] = scaled(ax.fit_r2)
                self.cols[f"{x}_linear"][neurons, o] = scaled(ax.linear)
        self.cols["spec_periodic"][neurons, o] = bits
        self.cols["helix_r2"][neurons, o] = scaled(s.helix_r2)
