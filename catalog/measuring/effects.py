"""From per-pair patching effects to the numbers a neuron is ranked by (docs/method.md §5).

The paper's effect of a pair divides by the clean probability of the counterfactual
answer, so one pair whose P(r') is 1e-9 can give 1e8 and swamp every other pair's
0.01. Beside the paper's mean (kept for comparison) each neuron and operator gets:

- the **log-space effect** of each pair, ``1/2 [(log P*(r') - log P(r')) + (log P(r) -
  log P*(r))]``: the same two terms on log-probabilities, which is exactly what
  attribution patching linearizes; its mean (``effect_log``), median
  (``effect_median``) and 10%-trimmed mean (``effect_trimmed``, the mean of what is
  left when the lowest and highest 10% of pairs are dropped);
- ``moved_share``: the share of pairs whose log-space effect is larger than
  ``MOVED_EPS`` in size, i.e. where patching the neuron moves the answer at all.

``rank_value`` is the statistic the config ranks by (``rank_statistic``: trimmed,
median or the paper's mean), from exact patching where measured and from attribution
elsewhere; ranks, circuits and top sets order neurons by its size (``rank_sign =
abs``) or, as the paper did, by its signed value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from catalog.core import stats

TRIM = 0.1  # share of pairs dropped at each end by the trimmed mean
MOVED_EPS = 1e-3  # |log-space effect| from which a pair counts as moved


@dataclass
class PairStats:
    """Statistics over pairs of one operator, one value per neuron."""

    mean: np.ndarray  # the paper's effect (NaN for attribution, which has no such mean)
    std: np.ndarray
    log_mean: np.ndarray
    median: np.ndarray
    trimmed: np.ndarray
    moved: np.ndarray

    @classmethod
    def of(cls, log_effect: np.ndarray, paper_effect: np.ndarray | None = None) -> PairStats:
        """From (neurons, pairs) log-space effects and, for exact patching, paper effects."""
        n = log_effect.shape[0]
        if log_effect.shape[1] == 0:
            nan = np.full(n, np.nan, dtype=np.float32)
            return cls(nan, nan, nan, nan, nan, nan)
        base = paper_effect if paper_effect is not None else log_effect
        # the paper's effect reaches 1e30 and more (an expm1 of a log-probability gap):
        # its square overflows float32, so the spread is taken in float64 (it is at most
        # the largest value, which float32 holds); past a gap of 88.7 the effect itself
        # overflows to +inf (expm1 is never below -1), and so do that neuron's mean and
        # spread (numpy would give NaN, which here means "not measured", with a warning)
        mean = base.mean(1)
        with np.errstate(invalid="ignore"):
            std = base.std(1, dtype=np.float64).astype(base.dtype)
        std[np.isposinf(mean)] = np.inf
        return cls(mean=mean, std=std, log_mean=log_effect.mean(1),
                   median=np.median(log_effect, axis=1),
                   trimmed=stats.trimmed_mean(log_effect, TRIM),
                   moved=(np.abs(log_effect) > MOVED_EPS).mean(1))

    def statistic(self, name: str) -> np.ndarray:
        """The ranking statistic ``name`` (trimmed, median or mean)."""
        return {"trimmed": self.trimmed, "median": self.median, "mean": self.mean}[name]


def rank_key(value: np.ndarray, sign: str) -> np.ndarray:
    """What neurons are ordered by, largest first: |value| or value; NaN last."""
    key = np.abs(value) if sign == "abs" else np.asarray(value, dtype=np.float64)
    return np.nan_to_num(key, nan=-np.inf)


def ranks(key: np.ndarray) -> np.ndarray:
    """0 = largest key, per column; ties keep neuron order."""
    return np.argsort(np.argsort(-key, axis=0, kind="stable"), axis=0,
                      kind="stable").astype(np.int32)
