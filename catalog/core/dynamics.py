"""When does a heuristic family appear in training, and does the order hold across seeds?
(docs/training.md)

- ``birth_step``: the first checkpoint from which a family's labelled share stays above
  its step-0 control: from that step on, every checkpoint's Wilson 95% lower bound is above
  the step-0 share's Wilson 95% upper bound. The untrained model is the control (the label
  rule's false positives there are what chance gives); "stays" means a share that rises
  and falls back is not born until it rises for good. None when the series has no step 0,
  or the share never stays above it.
- ``seed_orders``: for every pair of families, in how many training seeds one is born
  before the other, and the two-sided sign test over the seeds that order them (ties and
  seeds where either is never born are left out). With three seeds the smallest p-value
  a sign test can give is 0.25: an order seen in 3 of 3 seeds is consistent, not
  established, and is reported as such.

Imports nothing from the catalog but its statistics.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from catalog.core.stats import wilson


def birth_step(series: list[tuple[int, int, int]]) -> int | None:
    """``series``: (step, labelled, neurons) per checkpoint, any order."""
    by_step = sorted(series)
    if not by_step or by_step[0][0] != 0:
        return None
    _, k0, n0 = by_step[0]
    if n0 == 0:
        return None
    ceiling = wilson(k0, n0)[1]
    born = None
    for step, k, n in by_step[1:]:
        above = n > 0 and wilson(k, n)[0] > ceiling
        if above and born is None:
            born = step
        elif not above:
            born = None
    return born


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test of ``wins`` against ``losses`` (ties left out): the
    probability under p = 1/2 of a split at least this uneven; 1.0 with no trials."""
    n = wins + losses
    if n == 0:
        return 1.0
    low = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


@dataclass
class PairOrder:
    """How two families' birth steps compare over seeds."""

    first: str
    second: str
    before: int  # seeds where ``first`` is born before ``second``
    after: int  # seeds where it is born after
    tied: int  # born at the same step
    unborn: int  # seeds where either is never born (or has no control)
    p_value: float  # the two-sided sign test over before + after

    @property
    def consistent(self) -> bool:
        """Every seed that orders the two orders them the same way, and at least two do."""
        return (self.before == 0 or self.after == 0) and self.before + self.after >= 2

    def as_dict(self) -> dict:
        return {"first": self.first, "second": self.second, "before": self.before,
                "after": self.after, "tied": self.tied, "unborn": self.unborn,
                "p_value": self.p_value, "consistent": self.consistent}


def seed_orders(births: dict[int, dict[str, int | None]]) -> list[PairOrder]:
    """``births``: seed -> family -> birth step (None: never born). One ``PairOrder`` per
    pair of families born in at least one seed, the earlier-born on average first."""
    families = sorted({f for per in births.values() for f, s in per.items() if s is not None})
    out = []
    for a, b in itertools.combinations(families, 2):
        before = after = tied = unborn = 0
        for per in births.values():
            sa, sb = per.get(a), per.get(b)
            if sa is None or sb is None:
                unborn += 1
            elif sa < sb:
                before += 1
            elif sa > sb:
                after += 1
            else:
                tied += 1
        if after > before:
            a, b, before, after = b, a, after, before
        out.append(PairOrder(a, b, before, after, tied, unborn, sign_test(before, after)))
    return out
