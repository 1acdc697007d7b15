"""Heuristics (docs/method.md section 7): the prompt sets that neurons are matched against.

A heuristic H is a set S_H of grid prompts it is "about": op1 in [20, 30), result
= 3 (mod 5), op2 ends in 7, op1 = op2, ... Families are pluggable (a registry that
refuses duplicate names). Each family yields *partitions*: groups of heuristics
whose sets are disjoint over one operator's cells, written as one label per cell
(-1 for cells in none). Scoring (catalog.labels.matching) works a partition at a time,
which is what makes matching every neuron against every heuristic fast.

Operand heuristics (targets op1, op2, both) are scored on the activation map K;
result heuristics on the KV map, the neuron's direct push on the right answer.
Each heuristic also knows its own membership rule (``contains``), used by the
slow reference implementation in the tests and by knockouts.
"""

from __future__ import annotations

from collections.abc import Callable
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
    def label(self) -> str:
        who = {"op1": "op1", "op2": "op2", "both": "op1 and op2", "result": "result"}[self.target]
        p = self.params
        if self.family == "range":
            return f"{who} in [{p[0]}, {p[0] + p[1]})"
        if self.family == "modulo":
            return f"{who} = {p[1]} (mod {p[0]})"
        if self.family == "pattern":
            return f"{who} matches {p[0]}"
        if self.family == "value":
            return f"{who} = {p[0]}"
        if self.family == "identical":
            return "op1 = op2"
        if self.family == "multi_result":
            return f"result in {{{', '.join(map(str, p))}}}"
        return self.key

    def contains(self, a: np.ndarray, b: np.ndarray, result: np.ndarray) -> np.ndarray:  # noqa: C901
        """Boolean membership of cells (a, b, result) in S_H: the definition itself."""
        p = self.params
        if self.family == "identical":
            return a == b
        if self.family == "multi_result":
            return np.isin(result, np.array(p))
        if self.family == "range":
            def test(x):
                return (x >= p[0]) & (x < p[0] + p[1])
        elif self.family == "modulo":
            def test(x):
                return x % p[0] == p[1]
        elif self.family == "value":
            def test(x):
                return x == p[0]
        elif self.family == "pattern":
            def test(x):
                ok = x < 1000
                for pos, ch in enumerate(p[0]):
                    if ch != ".":
                        ok &= (x // 10 ** (2 - pos)) % 10 == int(ch)
                return ok
        else:
            raise ValueError(f"unknown heuristic family {self.family!r}")
        if self.target == "op1":
            return test(a)
        if self.target == "op2":
            return test(b)
        if self.target == "both":
            return test(a) & test(b)
        return test(result)


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


FamilyBuilder = Callable[[Cells, ScienceConfig], list[Partition]]
FAMILIES: dict[str, FamilyBuilder] = {}


def register_family(name: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    """Register a heuristic family builder; a second family of the same name is refused."""
    def deco(fn: FamilyBuilder) -> FamilyBuilder:
        if name in FAMILIES:
            raise ValueError(f"heuristic family {name!r} is already registered")
        FAMILIES[name] = fn
        return fn
    return deco


def _partition(
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


def _operand_targets(op: str) -> tuple[str, ...]:
    return ("op1", "op2", "both")


def _value_targets(op: str) -> tuple[str, ...]:
    return ("op1", "op2", "result") if op != "/" else ("op1", "op2")


def operand_range_widths(op: str) -> tuple[int, ...]:
    return (3, 5, 10) if op == "*" else (10, 30, 50, 100)


def result_range_widths(op: str) -> tuple[int, ...]:
    return {"+": (10, 30, 50), "-": (10, 30, 50), "*": (10, 30, 50, 100), "/": (2, 10, 100)}[op]


@register_family("range")
def range_partitions(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """Operand windows [s, s+w) that tile [lo, hi); overlapping result windows."""
    out = []
    span = cells.hi - cells.lo
    for w in operand_range_widths(cells.op):
        if w >= span:
            continue
        starts = list(range(cells.lo, cells.hi, w))
        ia = (cells.a - cells.lo) // w
        ib = (cells.b - cells.lo) // w
        for target in _operand_targets(cells.op):
            labels = {"op1": ia, "op2": ib, "both": np.where(ia == ib, ia, -1)}[target]
            hs = [Heuristic("range", target, (s, w)) for s in starts]
            out.append(_partition(cells, labels, hs))
    top = int(cells.result.max())
    for w in result_range_widths(cells.op):
        step = max(w // 3, 10)
        starts = list(range(0, top + 1, step))
        groups = -(-w // step)  # windows j and j + groups never overlap
        for g in range(groups):
            gs = starts[g::groups]
            labels = np.full(len(cells.a), -1, dtype=np.int64)
            for j, s in enumerate(gs):
                labels[(cells.result >= s) & (cells.result < s + w)] = j
            out.append(_partition(cells, labels, [Heuristic("range", "result", (s, w))
                                                  for s in gs]))
    return [p for p in out if p is not None]


@register_family("modulo")
def modulo_partitions(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """x = m (mod n) for op1, op2, both operands and the result (not for /)."""
    out = []
    targets = ("op1", "op2", "both") + (("result",) if cells.op != "/" else ())
    for n in config.modulo_bases():
        for target in targets:
            if target == "both":
                ra, rb = cells.a % n, cells.b % n
                labels = np.where(ra == rb, ra, -1)
            else:
                labels = cells.values(target) % n
            hs = [Heuristic("modulo", target, (n, m)) for m in range(n)]
            out.append(_partition(cells, labels, hs))
    return [p for p in out if p is not None]


# Fixed-digit positions of the zero-padded 3-digit number; prefix patterns
# ("1..", "12.") are left to the range family, full numbers are values.
PATTERN_SHAPES = ((2,), (1,), (1, 2), (0, 2))


@register_family("pattern")
def pattern_partitions(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """Digit patterns with wildcards, e.g. ``..3``, ``.2.``, ``1.3`` (not for / results)."""
    out = []
    scoring = "count" if config.heuristic_variant == "code" else "topk"
    seen: set[bytes] = set()
    for target in _value_targets(cells.op):
        x = cells.values(target)
        digits = [(x // 100) % 10, (x // 10) % 10, x % 10]
        for shape in PATTERN_SHAPES:
            code = np.zeros_like(x)
            for pos in shape:
                code = code * 10 + digits[pos]
            labels = np.where(x < 1000, code, -1)
            # The same cell grouping under another shape (e.g. "0.3" when every
            # number is below 100) would only repeat heuristics: skip it.
            _, canon = np.unique(labels, return_inverse=True)
            sig = target.encode() + canon.astype(np.int64).tobytes()
            if sig in seen:
                continue
            seen.add(sig)
            hs = []
            for c in range(10 ** len(shape)):
                pat = ["."] * 3
                for i, pos in enumerate(shape):
                    pat[pos] = str((c // 10 ** (len(shape) - 1 - i)) % 10)
                hs.append(Heuristic("pattern", target, ("".join(pat),)))
            out.append(_partition(cells, labels, hs, scoring=scoring))
    return [p for p in out if p is not None]


@register_family("identical")
def identical_partitions(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """op1 = op2."""
    labels = np.where(cells.a == cells.b, 0, -1)
    p = _partition(cells, labels, [Heuristic("identical", "both", ())])
    return [p] if p is not None else []


# Values are numbers below 1000 (the pattern family's 3-digit numbers written out in
# full); a one-cell set can never be significant, so sets need two cells.
VALUE_LIMIT = 1000


@register_family("value")
def value_partitions(cells: Cells, config: ScienceConfig) -> list[Partition]:
    """One number: op1 = v, op2 = v, result = v (v < 1000, at least two cells)."""
    out = []
    for target in ("op1", "op2", "result"):
        x = cells.values(target)
        labels = np.where(x < VALUE_LIMIT, x, -1).astype(np.int64)
        hs = [Heuristic("value", target, (v,)) for v in range(VALUE_LIMIT)]
        out.append(_partition(cells, labels, hs, min_size=2))
    return [p for p in out if p is not None]


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
    """Every partition of the config's families (all registered ones the config names),
    each cell set once (``dedupe``)."""
    out = []
    for name, build in FAMILIES.items():
        if name in config.families:
            out.extend(build(cells, config))
    return dedupe(out) if config.dedupe_heuristics else out


# Which name a cell set keeps when several heuristics select it: the simplest family
# first, and within a family the first built (smaller moduli, narrower windows).
SIMPLICITY = ("value", "range", "modulo", "pattern", "identical")


def dedupe(partitions: list[Partition]) -> list[Partition]:
    """Drop heuristics whose cell set another heuristic already has (scored on the same map
    the same way), keeping the simplest name (``SIMPLICITY``) with the others as its
    ``aliases``: on [0, 20) ``op1 in [10, 20)`` and the pattern ``.1.`` are one set, and
    counting it twice would split one finding into two labels and inflate the correction.
    Partitions keep their order; a partition left empty is dropped."""
    rank = {f: i for i, f in enumerate(SIMPLICITY)}
    order = sorted(range(len(partitions)),
                   key=lambda i: rank.get(partitions[i].heuristics[0].family, len(rank)))
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


def n_tests(partitions: list[Partition], with_bottom: bool, multi_result: bool) -> int:
    """How many heuristics one neuron is scored against (the label rule's m): each
    partition's heuristics, twice when the bottom-k is scored too, plus one for the
    multi-result family (its own choice is corrected inside its p-value)."""
    n = sum(len(p.heuristics) for p in partitions)
    return n * (2 if with_bottom else 1) + int(multi_result)
