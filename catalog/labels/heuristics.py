"""Heuristics (docs/method.md section 7): the prompt sets that neurons are matched against.

A heuristic H is a set S_H of grid prompts it is "about": op1 in [20, 30), result
= 3 (mod 5), op2 ends in 7, op1 = op2, ... Each family is one object in its own module of
``catalog.labels.families`` (a registry that refuses duplicate names; docs/extending.md
says how to add one). Each family yields *partitions*: groups of heuristics
whose sets are disjoint over one operator's cells, written as one label per cell
(-1 for cells in none). Scoring (catalog.labels.matching) works a partition at a time,
which is what makes matching every neuron against every heuristic fast.

Operand heuristics (targets op1, op2, both) are scored on the activation map K;
result heuristics on the KV map, the neuron's direct push on the right answer.
Each heuristic also knows its own membership rule (``contains``), used by the
slow reference implementation in the tests and by knockouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from catalog.config import ScienceConfig

TARGETS = ("op1", "op2", "both", "result")


@dataclass(frozen=True)
class Heuristic:
    """One heuristic: family, target, parameters, and a readable label.

    ``params`` by family: range (start, width); modulo (modulus, residue);
    pattern (pattern string of 3 characters, digits or '.'); value (the number);
    identical (); multi_result (sorted tuple of results).
    """

    family: str
    target: str
    params: tuple
    # labels of other heuristics with the same cells on this grid (``dedupe``); not part
    # of the heuristic's identity
    aliases: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """Stable text id, e.g. ``range:op1:20:10``."""
        return ":".join([self.family, self.target, *map(str, self.params)])

    @property
    def direct(self) -> bool:
        """Result heuristics act through the neuron's direct effect (scored on the KV map)."""
        return self.target == "result"

    @property
    def spec(self):
        """The family object (``catalog.labels.families``) this heuristic belongs to."""
        from catalog.labels.families import family

        return family(self.family)

    @property
    def chosen(self) -> bool:
        """Whether its set was chosen per neuron (multi-result), not a fixed heuristic."""
        return self.spec.chosen

    @property
    def label(self) -> str:
        """Its readable label; its key where its family is not registered here (a row a
        catalog stored under a family this installation lacks)."""
        from catalog.labels.families import find

        fam = find(self.family)
        if fam is None:
            return self.key
        who = {"op1": "op1", "op2": "op2", "both": "op1 and op2", "result": "result"}[self.target]
        return fam.describe(who, self.params)

    def contains(self, a: np.ndarray, b: np.ndarray, result: np.ndarray) -> np.ndarray:
        """Boolean membership of cells (a, b, result) in S_H: the definition itself."""
        return self.spec.contains(self.target, self.params, a, b, result)


@dataclass
class Partition:
    """Disjoint heuristics over one operator's cells.

    labels: (n_cells,) index into ``heuristics`` or -1. sizes: |S_H| of each.
    scoring: "topk" (Algorithm 1) or "count" (the released code's pattern count).
    """

    heuristics: list[Heuristic]
    labels: np.ndarray
    sizes: np.ndarray
    scoring: str = "topk"

    @property
    def direct(self) -> bool:
        return self.heuristics[0].direct


@dataclass(frozen=True)
class Cells:
    """The valid cells of one operator's grid."""

    op: str
    a: np.ndarray
    b: np.ndarray
    result: np.ndarray
    lo: int
    hi: int

    def values(self, target: str) -> np.ndarray:
        return {"op1": self.a, "op2": self.b, "result": self.result}[target]


