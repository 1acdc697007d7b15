"""Heuristic families, one object each (issue 82): how a family's heuristics are built on
an operator's cells, how each is written, which numbers or cells it holds for, which null
its labels are tested against, its colour in plots and its line in the docs.

Every module of this package defines one family and registers it with ``register``; the
package finds its modules itself (``families`` imports each the first time it is asked),
so adding a family is adding a file here (docs/extending.md). A family defined elsewhere
(a plug-in, a test) is registered by calling ``register`` with it.

The nulls a family may name (``Family.null``; ``catalog.labels.value_null``):

- ``"value"``: its sets are made of numbers (op1, op2, both operands, the result), and a
  label must beat the exact null of those numbers' values relabelled at random within
  their strata, and the conditional tests (the other numbers held fixed). Any family
  whose ``test`` says which numbers belong gets it without code of its own.
- ``"diagonal"``: a rule on the operand pair (op1 = op2), tested by permuting op1's and
  op2's values separately (Monte Carlo, ``catalog.labels.tails.identical_p``).
- ``"own"``: the set is chosen per neuron (``chosen``: a few results of ``/``), and its
  p-value carries the correction for that choice (``catalog.labels.matching``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from catalog.config.vocab import DEFAULT_FAMILIES

NULLS = ("value", "diagonal", "own")


@dataclass(frozen=True)
class Family:
    """One heuristic family.

    - ``name``: its key in stored rows (``heuristic.family``) and in configs.
    - ``doc``: one line for the docs (docs/labels.md's table is written from it).
    - ``color``: its colour in every chart (a CSS colour).
    - ``describe(who, params)``: a heuristic's readable label, ``who`` being "op1", "op2",
      "op1 and op2" or "result".
    - ``test(x, params)``: whether each number of ``x`` belongs to the heuristic's set;
      a heuristic of op1, op2 or the result applies it to that number, one of both
      operands to each.
    - ``pair(a, b, params)``: for a rule on the operand pair instead of one number
      (op1 = op2), whether each cell belongs; ``test`` then says which single values can.
    - ``partitions(cells, config)``: its heuristics on one operator's cells, as disjoint
      groups (``catalog.labels.heuristics.Partition``); None for a chosen family.
    - ``null``: which null its labels are tested against (``NULLS``).
    - ``simplicity``: where several heuristics select the same cells, the family with the
      smallest keeps the name (the others become its aliases).
    - ``rival_sets``: whether its result sets under other operators compete one by one
      with a result label (``catalog.labels.operator_labels``); windows are scanned whole.
    - ``chosen``/``operators``/``score``: a family whose set is chosen per neuron (the
      results a neuron pushes most), scored on these operators only, by
      ``score(kv_map, result, config, op)`` (``catalog.labels.matches.Matches``).
    """

    name: str
    doc: str
    color: str
    describe: Callable[[str, tuple], str]
    test: Callable[[np.ndarray, tuple], np.ndarray]
    partitions: Callable | None = None
    pair: Callable[[np.ndarray, np.ndarray, tuple], np.ndarray] | None = None
    null: str = "value"
    simplicity: int = 100
    rival_sets: bool = False
    chosen: bool = False
    operators: tuple[str, ...] = ("+", "-", "*", "/")
    score: Callable | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a heuristic family's name must be an identifier, got "
                             f"{self.name!r}")
        if self.null not in NULLS:
            raise ValueError(f"family {self.name!r}: null must be one of {NULLS}, got "
                             f"{self.null!r}")
        if (self.partitions is None) != self.chosen or (self.score is None) != (
                not self.chosen):
            raise ValueError(f"family {self.name!r}: a family has partitions, or, if its "
                             "set is chosen per neuron (chosen=True), a score instead")
        if self.chosen != (self.null == "own"):
            raise ValueError(f"family {self.name!r}: a chosen set carries its own null "
                             "(null='own'), and only a chosen set does")
        if self.pair is not None and self.null == "value":
            raise ValueError(f"family {self.name!r}: a rule on the operand pair needs a "
                             "null of its own (the value null tests one number's values)")

    def contains(self, target: str, params: tuple, a: np.ndarray, b: np.ndarray,
                 result: np.ndarray) -> np.ndarray:
        """Whether each cell (a, b, result) is in the set of the heuristic (target,
        params) of this family: the definition itself."""
        if self.pair is not None:
            return self.pair(a, b, params)
        if target == "op1":
            return self.test(a, params)
        if target == "op2":
            return self.test(b, params)
        if target == "both":
            return self.test(a, params) & self.test(b, params)
        return self.test(result, params)


_REGISTRY: dict[str, Family] = {}
_loaded = False


def register(family: Family) -> Family:
    """Add a family to the registry; a second family of the same name is refused."""
    if family.name in _REGISTRY:
        raise ValueError(f"heuristic family {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    """Take a family out of the registry (a test's planted family, when it is done)."""
    _REGISTRY.pop(name, None)


def _load() -> None:
    """Import every module of this package once: each registers its family."""
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if not mod.name.startswith("_"):  # __main__ writes the docs' table
                importlib.import_module(f"{__name__}.{mod.name}")


def families() -> dict[str, Family]:
    """Every registered family by name, the package's own in a fixed order first."""
    _load()
    order = {n: i for i, n in enumerate(DEFAULT_FAMILIES)}  # the catalog's own, in order
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (order.get(kv[0], len(order)),
                                                           kv[0])))


def find(name: str) -> Family | None:
    """The family called ``name``, or None where none is registered."""
    _load()
    return _REGISTRY.get(name)


def family(name: str) -> Family:
    """The family called ``name``; a clear error naming the known ones otherwise."""
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown heuristic family {name!r}; known: "
                         f"{', '.join(families())}") from None


def check_names(names: Iterable[str]) -> None:
    """ValueError naming what is wrong unless ``names`` is a non-empty list of known
    families (a config's ``families``)."""
    names = list(names)
    known = families()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"families {names} must be a non-empty subset of "
                         f"{tuple(known)}: {', '.join(map(repr, bad)) or 'none given'}"
                         f"{' unknown' if bad else ''}")


def chosen_on(names: Iterable[str], op: str) -> list[Family]:
    """The chosen-set families among ``names`` that score operator ``op`` (each has a
    ``score``)."""
    fams = families()
    return [fams[n] for n in names if n in fams and fams[n].chosen and op in fams[n].operators
            and fams[n].score is not None]


def colors() -> dict[str, str]:
    """Each family's chart colour by name."""
    return {n: f.color for n, f in families().items()}


def docs_table() -> str:
    """The families as a markdown table (docs/method.md's, written with
    ``python -m catalog.labels.families --write``)."""
    lines = ["| family | null | what its heuristics say |", "|---|---|---|"]
    lines += [f"| `{n}` | {f.null} | {f.doc} |" for n, f in families().items()]
    return "\n".join(lines) + "\n"
