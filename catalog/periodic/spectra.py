"""Periodic structure of neuron maps (docs/method.md section 11): per neuron and operator,
the spectrum of its K map along op1, op2 and the result, of its KV map along the result,
a helix fit on the result, and a null of the other operands' effects for the dominant period.

Definitions, for one map y over the operator's valid cells and one axis x (op1, op2 or
the result of each cell):

- the axis profile p(v) is the mean of y over the cells whose axis value is v, for every
  value v present (a `*` grid's results are not contiguous: only the present values);
- the share of period T is the fraction of the centred profile's variance that a
  least-squares fit of cos(2 pi v / T) and sin(2 pi v / T) explains. On a contiguous axis
  of N values with T dividing N this is the discrete Fourier power at frequency N / T
  (twice it, below the Nyquist frequency) over the total: the test checks it against
  numpy's FFT. Periods run from 2 to min(100, span // 3), span = max(v) - min(v) + 1: at
  least three cycles on the axis; slower change is the smooth (magnitude) part;
- the dominant period is the period of the largest share; the linear share is the
  fraction a straight line in v explains (a magnitude, or low-frequency, profile);
- the fit R^2 is the fraction of the MAP's variance (over cells, not the profile)
  explained by a line in the axis value plus cos and sin at the profile's TOP periods;
- the helix R^2 (result axis only) is that fraction for a line plus cos and sin at
  HELIX_PERIODS, the periods Kantamneni & Tegmark (2025) fit numbers with;
- the dominant period is significant when its share beats the largest share of every
  one of 2 x N_NULL null profiles, when it explains more of the profile than a cubic
  in the value does (smooth change, a ramp or a bend, has power at the longest periods
  too: it is a magnitude map), and when, on the axis's own effect (the profile less the
  other operands' fit below), it explains more than a cubic plus one range of values
  (a window of values, the heuristics' range, looks like half a cycle of the longest
  candidate periods: T = 19 on results [0, 58], T = 66 on [0, 198]; catalog.periodic.guard).
  A null profile is what the axis would show if the map had no PERIODIC effect of that
  axis. Both kinds start from the map's least-squares fit on
  the OTHER operands' main effects (a constant and one level per op2 value for the op1
  axis, per op1 value for op2, per op1 and per op2 value for the result and KV axes),
  because an axis's values average different sets of cells: along the result of `+`
  each value's mean runs over an anti-diagonal, so a map of the operands alone has a
  smooth (moving-average) result profile, and along op2 of `-` each value's mean runs
  over the op1 values above it. To the fit's profile, N_NULL nulls add Gaussian noise of
  the fit's residual variance, projected off the fit's columns as a residual is (a
  Freedman-Lane null drawn in closed form: exact for a map of the other operands'
  effects plus independent noise), and N_NULL add the observed residual profile with
  the axis values relabelled at random (a non-periodic effect of the axis itself,
  whatever its size per value). Permuting the profile's values alone (this module's
  first null) called 16-79% of an untrained model's result profiles periodic.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catalog.periodic.guard import (  # the smooth guard, apart
    _beats_a_range,
    polynomial_share,
)
from catalog.periodic.profiles import (  # the profiles and the null, apart
    N_NULL,
    AxisNull,
    AxisProfile,
    Nuisance,
    _bases,
    _beats,
    _max_share,
    _null_beaten,
    _period_bases,
    load_nulls,
    profile,
    save_nulls,
)

MAX_PERIOD = 100
TOP = 3  # periods in the fit R^2
HELIX_PERIODS = (2, 5, 10, 100)
CYCLES = 3  # a period is a candidate with at least this many cycles on the axis
AXES = ("op1", "op2", "result", "kv")  # kv: the KV map along the result

__all__ = ["AXES", "N_NULL", "AxisNull", "AxisProfile", "AxisSpectrum", "LayerSpectra",
           "Nuisance", "Spectra", "SPECTRUM_COLS", "_beats", "_max_share", "_null_beaten",
           "axis_spectrum", "op_nulls", "op_spectra", "period_shares", "periods_for",
           "profile", "unpack"]


@dataclass
class AxisSpectrum:
    """One axis of every neuron's map (arrays over neurons; NaN / -1 where not measured)."""

    period: np.ndarray  # int16: dominant period, -1 where none (too short an axis, constant)
    share: np.ndarray  # float32: its share of the profile's variance
    linear: np.ndarray  # float32: the share a line explains (magnitude, low frequency)
    fit_r2: np.ndarray  # float32: map variance explained by a line and the TOP periods
    significant: np.ndarray  # bool: the dominant share beats every null profile

    @classmethod
    def empty(cls, n: int) -> AxisSpectrum:
        nan = np.full(n, np.nan, np.float32)
        return cls(np.full(n, -1, np.int16), nan, nan.copy(), nan.copy(), np.zeros(n, bool))


