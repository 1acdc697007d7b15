"""How much of the model's answer a circuit keeps, and how much to trust that number.

Faithfulness compares three runs of each prompt: the model, the circuit (everything
outside it ablated) and the empty circuit (everything ablated):

    F = (m(circuit) - m(empty)) / (m(model) - m(empty))

for a per-prompt metric m. The heuristics paper uses the normalised logit
``NL = logit(answer) / max logit`` and averages the per-prompt ratios. That statistic is
fragile: when the empty circuit already answers (few-shot context, a model that keeps
the answer without the pruned parts) the denominator of most prompts is near zero and
the mean follows a handful of them; NL is also a ratio of logits, so a common shift of
all logits changes it. So the catalog reports, for each metric (``nl``; ``logprob``, the
answer's log-probability; ``logit_diff``, the answer's logit minus a counterfactual
answer's, as the MIB benchmark does):

- ``mean_ratio``: the paper's mean of per-prompt ratios (prompts with a zero
  denominator left out), with its standard error over prompts;
- ``ratio_of_means``: (mean m(c) - mean m(empty)) / (mean m(model) - mean m(empty)), the
  MIB benchmark's normalisation, robust to small denominators, with each prompt's
  influence bounded (catalog 0.11.0): each prompt's numerator term m(c) - m(empty) and
  denominator term m(model) - m(empty) are clipped to +-``CLIP`` times the median
  |denominator| over the point's prompts whose denominator is not 0, so that no prompt
  moves the statistic by more than ``influence_bound`` (about 2 CLIP (1 + |F|) / n where
  denominators are typical), whatever its circuit value or its denominator. Unclipped, one
  prompt whose circuit value is 10 moved it by ten prompts' shares, and a prompt whose
  circuit run leaves its largest number logit near 0 (NL's own denominator) took it from
  0.66 to -8.7; ``n_clipped`` counts the prompts clipped and ``max_influence`` is the most
  that leaving one prompt out moves the statistic shown: the conditioning of what is
  shown;
- ``median_ratio``; ``n_small``: prompts whose denominator is under ``SMALL`` (a tenth)
  of the median |denominator| over the point's prompts: their ratios are ten times the
  others' and more, and the mean of ratios follows them. Relative, so a constant shift
  or a common scale of the metric does not change the count for the logit difference
  (a shift of every number logit leaves it whole; ``small_denominators``), the count the
  warnings read; ``empty`` and ``model``: the metric's mean on the empty circuit and on
  the model, so a reader sees how much the empty circuit already gets.

The headline faithfulness (``Summary.faithfulness``, the README, the report, the
overview) is the ratio of means of NL; the mean of ratios is shown beside it only.

Standard errors come from a seeded bootstrap over prompts (``BOOTSTRAP`` resamples), the
same resamples for every point and area, so they are comparable along a curve.
A curve's areas follow the MIB benchmark: CPR, the area under the curve over its
sparsity levels (0.1% ... 100% of the pruned neurons, trapezoids on a linear axis;
higher is better) and CMD, the area between the curve and 1 (lower is better).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

from catalog.core.stats import mean_se, nan_mean

METRICS = ("nl", "logprob", "logit_diff")
# a denominator under this share of the median |denominator| of a point's prompts: its
# ratio is ten times the typical one, and the mean of ratios follows it
SMALL = 0.1
BOOTSTRAP = 200
# each prompt's terms of the ratio of means are clipped to this many median |denominators|
CLIP = 3.0


def prompt_metrics(logits: Float[torch.Tensor, "batch d_vocab"], answer: torch.Tensor,
                   cf_answer: torch.Tensor) -> np.ndarray:
    """(batch, 3) float64: NL, the answer's log-probability, and its logit minus the
    counterfactual answer's, per prompt (``METRICS`` order)."""
    logits = logits.double()
    rows = torch.arange(len(answer), device=logits.device)
    top = logits[rows, answer]
    nl = top / logits.max(dim=1).values
    lp = top - torch.logsumexp(logits, dim=1)
    ld = top - logits[rows, cf_answer]
    return torch.stack([nl, lp, ld], dim=1).cpu().numpy()


def fraction_counts(width: int, fractions: tuple[float, ...]) -> list[int]:
    """Neurons per layer for each share of a layer (at least 1)."""
    return [max(1, math.ceil(f * width)) for f in fractions]


