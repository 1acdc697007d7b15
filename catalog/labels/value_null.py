"""The value-permutation null: does a neuron's map single out the heuristic's VALUES?

docs/method.md section 7 ("The label rule") states the test and why; in short: for a
heuristic on one number (op1, op2 or the result) with value set V, the map's top cells
give each value a share, the |V| values of highest share form U, and X = |V ∩ U| is
compared with its distribution when values are relabelled at random within strata (by
default, values of the same digit count). Its tail is exact (``catalog.labels.tails``); both
operands combine two independent tests by Fisher's method; op1 = op2 is Monte Carlo;
multi-result sets cannot be tested under a relabelling. A label must also beat the map
shuffled with the other numbers held fixed (``within_class_tail``), and the p-values of
one neuron are corrected by Tarone's refinement of Bonferroni. ``label`` is the one
entry point: it fills the p-values and ``implements`` of scored rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from catalog.core.sorting import row_order
from catalog.core.stats import fisher_combined
from catalog.labels.heuristics import Cells, Heuristic, Partition, rescue_partitions
from catalog.labels.matches import Matches
from catalog.labels.matching import score_partitions
from catalog.labels.tails import (
    STRATA,
    ValueGroups,
    identical_p,
    min_p,
    set_p_values,
    strata_permutations,
    tarone,
    top_weights,
    within_class_tail,
)

__all__ = ["STRATA", "ValueGroups", "ValueNull", "label", "n_value_tests", "score_for_labels",
           "relabelled"]
SINGLE_TARGETS = ("op1", "op2", "result")
# the most Monte Carlo permutations of op1 = op2 for a row that cannot be labelled (its score
# is below the threshold): one block of ``identical_p``
UNLABELLED_PERMUTATIONS = 1024


def relabelled(cells: Cells, strata: str, gen: np.random.Generator) -> Cells:
    """The same cells with op1, op2 and result values each permuted at random within the
    null's strata (``ValueGroups``): heuristics built on them are about values the maps
    never saw, so any label they get is a false one (the relabelled-values control)."""
    out = {}
    for t in SINGLE_TARGETS:
        g = ValueGroups.of(cells, t, strata)
        perm = strata_permutations(g.stratum, 1, gen)[0]
        out[t] = g.values[perm][g.group]
    return Cells(cells.op, out["op1"], out["op2"], out["result"], cells.lo, cells.hi)


@dataclass
class ValueNull:
    """The value null of one operator's grid: its value groups, and the draws (k, or K
    for pattern counting) of each heuristic scored on it."""

    cells: Cells
    groups: dict[str, ValueGroups]
    draws: dict[str, int]
    seed: int
    permutations: int  # Monte Carlo draws for op1 = op2
    _member: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, cells: Cells, partitions: list, strata: str, seed: int, pattern_top_k: int,
           n_tests: int, level: float) -> ValueNull:
        n_cells = len(cells.a)
        draws = {}
        for part in partitions:
            for h, k in zip(part.heuristics, part.sizes, strict=True):
                draws[h.key] = int(k) if part.scoring == "topk" else min(pattern_top_k, n_cells)
        # enough permutations that the Monte Carlo p-value can reach level / n_tests
        b = int(min(1_000_000, max(1_000, np.ceil(2 * n_tests / level))))
        return cls(cells, {t: ValueGroups.of(cells, t, strata) for t in SINGLE_TARGETS},
                   draws, seed, b)

    def member(self, h: Heuristic, target: str) -> np.ndarray:
        key = (h.key, target)
        if key not in self._member:
            self._member[key] = self.groups[target].members(h)
        return self._member[key]

    def min_p(self, h: Heuristic) -> float:
        """The smallest p-value heuristic h can get under this null (Tarone); kept per
        heuristic (every layer's labels and controls ask for every heuristic's, tens of
        thousands of times a checkpoint), but for op1 = op2, whose depends on the
        permutations (``n_value_tests`` sets them)."""
        if h.spec.null == "own":
            return 1.0
        if h.spec.null == "diagonal":
            return 1.0 / (1 + self.permutations)
        key = (h.key, "min_p")
        if key not in self._member:
            if h.target == "both":
                self._member[key] = float(fisher_combined(
                    min_p(self.groups["op1"], self.member(h, "op1")),
                    min_p(self.groups["op2"], self.member(h, "op2"))))
            else:
                self._member[key] = min_p(self.groups[h.target], self.member(h, h.target))
        return self._member[key]

    def p_values(self, k_map: torch.Tensor, kv_map: torch.Tensor, heuristics: list[Heuristic],
                 neuron: np.ndarray, heuristic: np.ndarray, bottom: np.ndarray,
                 score: np.ndarray, orders: dict | None = None,
                 threshold: float = 0.0, decide_at: float = 1.0) -> np.ndarray:
        """P-value of each row (neuron index into the maps, heuristic index into
        ``heuristics``, bottom-k or not, its score) under the value null: the value test's
        exact (for op1 = op2, Monte Carlo) p-value, raised to the conditional tests' bound
        where they decide a label: the value test at most ``decide_at`` (the corrected
        level) and the score at least ``threshold``. Elsewhere the row is not labelled
        whatever they say, and they could only raise its p-value. ``orders``: each side's
        descending sort order of every map, keyed (direct, bottom), where the scoring has
        them (``score_partitions``)."""
        out = np.ones(len(neuron))
        if not len(neuron):
            return out
        kinds = _Kinds.of(heuristics)
        tests = self._collect(k_map, kv_map, heuristics, kinds, neuron, heuristic, bottom,
                              score, orders, threshold)
        # the value tests of every step and side at once (one exact tail per layout)
        for t, parts in tests.value.items():
            rows = np.concatenate([r for r, _, _ in parts])
            share = torch.cat([x for _, x, _ in parts])
            hidx = np.concatenate([h for _, _, h in parts])
            out[rows] = self._set_p(share, hidx, kinds, t)
        for rows, (share1, h1), (share2, h2) in tests.both:
            out[rows] = fisher_combined(self._set_p(share1, h1, kinds, "op1"),
                               self._set_p(share2, h2, kinds, "op2"))
        for rows, p in tests.identical:
            out[rows] = p
        self._conditional(tests, kinds, heuristic, out, decide_at)
        return out

    def _collect(self, k_map, kv_map, heuristics, kinds, neuron, heuristic, bottom, score,
                 orders, threshold) -> _Deferred:
        """What the tests of every row need, side by side (operand or result map, top or
        bottom cells), from each side's top-cell sums (``p_values``)."""
        direct = np.array([h.direct for h in heuristics], dtype=bool)[heuristic]
        draws = np.array([self.draws.get(h.key, 0) for h in heuristics])[heuristic]
        side_key = direct.astype(np.int64) * 2 + bottom.astype(np.int64)
        tests = _Deferred()
        for sk in np.unique(side_key[draws > 0]):
            is_direct, is_bottom = bool(sk // 2), bool(sk % 2)
            on_side = np.nonzero((side_key == sk) & (draws > 0))[0]
            neurons = np.unique(neuron[on_side])
            source = kv_map if is_direct else k_map
            order = (orders or {}).get((is_direct, is_bottom))
            if order is not None:
                # walk every map in place (no copy of the maps or their sort order): the
                # walk visits only the maps with rows, each as far as its largest draws
                neurons = np.arange(source.shape[0])
                maps = source
            else:
                maps = source[torch.as_tensor(neurons, device=source.device)]
            at = np.searchsorted(neurons, neuron[on_side])
            for d, rows, sums, slot, dense in self._top_sums(maps, is_bottom, on_side, at,
                                                             draws, order):
                pos = slot[np.searchsorted(neurons, neuron[rows])]
                self._keep_tests(tests, sums, pos, rows, kinds, heuristic[rows], dense,
                                 score[rows], d, threshold)
        return tests

    def _conditional(self, tests: _Deferred, kinds: _Kinds, heuristic: np.ndarray,
                     out: np.ndarray, decide_at: float) -> None:
        """The conditional tests of the rows they decide (a value p-value at most
        ``decide_at``), each row's p-value raised to theirs in ``out``."""
        value_p = out.copy()
        for t, parts in tests.conditional.items():
            rows = np.concatenate([r for r, _, _ in parts])
            near = value_p[rows] <= decide_at
            if not near.any():
                continue
            w_c = torch.cat([x for _, x, _ in parts])[torch.as_tensor(near)]
            counts = np.concatenate([c for _, _, c in parts])[near]
            rows = rows[near]
            uniq, h_of = np.unique(heuristic[rows], return_inverse=True)
            s_c = torch.as_tensor(np.stack([self.class_counts(kinds.heuristics[u], t)
                                            for u in uniq]), device=w_c.device)
            p = within_class_tail(w_c, s_c[torch.as_tensor(h_of, device=w_c.device)],
                                  torch.as_tensor(self.groups[t].size, dtype=torch.float64),
                                  torch.as_tensor(counts))
            np.maximum.at(out, rows, p)

    def _keep_tests(self, tests: _Deferred, sums: dict[str, torch.Tensor], pos: np.ndarray,
                    rows: np.ndarray, kinds: _Kinds, hidx: np.ndarray, dense,
                    score: np.ndarray, d: int, threshold: float) -> None:
        """Keep what the tests of the rows of one draws value need from this step's top-cell
        sums (``pos``: each row's slot in them; ``hidx``: its heuristic): each row's value
        shares for the exact value tail; for rows that score at least ``threshold``, the
        class sums of the conditional tests (the other numbers held fixed: an operand
        heuristic must beat maps shuffled within each result, a function of the result
        having no operand structure of its own; a result heuristic maps shuffled within
        each op1 row and within each op2 column; the largest of these p-values and the
        value null's is the row's p-value, an intersection-union test valid under each
        null). op1 = op2 is Monte Carlo, computed here: rows that cannot be labelled draw
        at most ``UNLABELLED_PERMUTATIONS`` permutations (valid, only coarser, where a
        label's would need the full count: most such rows, measured on Qwen2.5-Coder-0.5B)."""
        target = kinds.target[hidx]
        multi = kinds.own[hidx]

        def share(t: str, sel: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
            size = torch.as_tensor(self.groups[t].size, dtype=torch.float64)
            return sums[t][torch.as_tensor(pos[sel])] / size.to(sums[t].device), hidx[sel]

        for t in SINGLE_TARGETS:
            sel = np.nonzero((target == t) & ~multi)[0]
            if len(sel):
                tests.value.setdefault(t, []).append((rows[sel], *share(t, sel)))
        sel = np.nonzero(target == "both")[0]
        if len(sel):
            tests.both.append((rows[sel], share("op1", sel), share("op2", sel)))
        sel = np.nonzero(target == "identical")[0]
        if len(sel):
            limit = np.full(len(sel), self.permutations)
            limit[score[sel] < threshold] = min(self.permutations, UNLABELLED_PERMUTATIONS)
            tests.identical.append((rows[sel], identical_p(
                dense(pos[sel]), self.cells, self.groups["op1"], self.groups["op2"],
                self.permutations, self.seed, limit=limit)))
        can = (score >= threshold) & ~multi
        direct = kinds.direct[hidx]
        for conds, sel_mask in ((("result",), can & ~direct), (("op1", "op2"), can & direct)):
            sel = np.nonzero(sel_mask)[0]
            if not len(sel):
                continue
            for t in conds:
                tests.conditional.setdefault(t, []).append(
                    (rows[sel], sums[t][torch.as_tensor(pos[sel])],
                     score[sel].astype(np.float64) * d))

    def _set_p(self, share: torch.Tensor, hidx: np.ndarray, kinds: _Kinds,
               t: str) -> np.ndarray:
        """Exact value-null p-values of rows (their shares of number t's values, their
        heuristics)."""
        uniq, inv = np.unique(hidx, return_inverse=True)
        table = np.stack([self.member(kinds.heuristics[u], t) for u in uniq])
        return set_p_values(share, table[inv], self.groups[t])

    def _top_sums(self, maps: torch.Tensor, bottom: bool, rows: np.ndarray, at: np.ndarray,
                  draws: np.ndarray, order: torch.Tensor | None = None):
        """For each draws value d of ``rows`` (ascending; ``at``: each row's map): (d, its
        rows, target -> (slots, values) top-cell weight per value, ``slot`` (maps,) giving
        each map's slot in those sums, and a function giving the (slots, cells) weights of
        some slots). ``maps`` are ranked from the top, or from the bottom (``bottom``: the
        top of -maps, which is never materialised whole).

        One walk down each map's sorted cells: the counts per value grow segment by
        segment, so each d costs a segment, not a pass over every cell. The maps are
        walked in the order of the largest d their rows need, so that the maps still to
        count at any d are a prefix of the sums (maps with no rows are never walked). Maps
        whose d-th value is tied are recounted with the fair share of ties
        (``top_weights``)."""
        n, c = maps.shape
        dev = maps.device
        sign = -1.0 if bottom else 1.0
        if order is None:
            order = torch.from_numpy(row_order(maps.cpu().numpy(),
                                               descending=not bottom)).to(dev)
        need = np.zeros(n, dtype=np.int64)
        np.maximum.at(need, at, draws[rows])
        walk = np.argsort(-need, kind="stable")  # slot -> map
        slot = np.empty(n, dtype=np.int64)
        slot[walk] = np.arange(n)
        walk_t = torch.as_tensor(walk, device=dev)
        need_sorted = need[walk]
        steps = np.unique(draws[rows]).tolist()
        # the sorted values are read only around each d (ties at the d-th value)
        cols = np.unique(np.clip(np.concatenate([[d - 2, d - 1, d] for d in steps]), 0, c - 1))
        col_at = {int(x): i for i, x in enumerate(cols)}
        n_walk = int(np.count_nonzero(need_sorted))
        walked = walk_t[:n_walk]
        vals = sign * maps.index_select(0, walked).gather(
            1, order[:, torch.as_tensor(cols, device=dev)].index_select(0, walked))
        gid = {t: torch.as_tensor(g.group, device=dev) for t, g in self.groups.items()}
        hist = {t: torch.zeros(n_walk, len(g.values), dtype=torch.float64, device=dev)
                for t, g in self.groups.items()}
        prev = 0
        for d in steps:
            active = int(np.count_nonzero(need_sorted >= d))  # a prefix of the slots
            if d > prev:
                # a contiguous copy of the segment, then index_select: torch's advanced
                # indexing of a strided slice is 3x slower, and this is most of the walk
                seg = order[:, prev:d].index_select(0, walk_t[:active]).reshape(-1)
                ones = torch.ones(1, 1, dtype=torch.float64, device=dev).expand(active,
                                                                                 d - prev)
                for t in hist:
                    hist[t][:active].scatter_add_(
                        1, gid[t].index_select(0, seg).view(active, d - prev), ones)
            prev = d
            kth = vals[:active, col_at[d - 1]]
            tied = torch.zeros(active, dtype=torch.bool, device=dev)
            if d < c:
                tied |= vals[:active, col_at[d]] == kth
            if d > 1:
                tied |= vals[:active, col_at[d - 2]] == kth
            sums = {t: h[:active] for t, h in hist.items()}
            if bool(tied.any()):
                idx = torch.nonzero(tied)[:, 0]
                w = top_weights(sign * maps[walk_t[idx]], d, kth[idx, None])
                sums = {t: h.clone() for t, h in sums.items()}
                for t in sums:
                    fixed = torch.zeros(len(idx), sums[t].shape[1], dtype=torch.float64,
                                        device=dev).index_add_(1, gid[t], w)
                    sums[t][idx] = fixed

            def dense(slots: np.ndarray, _d: int = d) -> torch.Tensor:
                return top_weights(sign * maps[walk_t[torch.as_tensor(slots)]], _d)
            yield d, rows[draws[rows] == d], sums, slot, dense

    def class_counts(self, h: Heuristic, t: str) -> np.ndarray:
        """(values of t,) how many of h's cells have each value of number t."""
        key = (h.key, "classes", t)
        if key not in self._member:
            g = self.groups[t]
            self._member[key] = np.bincount(g.group[self.cell_member(h)],
                                            minlength=len(g.values)).astype(np.float64)
        return self._member[key]

    def cell_member(self, h: Heuristic) -> np.ndarray:
        key = (h.key, "cells")
        if key not in self._member:
            c = self.cells
            self._member[key] = h.contains(c.a, c.b, c.result)
        return self._member[key]


@dataclass
class _Deferred:
    """The tests of one p_values call, kept step by step and computed at the end."""

    value: dict[str, list] = field(default_factory=dict)  # t -> [(rows, shares, heuristics)]
    both: list = field(default_factory=list)  # [(rows, op1 (shares, h), op2 (shares, h))]
    identical: list = field(default_factory=list)  # [(rows, p-values)]
    conditional: dict[str, list] = field(default_factory=dict)  # t -> [(rows, sums, counts)]


@dataclass
class _Kinds:
    """Per heuristic of a scored list: what the p-value code branches on, as arrays
    indexed like the rows' heuristic column."""

    heuristics: list[Heuristic]
    target: np.ndarray  # op1, op2, result, both, or identical (the diagonal null)
    own: np.ndarray  # bool: a chosen set, whose p-value is its own
    direct: np.ndarray  # bool: scored on the KV map

    @classmethod
    def of(cls, heuristics: list[Heuristic]) -> _Kinds:
        return cls(heuristics,
                   np.array([h.target if h.spec.null != "diagonal" else "identical"
                             for h in heuristics] or [""]),
                   np.array([h.spec.null == "own" for h in heuristics] or [False],
                            dtype=bool),
                   np.array([h.direct for h in heuristics] or [False], dtype=bool))


def n_value_tests(null: ValueNull, partitions: list, with_bottom: bool, level: float) -> int:
    """The correction's K for one operator under the value null (``tarone``): every
    heuristic scored, twice when the bottom-k is scored too. Sets the null's Monte Carlo
    permutations for op1 = op2 to the fewest that can reach level / K (its smallest
    p-value, 1 / (1 + permutations), is then still within the level K counts)."""
    min_ps = [null.min_p(h) for part in partitions for h in part.heuristics]
    k = tarone(np.array(min_ps * (2 if with_bottom else 1)), level)
    null.permutations = int(min(null.permutations, max(1_000, np.ceil(k / level))))
    return k


def label_values(m, null: ValueNull, k_map: torch.Tensor, kv_map: torch.Tensor,
                 threshold: float, level: float, n_tests: int, per_family: int,
                 orders: dict | None = None):
    """The 'values' label rule on one operator's rows (``catalog.labels.matching.Matches``, neuron
    indices into the maps): rows scoring at least ``threshold`` get their value-null
    p-value and are labelled where it is at most level / n_tests, and the rows to store are
    chosen (``Matches.compact``); every stored score carries its p-value under the rule."""
    # the rows that could be stored: every row that could be labelled, and the best rows
    # of each family (Matches.compact keeps them whatever the labels): one pass over them
    m.implements = m.score >= threshold
    reach = np.array([null.min_p(h) <= level / n_tests for h in m.heuristics] or [True])
    m.testable = reach[m.heuristic]
    keep = m.compact(per_family)
    p = null.p_values(k_map, kv_map, keep.heuristics, keep.neuron, keep.heuristic, keep.bottom,
                      keep.score, orders, threshold, level / n_tests)
    keep.p_value = p
    keep.implements = (keep.score >= threshold) & (p <= level / n_tests)
    return keep.compact(per_family)


def label(m, config, n_tests: int, null: ValueNull | None, k_map: torch.Tensor,
          kv_map: torch.Tensor, orders: dict | None = None):
    """Apply the config's label rule to one operator's rows (neuron indices into the maps)
    and keep the rows to store: the one place CheckpointRun and the tests label."""
    if config.label_rule == "values":
        assert null is not None, "the values rule needs the operator's ValueNull"
        return label_values(m, null, k_map, kv_map, config.match_threshold,
                            config.significance_level, n_tests, config.scores_per_family,
                            orders)
    return m.label(config.match_threshold, config.label_rule, config.significance_level,
                   n_tests).compact(config.scores_per_family)


def score_for_labels(k_map: torch.Tensor, kv_map: torch.Tensor, cells: Cells,
                     partitions: list[Partition], config, n_tests: int,
                     null: ValueNull | None, with_bottom: bool, orders: dict,
                     pairs: tuple | None = None) -> Matches:
    """The scores that can decide a label, for counting labelled maps only (the controls):
    rows from the label threshold up, and under the values rule only the partitions with a
    heuristic whose smallest p-value reaches the corrected level (the others cannot be
    labelled, Tarone). Labelled afterwards, they give the labels that scoring every
    partition and ``label`` give (``catalog.labels.controls.labelled_maps``). ``pairs``:
    the second pass's (map, set) pairs (``score_partitions``)."""
    return score_partitions(k_map, kv_map, labelable_partitions(partitions, null, config,
                                                                n_tests),
                            label_floor(config), with_bottom, config.pattern_top_k,
                            cells=cells, orders=orders, pairs=pairs)


def label_floor(config) -> float:
    """The lowest score a row can be labelled with (rows below it are never labelled)."""
    return max(config.score_floor, config.match_threshold)


def second_pass_scoring(partitions: list[Partition], rescue, null: ValueNull | None, config,
                        n_tests: int) -> tuple[list[Partition], float]:
    """The partitions and the score floor the label rule's second pass scores with
    (``rescue``: True or a ``Rescue``; ``catalog.labels.operator_labels.rescued``): it keeps
    only the rows it labels, so only rows from the label threshold up, of the partitions
    of ``rescue_partitions`` that can be labelled. A row's score and p-value are its own,
    so these rows are labelled as when every row is scored."""
    return (labelable_partitions(rescue_partitions(partitions, rescue), null, config, n_tests),
            label_floor(config))


def labelable_partitions(partitions: list[Partition], null: ValueNull | None, config,
                         n_tests: int) -> list[Partition]:
    """The partitions with a heuristic that can be labelled: under the values rule, one
    whose smallest p-value reaches the corrected level (Tarone); all of them otherwise."""
    if null is None:
        return partitions
    reach = config.significance_level / n_tests
    return [part for part in partitions if any(null.min_p(h) <= reach for h in part.heuristics)]
