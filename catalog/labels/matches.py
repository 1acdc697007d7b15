"""The scores and labels of a layer's maps as parallel arrays: one row per (neuron,
operator, heuristic) scored above the floor (``Matches``), built by
``catalog.labels.matching.score_partitions`` and rebuilt from stored rows by ``from_records``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from catalog.labels import significance
from catalog.labels.heuristics import Heuristic

_UNSET = np.empty(0)  # "not given" for the optional arrays of Matches


@dataclass
class Matches:
    """Heuristic scores of one layer: one row per (neuron, operator, heuristic) >= the floor.

    The one representation of matches from the matcher to the writer and back:
    neuron (int32), op (int8, index into the config's operators), heuristic (int32,
    index into ``heuristics``), score (float32) and bottom (True when the bottom-k
    score was the larger one and is the one kept); for each score its heuristic's base
    rate |S_H| / cells and the exact p-value of the score under a random ordering of the
    map (catalog.labels.significance; NaN where that null does not apply), and ``implements``,
    the label rule's verdict (``label``; False until it is applied). The writer reads the
    same arrays (``schema.rows.LayerRows.matches``), and ``from_records`` rebuilds
    them from stored rows.
    """

    neuron: np.ndarray
    op: np.ndarray
    heuristic: np.ndarray
    score: np.ndarray
    bottom: np.ndarray
    heuristics: list[Heuristic]
    # one per row; not given: NaN (float32), NaN (float64), False until labelled
    base_rate: np.ndarray = field(default_factory=lambda: _UNSET)
    p_value: np.ndarray = field(default_factory=lambda: _UNSET)
    implements: np.ndarray = field(default_factory=lambda: _UNSET)
    # False where the heuristic's set is too small for the grid to test: even its whole
    # set on top could not reach the rule's corrected level (Tarone), so the row is never
    # offered as a neuron's best heuristic nor kept before a testable one (True until
    # the rule says; stored as neuron_score.testable)
    testable: np.ndarray = field(default_factory=lambda: _UNSET)

    def __post_init__(self) -> None:
        nan = np.full(len(self.neuron), np.nan)
        if self.base_rate is _UNSET:
            self.base_rate = nan.astype(np.float32)
        if self.p_value is _UNSET:
            self.p_value = nan.copy()
        if self.implements is _UNSET:
            self.implements = np.zeros(len(self.neuron), dtype=bool)
        if self.testable is _UNSET:
            self.testable = np.ones(len(self.neuron), dtype=bool)

    def __len__(self) -> int:
        return len(self.neuron)

    @classmethod
    def empty(cls) -> Matches:
        return cls(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0, np.int32),
                   np.zeros(0, np.float32), np.zeros(0, bool), [])

    @classmethod
    def from_records(cls, records) -> Matches:
        """From (neuron, op index, Heuristic, score, bottom[, base rate, p-value,
        implements]) tuples, in that order."""
        records = list(records)
        extra: dict = {}
        if records and len(records[0]) > 5:
            extra = {"base_rate": np.array([r[5] for r in records], dtype=np.float32),
                     "p_value": np.array([np.nan if r[6] is None else r[6] for r in records],
                                         dtype=np.float64),
                     "implements": np.array([bool(r[7]) for r in records], dtype=bool)}
        index: dict[str, int] = {}
        heuristics: list[Heuristic] = []
        hidx = []
        for r in records:
            h = r[2]
            if h.key not in index:
                index[h.key] = len(heuristics)
                heuristics.append(h)
            hidx.append(index[h.key])
        return cls(np.array([r[0] for r in records], dtype=np.int32),
                   np.array([r[1] for r in records], dtype=np.int8),
                   np.array(hidx, dtype=np.int32),
                   np.array([r[3] for r in records], dtype=np.float32),
                   np.array([r[4] for r in records], dtype=bool), heuristics, **extra)

    @classmethod
    def concat(cls, parts: list[Matches]) -> Matches:
        """Rows of every part, in order; heuristic indices re-based onto one list."""
        out = cls.empty()
        if not parts:
            return out
        offsets = np.cumsum([0] + [len(p.heuristics) for p in parts[:-1]])
        return cls(np.concatenate([p.neuron for p in parts]).astype(np.int32),
                   np.concatenate([p.op for p in parts]).astype(np.int8),
                   np.concatenate([p.heuristic + o for p, o in zip(parts, offsets, strict=True)]
                                  ).astype(np.int32),
                   np.concatenate([p.score for p in parts]).astype(np.float32),
                   np.concatenate([p.bottom for p in parts]).astype(bool),
                   [h for p in parts for h in p.heuristics],
                   np.concatenate([p.base_rate for p in parts]).astype(np.float32),
                   np.concatenate([p.p_value for p in parts]).astype(np.float64),
                   np.concatenate([p.implements for p in parts]).astype(bool),
                   np.concatenate([p.testable for p in parts]).astype(bool))

    def row_heuristic(self, i: int) -> Heuristic:
        return self.heuristics[int(self.heuristic[i])]

    def neurons_matching(self, op: int) -> np.ndarray:
        """Distinct neurons labelled with a heuristic (``implements``) on operator ``op``."""
        return np.unique(self.neuron[(self.op == op) & self.implements])

    def without_neurons(self, drop: np.ndarray) -> Matches:
        """The rows whose neuron is not in ``drop`` (e.g. constant neurons)."""
        return self._select(~np.isin(self.neuron, drop))

    def _select(self, keep: np.ndarray) -> Matches:
        """The rows where ``keep`` is True, same heuristic list."""
        return Matches(self.neuron[keep], self.op[keep], self.heuristic[keep], self.score[keep],
                       self.bottom[keep], self.heuristics, self.base_rate[keep],
                       self.p_value[keep], self.implements[keep], self.testable[keep])

    def compact(self, per_family: int) -> Matches:
        """The rows to store: per (neuron, operator, family) the ``per_family`` best rows
        (testable ones first, then the higher score, ties broken by heuristic order), plus
        every row whose heuristic the neuron implements; ``per_family`` 0 keeps every row.
        The best row of each neuron and operator (``schema.store``'s ranking: labels, then
        testable, then score) is always among them: it is the best of its family."""
        if per_family <= 0 or not len(self):
            return self
        families = sorted({h.family for h in self.heuristics})
        fam = np.array([families.index(h.family) for h in self.heuristics], dtype=np.int64)
        f = fam[self.heuristic]
        # group rows by (neuron, op, family), best score first
        order = np.lexsort((self.heuristic, -self.score, ~self.testable.astype(bool), f,
                            self.op, self.neuron))
        key = (self.neuron[order].astype(np.int64) * 256 + self.op[order]) * len(families) \
            + f[order]
        start = np.r_[True, key[1:] != key[:-1]]
        group_start = np.maximum.accumulate(np.where(start, np.arange(len(key)), 0))
        rank = np.arange(len(key)) - group_start
        keep = np.zeros(len(self), dtype=bool)
        keep[order] = rank < per_family
        keep |= self.implements
        return self._select(keep)

    def label(self, threshold: float, rule: str, level: float, n_tests: int) -> Matches:
        """Set ``implements`` by the label rule (catalog.labels.significance.labels);
        returns self."""
        self.implements = significance.labels(self.score, self.p_value, threshold, rule,
                                              level, n_tests)
        return self