@dataclass
class PointStats:
    """One circuit, one metric: the statistics of its faithfulness over prompts."""

    mean_ratio: float
    mean_ratio_se: float
    ratio_of_means: float
    ratio_of_means_se: float
    median_ratio: float
    n: int
    n_small: int
    # the ratio of means' conditioning: prompts whose terms were clipped, the most that
    # leaving one prompt out moves it, and the bound on what one prompt can move it by
    n_clipped: int = 0
    max_influence: float = float("nan")
    influence_bound: float = float("nan")

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in self.__dict__.items()}


def _ratios(c: np.ndarray, e: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per-prompt (c - e) / (m - e) along the last axis; NaN where m == e."""
    den = m - e
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, (c - e) / np.where(den != 0, den, 1.0), np.nan)


def _clipped(c: np.ndarray, e: np.ndarray, m: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numerator terms, denominator terms, the limit) of the ratio of means along the last
    axis, each term clipped to +-``CLIP`` times the median |denominator| (the limit)."""
    den, num = m - e, c - e
    lim = CLIP * _scale(den)
    return np.clip(num, -lim, lim), np.clip(den, -lim, lim), lim


def _scale(den: np.ndarray) -> np.ndarray:
    """The median |denominator| along the last axis over the prompts whose denominator is
    not 0 (kept dims; 0 where every one is 0). Prompts the empty circuit already answers as
    the model does (a denominator of exactly 0, common for NL when both put the answer on
    top) carry no ratio; counted in, they made the median 0 and the statistic undefined."""
    if den.shape[-1] == 0:
        return np.zeros(den.shape[:-1] + (1,))
    a = np.sort(np.where(den != 0, np.abs(den), np.inf), axis=-1)  # zeros sorted last
    k = (den != 0).sum(axis=-1, keepdims=True)
    lo = np.take_along_axis(a, np.maximum(k - 1, 0) // 2, axis=-1)
    hi = np.take_along_axis(a, np.minimum(k // 2, a.shape[-1] - 1), axis=-1)
    return np.where(k > 0, (lo + hi) / 2, 0.0)


def _rom(c: np.ndarray, e: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Ratio of means along the last axis, each prompt's terms clipped (``_clipped``)."""
    if c.shape[-1] == 0:
        return np.full(c.shape[:-1], np.nan)
    num, den, _ = _clipped(c, e, m)
    d = den.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d != 0, num.mean(-1) / np.where(d != 0, d, 1.0), np.nan)


def influence(c: np.ndarray, e: np.ndarray, m: np.ndarray) -> tuple[int, float, float]:
    """The ratio of means' conditioning over prompts (1-D arrays): (prompts with a clipped
    term, the largest change leaving one prompt out makes, the bound on the change one
    prompt can make whatever its values). The bound: one prompt moves the clipped sums by
    at most 2 L each (L the limit, taken at the order statistic above the median, where
    one prompt can push the median), so the ratio N / D by at most
    2 L (1 + |F|) / (|D| - 2 L), D and N the sums over the prompts."""
    n = len(c)
    if n < 2:
        return 0, float("nan"), float("nan")
    num, den, lim = _clipped(c, e, m)
    raw_num, raw_den = c - e, m - e
    clipped = int(((num != raw_num) | (den != raw_den)).sum())
    big_n, big_d = num.sum(), den.sum()
    f = big_n / big_d if big_d != 0 else float("nan")
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = (big_n - num) / (big_d - den)
    most = float(np.nanmax(np.abs(loo - f))) if np.isfinite(loo).any() else float("nan")
    d_abs = np.sort(np.abs(raw_den[raw_den != 0]))
    if not len(d_abs):
        return clipped, most, float("nan")
    upper = CLIP * float(d_abs[min(len(d_abs) // 2 + 1, len(d_abs) - 1)])
    room = abs(big_d) - 2 * upper
    bound = 2 * upper * (1 + abs(f)) / room if room > 0 else float("inf")
    return clipped, most, bound


def small_denominators(model: np.ndarray, empty: np.ndarray) -> int:
    """Prompts whose denominator |m(model) - m(empty)| is under ``SMALL`` times the median
    over the prompts (0 where every denominator is 0: no ratio is defined)."""
    d = np.abs(np.asarray(model, np.float64) - np.asarray(empty, np.float64))
    if not len(d):
        return 0
    med = float(np.median(d))
    return int((d < SMALL * med).sum()) if med > 0 else 0


def resamples(n: int, seed: int, b: int = BOOTSTRAP) -> np.ndarray:
    """(b, n) indices of bootstrap resamples of n prompts (seeded)."""
    return np.random.default_rng([seed, 17]).integers(0, n, size=(b, n)) if n else \
        np.zeros((b, 0), dtype=np.int64)


def point_stats(circuit: np.ndarray, empty: np.ndarray, model: np.ndarray,
                boot: np.ndarray) -> PointStats:
    """Statistics of one circuit's metric values over prompts (1-D arrays of equal length,
    the same prompts), standard errors from the bootstrap resamples ``boot``."""
    n = len(circuit)
    if n == 0:
        return PointStats(*(float("nan"),) * 5, 0, 0)
    r = _ratios(circuit, empty, model)
    ok = np.isfinite(r)
    stat = mean_se(r)  # over the finite ratios
    mean, se = stat["mean"], stat["se"]
    rom = float(_rom(circuit, empty, model))
    rom_b = _rom(circuit[boot], empty[boot], model[boot])
    rom_b = rom_b[np.isfinite(rom_b)]
    clipped, most, bound = influence(circuit, empty, model)
    return PointStats(mean_ratio=mean, mean_ratio_se=se, ratio_of_means=rom,
                      ratio_of_means_se=float(rom_b.std(ddof=1)) if len(rom_b) > 1
                      else float("nan"),
                      median_ratio=float(np.median(r[ok])) if ok.any() else float("nan"),
                      n=n, n_small=small_denominators(model, empty), n_clipped=clipped,
                      max_influence=most, influence_bound=bound)


def areas(fractions: np.ndarray, curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MIB's CPR (area under) and CMD (area between the curve and 1) of faithfulness
    values ``curve`` (..., len(fractions)) over the sparsity levels ``fractions``."""
    x = np.asarray(fractions, dtype=np.float64)
    dx = np.diff(x)
    f = np.asarray(curve, dtype=np.float64)
    cpr = (dx * (f[..., :-1] + f[..., 1:]) / 2).sum(-1)
    gap = np.abs(1.0 - f)
    cmd = (dx * (gap[..., :-1] + gap[..., 1:]) / 2).sum(-1)
    return cpr, cmd


def _boot_means(r: np.ndarray, boot: np.ndarray) -> np.ndarray:
    """(b, levels) each resample's mean ratio per level (``r``: (levels, prompts)), all
    resamples in one reduction (each row summed as alone: the same bits as one call per
    resample)."""
    return nan_mean(r[:, boot], axis=2).T


def _boot_rom(circuits: np.ndarray, empty: np.ndarray, model: np.ndarray,
              boot: np.ndarray) -> np.ndarray:
    """(b, levels) each resample's ratio of means per level, its clipping limit from its
    own prompts, as ``_rom`` of each resample alone."""
    return _rom(circuits[:, boot], empty[boot][None], model[boot][None]).T


def area_stats(fractions: np.ndarray, circuits: np.ndarray, empty: np.ndarray,
               model: np.ndarray, boot: np.ndarray) -> dict:
    """CPR and CMD of a curve for both statistics (``mean_ratio``, ``ratio_of_means``),
    with bootstrap standard errors. ``circuits``: (n_levels, n_prompts) metric values."""
    out: dict = {}
    r = _ratios(circuits, empty[None], model[None])  # (levels, prompts)
    mean_curve = nan_mean(np.where(np.isfinite(r), r, np.nan), axis=1) if r.size else \
        np.full(len(fractions), np.nan)
    rom_curve = _rom(circuits, empty[None], model[None])
    for name, curve, boot_curves in (
            ("mean_ratio", mean_curve, _boot_means(r, boot) if r.size else None),
            ("ratio_of_means", rom_curve,
             _boot_rom(circuits, empty, model, boot) if r.size else None)):
        cpr, cmd = areas(fractions, curve)
        entry = {"cpr": float(cpr), "cmd": float(cmd), "cpr_se": None, "cmd_se": None}
        if boot_curves is not None:
            bc, bd = areas(fractions, boot_curves)
            ok = np.isfinite(bc)
            if ok.sum() > 1:
                entry["cpr_se"], entry["cmd_se"] = float(bc[ok].std(ddof=1)), \
                    float(bd[ok].std(ddof=1))
        out[name] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                     for k, v in entry.items()}
    return out
