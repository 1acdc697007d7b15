"""The smooth guard of the spectra (docs/method.md section 11; ``catalog.periodic.spectra`` uses
it): a period is not called where smooth change (a cubic in the axis value) explains the
profile better, nor where, on the axis's own effect, a cubic plus one range of values
does (a window of values looks like half a cycle of the longest candidate periods)."""

from __future__ import annotations

import numpy as np

from catalog.periodic.profiles import AxisProfile, _bases

POLY_DEGREE = 3  # a period must explain more than a polynomial of this degree
RANGE_EDGES = 257  # ... plus one range of values between at most this many boundaries


def polynomial_share(ap: AxisProfile, degree: int = POLY_DEGREE) -> np.ndarray:
    """The share of each map's variance between axis values that a polynomial of this
    degree in the value explains: smooth, non-periodic change (a ramp, a bend)."""
    z = ap.weighted()
    between = (z ** 2).sum(1)
    proj = ((z @ _poly_basis(ap, degree)) ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(between > 0, proj / between, np.nan)


def _poly_basis(ap: AxisProfile, degree: int = POLY_DEGREE) -> np.ndarray:
    """(len(values), <= degree): the weighted polynomial directions, constant taken out."""
    v0, span = float(ap.values.min()), max(1.0, float(np.ptp(ap.values)))
    cols = tuple((lambda v, k=k: ((v - v0) / span) ** k) for k in range(1, degree + 1))
    return _bases(ap.values, ap.counts, [cols])


def smooth_share(ap: AxisProfile, degree: int = POLY_DEGREE) -> np.ndarray:
    """The share of each map's variance between axis values that a polynomial of this
    degree plus the best single RANGE of axis values (an indicator of values[i:j])
    explain together: the smooth guard a period must beat. A range is the heuristics'
    commonest pattern and has power at the longest candidate periods (a window of the
    result looks like half a cycle of T = 19 on [0, 58], T = 66 on [0, 198]); a cubic
    alone does not absorb it, so before this guard range maps were called periodic there.

    Exact least squares: the range column's part along the polynomial is taken out of
    the column as of the map, so the share is the polynomial's plus the best range's on
    what the polynomial leaves. Ranges run between every pair of value boundaries, or,
    past RANGE_EDGES boundaries, between evenly spaced ones (a window's edges then within
    len(values) / RANGE_EDGES values)."""
    z = ap.weighted()
    n, nv = z.shape
    between = (z ** 2).sum(1)
    q = _poly_basis(ap, degree)
    coef = z @ q
    resid = z - coef @ q.T
    w = np.sqrt(ap.counts.astype(np.float64))
    edges = (np.arange(nv + 1) if nv + 1 <= RANGE_EDGES
             else np.unique(np.linspace(0, nv, RANGE_EDGES).round().astype(np.int64)))
    # per boundary, cumulative sums of the residual's, the polynomial's and the counts'
    # weighted values: a range's products are differences of two of them
    cum_z = np.concatenate([np.zeros((n, 1)), np.cumsum(resid * w, 1)], 1)[:, edges]
    cum_q = np.concatenate([np.zeros((1, q.shape[1])), np.cumsum(q * w[:, None], 0)], 0)[edges]
    cum_c = np.concatenate([[0.0], np.cumsum(ap.counts.astype(np.float64))])[edges]
    i, j = np.triu_indices(len(edges), 1)
    inside = cum_c[j] - cum_c[i]
    total_c = float(ap.counts.sum())
    # |range column|^2 once centred (C p (1 - p)), less its part along the polynomial
    den = inside * (1.0 - inside / total_c) - ((cum_q[j] - cum_q[i]) ** 2).sum(1)
    ok = den > 1e-9 * total_c
    i, j, den = i[ok], j[ok], den[ok]
    best = np.zeros(n)
    step = max(1, 2_000_000 // max(1, len(den)))
    for s0 in range(0, n, step):
        num = (cum_z[s0:s0 + step, j] - cum_z[s0:s0 + step, i]) ** 2
        best[s0:s0 + step] = (num / den).max(1) if len(den) else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(between > 0, ((coef ** 2).sum(1) + best) / between, np.nan)


def _beats_a_range(sub: AxisProfile, rows: np.ndarray, fitted: np.ndarray, bases: np.ndarray,
                   best: np.ndarray) -> np.ndarray:
    """Per map (``rows`` of ``sub``), whether its dominant period (column ``best`` of the
    period ``bases``) explains more of the axis's own effect, the profile less the other
    operands' fit (``fitted``), than a cubic plus one range of values do."""
    own = AxisProfile(sub.values, sub.counts, sub.prof[rows] - fitted, sub.total[rows])
    z = own.weighted()
    cols = np.stack([2 * best, 2 * best + 1], 1)
    proj = np.take_along_axis(z @ bases, cols, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = (proj ** 2).sum(1) / (z ** 2).sum(1)
    return share > smooth_share(own)