def periods_for(values: np.ndarray) -> np.ndarray:
    """The candidate periods of an axis with these (sorted, distinct) values: at least
    CYCLES cycles on the axis."""
    span = int(values.max() - values.min()) + 1 if len(values) else 0
    return np.arange(2, min(MAX_PERIOD, span // CYCLES) + 1)


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
    value is left unexplained. The explained part is the weighted, centred profile's
    projection on the span of the map's columns: every candidate column is built and
    multiplied once, and each map solves only its own small (q x q) normal equations."""
    per = np.asarray(periods_per_map, np.int64)
    n, k = per.shape
    cand = np.unique(per[per >= 2])
    v = ap.values.astype(np.float64)
    c = ap.counts.astype(np.float64)
    line = (v - v[0]) / max(1.0, float(v[-1] - v[0]))  # on the periodic columns' scale
    funcs = [line] + [f(2 * np.pi * v / t) for t in cand for f in (np.cos, np.sin)]
    cols = np.stack(funcs, 1)
    cols = (cols - (cols * c[:, None]).sum(0) / c.sum()) * np.sqrt(c)[:, None]
    gram_all = cols.T @ cols
    zc = ap.weighted() @ cols  # (n, 1 + 2 * len(cand))
    pos = np.searchsorted(cand, np.where(per >= 2, per, cand[0] if len(cand) else 0))
    idx = np.zeros((n, 1 + 2 * k), np.int64)  # a left-out period repeats the line
    idx[:, 1::2] = np.where(per >= 2, 1 + 2 * pos, 0)
    idx[:, 2::2] = np.where(per >= 2, 2 + 2 * pos, 0)
    gram = gram_all[idx[:, :, None], idx[:, None, :]]
    r = np.take_along_axis(zc, idx, 1)
    # a ridge far below any real column's weight: a column that vanishes on the values
    # (sin at period 2 on integers) or repeats another gets no share of the fit
    diag = np.einsum("nii->ni", gram)
    ridge = 1e-12 * (diag + diag.max(1, keepdims=True)) + 1e-300
    gram = gram + np.eye(gram.shape[1]) * ridge[:, :, None]
    explained = (r * np.linalg.solve(gram, r[:, :, None])[:, :, 0]).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ap.total > 0, explained / ap.total, np.nan)


def helix_r2(ap: AxisProfile) -> np.ndarray:
    """R^2 of a line in the result plus cos and sin at HELIX_PERIODS, per map (``ap``:
    the profiles along the result)."""
    return fit_r2(ap, np.tile(np.array(HELIX_PERIODS), (len(ap.prof), 1)))


def axis_spectrum(ap: AxisProfile, null: tuple[AxisNull, np.ndarray, np.ndarray] | None = None
                  ) -> AxisSpectrum:
    """The spectrum of every map along one axis, from its profiles; significance against
    ``null``: the axis's draws, and the maps' fitted profiles and residual deviations
    (``AxisNull.for_maps``); none: nothing is significant."""
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
    if null is not None:
        observed = out.share[ok].astype(np.float64)
        draws, fitted, sigma = null
        # smooth change (a ramp, a bend: magnitude, low frequency) or one range of values
        # that a cubic and a range explain better is not a period, though it beats noise
        # at the longest periods. Each map's test is its own, so the tests run cheapest
        # first on the maps still standing: the cubic, the nulls, the cubic and a range
        test = np.flatnonzero(observed > polynomial_share(sub))
        beaten = np.zeros(len(observed), bool)
        if len(test):
            tested = AxisProfile(sub.values, sub.counts, sub.prof[test], sub.total[test])
            test = test[_null_beaten(tested, draws, fitted[ok][test], sigma[ok][test],
                                     bases, len(periods), observed[test])]
        if len(test):
            beaten[test] = _beats_a_range(sub, test, fitted[ok][test], bases, best[ok][test])
        out.significant[ok] = beaten
    return out


@dataclass
class Spectra:
    """Every axis of one operator's maps in one layer, and the helix fit."""

    axes: dict[str, AxisSpectrum]
    helix_r2: np.ndarray  # float32 over neurons


OTHERS = {"op1": ("op2",), "op2": ("op1",), "result": ("op1", "op2")}


def _map_spectra(maps: np.ndarray, values: dict[str, np.ndarray], nulls: dict[str, AxisNull],
                 axes: tuple[str, ...]) -> tuple[dict[str, AxisSpectrum], AxisProfile]:
    """The spectra of one map set along ``axes`` (of op1, op2, result; ``values``: each
    cell's value on each), each against its null; also the result profile (the helix)."""
    by_r = profile(maps, values["result"])
    by = {"op1": profile(maps, values["op1"], by_r.total),
          "op2": profile(maps, values["op2"], by_r.total), "result": by_r}
    mean = (by_r.prof * by_r.counts).sum(1, keepdims=True) / max(1, by_r.counts.sum())
    sums = {x: (by[x].prof - mean) * by[x].counts for x in ("op1", "op2")}  # centred
    out = {}
    for x in axes:
        fitted, sigma = nulls[x].for_maps([sums[f] for f in OTHERS[x]], by_r.total)
        out[x] = axis_spectrum(by[x], (nulls[x], fitted, sigma))
    return out, by_r


def op_nulls(a: np.ndarray, b: np.ndarray, result: np.ndarray, rng: np.random.Generator,
             n_null: int = N_NULL) -> dict[str, AxisNull]:
    """The null draws of each axis of one operator's cells."""
    values = {"op1": a, "op2": b, "result": result}
    uniq = {x: np.unique(v, return_inverse=True) for x, v in values.items()}
    out = {}
    for x in ("op1", "op2", "result"):
        nuisance = Nuisance.of([uniq[f][1] for f in OTHERS[x]],
                               [len(uniq[f][0]) for f in OTHERS[x]])
        out[x] = AxisNull.draw(nuisance, uniq[x][1], len(uniq[x][0]), rng, n_null)
    return out


_NULLS: dict[tuple, dict[str, AxisNull]] = {}


@functools.cache
def _draws_version() -> str:
    """What the draws are computed by: the null module's text, ``op_nulls``'s and
    numpy's version (a change to any of them must not read draws made before it)."""
    import inspect

    from catalog.periodic import profiles

    digest = hashlib.blake2b(digest_size=8)
    digest.update(Path(profiles.__file__).read_bytes())
    digest.update(inspect.getsource(op_nulls).encode())
    digest.update(np.__version__.encode())
    return digest.hexdigest()


def cached_op_nulls(a: np.ndarray, b: np.ndarray, result: np.ndarray, seed,
                    n_null: int = N_NULL, cache_dir: Path | None = None
                    ) -> dict[str, AxisNull]:
    """``op_nulls`` seeded by ``seed``, kept for the next layer with the same cells (the
    draws depend on the cells and the seed alone; a few operators' worth are kept) and,
    with ``cache_dir``, on disk for the next run with the same cells and seed (the next
    checkpoint of a model: the draws are a fixed cost of each run, most of the spectra's
    time where few maps are periodic)."""
    digest = hashlib.blake2b(digest_size=16)
    for x in (a, b, result):
        digest.update(np.ascontiguousarray(x, np.int64).tobytes())
    key = (tuple(np.atleast_1d(seed).tolist()), n_null, digest.hexdigest())
    if key not in _NULLS:
        if len(_NULLS) >= 8:
            _NULLS.pop(next(iter(_NULLS)))
        path = None
        if cache_dir is not None:
            name = hashlib.blake2b(repr((key, _draws_version())).encode(), digest_size=16)
            path = Path(cache_dir) / f"{name.hexdigest()}.npz"
        nulls = load_nulls(path) if path is not None else None
        if nulls is None:
            nulls = op_nulls(a, b, result, np.random.default_rng([*key[0], 9]), n_null)
            if path is not None:
                try:
                    save_nulls(path, nulls)
                except OSError:
                    pass  # a read-only or full cache: drawn again next time
        _NULLS[key] = nulls
    return _NULLS[key]


def op_spectra(k_map: np.ndarray, kv_map: np.ndarray | None, a: np.ndarray, b: np.ndarray,
               result: np.ndarray, seed, n_null: int = N_NULL,
               cache_dir: Path | None = None) -> Spectra:
    """Spectra of one operator's maps (rows: neurons; columns: its valid cells with
    operands ``a``, ``b`` and ``result``). Seeded: the same cells and seed give the same
    null draws (the catalog seeds them by its config's seed and the operator, so every
    layer is tested against the same draws)."""
    nulls = cached_op_nulls(a, b, result, seed, n_null, cache_dir)
    values = {"op1": a, "op2": b, "result": result}
    axes, by_result = _map_spectra(k_map, values, nulls, ("op1", "op2", "result"))
    axes["kv"] = (_map_spectra(kv_map, values, nulls, ("result",))[0]["result"]
                  if kv_map is not None else AxisSpectrum.empty(len(k_map)))
    helix = (helix_r2(by_result).astype(np.float32) if len(k_map)
             else np.zeros(0, np.float32))
    return Spectra(axes, helix)


# neuron_op's columns (migration 0024): eight smallints a map, 16 bytes (0023 stored the
# seventeen values apart, 34 bytes: 18% of neuron_op's bytes against the 10% allowed).
# ``{axis}_spec``: period * PERIOD_BASE + its share in SHARE_STEPS steps, so that a
# period is a range of one plain indexed column (the views and the partial indexes use
# ``{axis}_spec / PERIOD_BASE``); ``{axis}_fitlin``: the fit R^2 and the linear share in
# R2_STEPS steps each; ``spec_helix``: the helix R^2 in HELIX_STEPS steps times 16 plus a
# bit per axis whose period is significant (1 op1, 2 op2, 4 result, 8 KV). Negative (NULL
# in the table): not measured.
PERIOD_BASE, SHARE_STEPS = 300, 299
R2_STEPS = 180
HELIX_STEPS = 2000
SPEC_COLS = tuple(f"{x}_spec" for x in AXES)
FITLIN_COLS = ("op1_fitlin", "op2_fitlin", "result_fitlin")
SPECTRUM_COLS = ("spec_helix",) + SPEC_COLS + FITLIN_COLS


def _steps(x: np.ndarray, steps: int) -> np.ndarray:
    """A fraction in [0, 1] as an integer count of 1/steps (NaN stays NaN)."""
    return np.round(np.clip(np.asarray(x, np.float64), 0.0, 1.0) * steps)


def unpack(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stored columns (``LayerSpectra.cols``, or rows read back with NULL as -1) as
    per-axis values: ``{axis}_period`` (-1: none), ``{axis}_share``, ``{axis}_fit``,
    ``{axis}_linear``, ``helix_r2`` (NaN: none) and ``{axis}_periodic``."""
    out: dict[str, np.ndarray] = {}
    helix = np.asarray(cols["spec_helix"], np.int64)
    out["helix_r2"] = np.where(helix >= 0, (helix >> 4) / HELIX_STEPS, np.nan)
    for i, x in enumerate(AXES):
        spec = np.asarray(cols[f"{x}_spec"], np.int64)
        out[f"{x}_period"] = np.where(spec >= 0, spec // PERIOD_BASE, -1)
        out[f"{x}_share"] = np.where(spec >= 0, (spec % PERIOD_BASE) / SHARE_STEPS, np.nan)
        out[f"{x}_periodic"] = (helix >= 0) & ((helix >> i) & 1 == 1)
        if x != "kv":
            fl = np.asarray(cols[f"{x}_fitlin"], np.int64)
            out[f"{x}_fit"] = np.where(fl >= 0, (fl // (R2_STEPS + 1)) / R2_STEPS, np.nan)
            out[f"{x}_linear"] = np.where(fl >= 0, (fl % (R2_STEPS + 1)) / R2_STEPS, np.nan)
    return out


@dataclass
class LayerSpectra:
    """(d_mlp, n_ops) arrays of one layer, in SPECTRUM_COLS order (-1: not measured)."""

    cols: dict[str, np.ndarray]

    @classmethod
    def empty(cls, d_mlp: int, n_ops: int) -> LayerSpectra:
        return cls({c: np.full((d_mlp, n_ops), -1, np.int16) for c in SPECTRUM_COLS})

    def set(self, neurons: np.ndarray, o: int, s: Spectra) -> None:
        """Column ``o`` of ``neurons`` (the rows of ``s``)."""
        bits = np.zeros(len(neurons), np.int64)
        for i, x in enumerate(AXES):
            ax = s.axes[x]
            share = _steps(ax.share, SHARE_STEPS)
            spec = np.where((ax.period >= 2) & np.isfinite(share),
                            ax.period.astype(np.int64) * PERIOD_BASE + np.nan_to_num(share),
                            -1)
            self.cols[f"{x}_spec"][neurons, o] = spec.astype(np.int16)
            bits |= ax.significant.astype(np.int64) << i
            if x != "kv":
                fit, lin = _steps(ax.fit_r2, R2_STEPS), _steps(ax.linear, R2_STEPS)
                ok = np.isfinite(fit) & np.isfinite(lin)
                fl = np.where(ok, np.nan_to_num(fit) * (R2_STEPS + 1) + np.nan_to_num(lin), -1)
                self.cols[f"{x}_fitlin"][neurons, o] = fl.astype(np.int16)
        helix = _steps(s.helix_r2, HELIX_STEPS)
        packed = np.where(np.isfinite(helix), np.nan_to_num(helix) * 16 + bits, -1)
        self.cols["spec_helix"][neurons, o] = packed.astype(np.int16)