def partition(
    cells: Cells, labels: np.ndarray, heuristics: list[Heuristic], scoring: str = "topk",
    min_size: int = 1,
) -> Partition | None:
    """Drop heuristics with fewer than ``min_size`` cells and trivial ones (every cell);
    renumber labels."""
    n = len(cells.a)
    sizes = np.bincount(labels[labels >= 0], minlength=len(heuristics))
    keep = (sizes >= max(min_size, 1)) & (sizes < n)
    if not keep.any():
        return None
    new_id = np.full(len(heuristics), -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    lab = np.where(labels >= 0, new_id[np.maximum(labels, 0)], -1)
    return Partition(
        heuristics=[h for h, k in zip(heuristics, keep, strict=True) if k],
        labels=lab.astype(np.int64),
        sizes=sizes[keep].astype(np.int64),
        scoring=scoring,
    )


def operand_targets(op: str) -> tuple[str, ...]:
    return ("op1", "op2", "both")


def value_targets(op: str) -> tuple[str, ...]:
    return ("op1", "op2", "result") if op != "/" else ("op1", "op2")


def result_partitions(partitions: list[Partition]) -> list[Partition]:
    """The partitions of result heuristics of one value set (no multi-result sets)."""
    return [p for p in partitions
            if p.heuristics and p.heuristics[0].target == "result"
            and p.heuristics[0].family != "multi_result"]


@dataclass(frozen=True)
class Rescue:
    """The label rule's second pass, as its scoring callers are told: ``skip`` holds the
    keys of heuristics it cannot label on any of the maps given (always true, even with
    nothing to skip)."""

    skip: frozenset = frozenset()
    # (each map's set, each heuristic's set by key): each map is one (map, set) pair and
    # only that set's heuristics are scored on it (``catalog.labels.pair_scores``); None:
    # every heuristic of the partitions scored
    pairs: tuple | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return True


def rescue_pairs(rescue) -> tuple | None:
    """The (map, set) pairs a second pass's scoring is told of (``Rescue.pairs``), or None."""
    return rescue.pairs if isinstance(rescue, Rescue) else None


def rescue_partitions(partitions: list[Partition], rescue) -> list[Partition]:
    """The partitions the label rule's second pass scores (``rescue``: True, or a
    ``Rescue``): the result partitions of one value set (``result_partitions``), less
    those whose every heuristic the ``Rescue`` skips."""
    parts = result_partitions(partitions)
    if isinstance(rescue, Rescue) and rescue.skip:
        parts = [p for p in parts if any(h.key not in rescue.skip for h in p.heuristics)]
    return parts


def partitions_for(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """Every partition of the config's families (``catalog.labels.families``, in the
    registry's order), each cell set once (``dedupe``)."""
    from catalog.labels.families import check_names, families

    check_names(config.families)
    out = []
    for name, fam in families().items():
        if name in config.families and fam.partitions is not None:
            out.extend(fam.partitions(cells, config))
    return dedupe(out) if config.dedupe_heuristics else out


def dedupe(partitions: list[Partition]) -> list[Partition]:
    """Drop heuristics whose cell set another heuristic already has (scored on the same map
    the same way), keeping the simplest name (the smallest ``Family.simplicity``; within a
    family the first built: smaller moduli, narrower windows) with the others as its
    ``aliases``: on [0, 20) ``op1 in [10, 20)`` and the pattern ``.1.`` are one set, and
    counting it twice would split one finding into two labels and inflate the correction.
    Partitions keep their order; a partition left empty is dropped."""
    order = sorted(range(len(partitions)),
                   key=lambda i: partitions[i].heuristics[0].spec.simplicity)
    owner: dict[tuple, tuple[int, int]] = {}  # cell set -> (partition, heuristic) keeping it
    drop: dict[int, set[int]] = {}
    aliases: dict[tuple[int, int], list[str]] = {}
    for pi in order:
        part = partitions[pi]
        cell_idx = np.argsort(part.labels, kind="stable")
        bounds = np.searchsorted(part.labels[cell_idx], np.arange(len(part.heuristics) + 1))
        for hi, h in enumerate(part.heuristics):
            cells = cell_idx[bounds[hi]:bounds[hi + 1]]
            sig = (h.direct, part.scoring, cells.tobytes())
            if sig in owner:
                drop.setdefault(pi, set()).add(hi)
                aliases.setdefault(owner[sig], []).append(h.label)
            else:
                owner[sig] = (pi, hi)
    out = []
    for pi, part in enumerate(partitions):
        gone = drop.get(pi, set())
        hs = [replace(h, aliases=tuple(aliases.get((pi, hi), ())))
              for hi, h in enumerate(part.heuristics)]
        if not gone and not any(h.aliases for h in hs):
            out.append(part)
            continue
        keep = np.array([hi not in gone for hi in range(len(hs))])
        if not keep.any():
            continue
        new_id = np.full(len(hs), -1, dtype=np.int64)
        new_id[keep] = np.arange(int(keep.sum()))
        labels = np.where(part.labels >= 0, new_id[np.maximum(part.labels, 0)], -1)
        out.append(Partition([h for h, k in zip(hs, keep, strict=True) if k], labels,
                             part.sizes[keep], part.scoring))
    return out


def n_tests(partitions: list[Partition], with_bottom: bool, multi_result: int) -> int:
    """How many heuristics one neuron is scored against (the label rule's m): each
    partition's heuristics, twice when the bottom-k is scored too, plus one per chosen-set
    family (multi-result: its own choice is corrected inside its p-value)."""
    n = sum(len(p.heuristics) for p in partitions)
    return n * (2 if with_bottom else 1) + int(multi_result)
