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
        to the map's variance between axis values. A value of few cells (the ends of a
        sum's result axis, a prime product) has a noisier mean: weighted so, those values
        are exchangeable under the null, which raw means are not (unweighted, 44% of an
        untrained model's result profiles beat permuted ones)."""
        mean = (self.prof * self.counts).sum(1, keepdims=True) / self.counts.sum()
        return (self.prof - mean) * np.sqrt(self.counts)


def profile(maps: np.ndarray, axis: np.ndarray, total: np.ndarray | None = None) -> AxisProfile:
    """The profiles of ``maps`` (n, cells) along ``axis`` (cells,); ``total``: the maps'
    sums of squares, when the caller has them (one per map set, whatever the axis)."""
    order = np.argsort(axis, kind="stable")
    values, starts, counts = np.unique(axis[order], return_index=True, return_counts=True)
    if len(values) == 0:
        return AxisProfile(values, counts, np.zeros((len(maps), 0)), np.zeros(len(maps)))
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


def period_shares(ap: AxisProfile, periods: np.ndarray,
                  bases: np.ndarray | None = None) -> np.ndarray:
    """(n, len(periods)): per period, the share of each map's variance between axis
    values that cos and sin at that period explain (a cell-level least-squares fit)."""
    z = ap.weighted()
    between = (z ** 2).sum(1)
    if bases is None:
        bases = _period_bases(ap.values, ap.counts, periods)
    proj = (z @ bases) ** 2
    shares = proj.reshape(len(z), len(periods), 2).sum(2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(between[:, None] > 1e-12 * np.maximum(ap.total[:, None], 1e-30),
                        shares / between[:, None], np.nan)


def linear_share(ap: AxisProfile) -> np.ndarray:
    """The share of each map's variance between axis values that a line explains."""
    z = ap.weighted()
    between = (z ** 2).sum(1)
    proj = (z @ _bases(ap.values, ap.counts, [(lambda v: v,)]))[:, 0] ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(between > 0, proj / between, np.nan)


def fit_r2(ap: AxisProfile, periods_per_map: np.ndarray) -> np.ndarray:
    """Per map, the R^2 over cells of a least-squares fit of an intercept, a line in the
    axis value and cos and sin at that map's periods (a row of ``periods_per_map``;
    entries < 2 are left out).

    The regressors are functions of the axis value, so the fit over cells is the fit of
    the profile weighted by each value's cell count, and the map's variance within a
    value is left unexplained: one small weighted problem per map, solved all at once."""
    prof, counts, total = ap.prof, ap.counts, ap.total
    v = ap.values.astype(np.float64)
    per = np.asarray(periods_per_map, np.float64)
    n = len(prof)
    cols = [np.ones((n, len(v))), np.broadcast_to(v, (n, len(v)))]
    for j in range(per.shape[1]):
        t = per[:, j:j + 1]
        use = t >= 2
        arg = 2 * np.pi * v[None, :] / np.where(use, t, 1.0)
        cols += [np.where(use, np.cos(arg), 0.0), np.where(use, np.sin(arg), 0.0)]
    w = np.sqrt(counts.astype(np.float64))
    design = np.stack(cols, 2) * w[None, :, None]  # (n, values, 2 + 2k)
    target = prof * w[None, :]
    coef = np.linalg.pinv(design, rcond=1e-10) @ target[:, :, None]
    resid = ((target - (design @ coef)[:, :, 0]) ** 2).sum(1)
    between = (ap.weighted() ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (between - resid) / total, np.nan)


def helix_r2(ap: AxisProfile) -> np.ndarray:
    """R^2 of a line in the result plus cos and sin at HELIX_PERIODS, per map (``ap``:
    the profiles along the result)."""
    return fit_r2(ap, np.tile(np.array(HELIX_PERIODS), (len(ap.prof), 1)))


def axis_spectrum(ap: AxisProfile, rng: np.random.Generator,
                  n_perm: int = N_PERM) -> AxisSpectrum:
    """The spectrum of every map along one axis, from its profiles."""
    n = len(ap.prof)
    out = AxisSpectrum.empty(n)
    periods = periods_for(ap.values)
    if n == 0 or len(periods) == 0:
        return out
    bases = _period_bases(ap.values, ap.counts, periods)
    shares = period_shares(ap, periods, bases)
    ok = np.isfinite(shares).all(1)
    if not ok.any():
        return out
    order = np.argsort(-np.where(ok[:, None], shares, -1), axis=1, kind="stable")
    best = order[:, 0]
    out.period[ok] = periods[best[ok]].astype(np.int16)
    out.share[ok] = shares[ok, best[ok]]
    out.linear[:] = linear_share(ap)
    out.linear[~ok] = np.nan
    top = np.where(ok[:, None], periods[order[:, :min(TOP, len(periods))]], 0)
    sub = AxisProfile(ap.values, ap.counts, ap.prof[ok], ap.total[ok])
    out.fit_r2[ok] = fit_r2(sub, top[ok])
    # the null: the same weighted profiles over permuted values; significant where the
    # observed dominant share beats the largest share of every permuted profile
    z = sub.weighted()
    between = (z ** 2).sum(1)
    observed = out.share[ok]
    beaten = np.ones(len(z), bool)
    for _ in range(n_perm):
        perm = rng.permutation(len(ap.values))
        proj = (z[:, perm] @ bases) ** 2
        null = proj.reshape(len(z), len(periods), 2).sum(2).max(1) / between
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
    by_result = profile(k_map, result)
    axes = {"op1": axis_spectrum(profile(k_map, a, by_result.total), rng),
            "op2": axis_spectrum(profile(k_map, b, by_result.total), rng),
            "result": axis_spectrum(by_result, rng)}
    axes["kv"] = (axis_spectrum(profile(kv_map, result), rng) if kv_map is not None
                  else AxisSpectrum.empty(len(k_map)))
    helix = (helix_r2(by_result).astype(np.float32) if len(k_map)
             else np.zeros(0, np.float32))
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
