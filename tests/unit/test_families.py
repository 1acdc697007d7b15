"""A heuristic family is one object in one file (issue 82): the registry finds a new file
of ``catalog/labels/families/`` by itself, and the labels, the charts' colours, the
docs' table and the config's refusals all follow it.

The planted family (perfect squares, docs/extending.md's example as written there) is
written as a new module into a folder added to the package's search path, the way a new
file of the package is found, so the checkout is not touched; nothing else is edited for
it."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from labelling import cells_of, labelled

import catalog.labels.families as fam_pkg
from catalog.config import ScienceConfig
from catalog.labels.families import (
    DEFAULT_FAMILIES,
    Family,
    check_names,
    chosen_on,
    docs_table,
    families,
)
from catalog.labels.heuristics import Heuristic, partitions_for

ROOT = Path(__file__).resolve().parents[2]

# the planted family is docs/extending.md's example, as a reader would copy it into a file
EXAMPLE = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "extending.md").read_text(),
                    flags=re.S)[1]


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The planted family's file in a folder of the families package's path; the
    registry loads it the next time it is asked, and forgets it afterwards."""
    (tmp_path / "square.py").write_text(EXAMPLE)
    monkeypatch.setattr(fam_pkg, "__path__", [*fam_pkg.__path__, str(tmp_path)])
    monkeypatch.setattr(fam_pkg, "_loaded", False)
    yield "square"
    fam_pkg.unregister("square")
    sys.modules.pop("catalog.labels.families.square", None)


def test_the_catalogs_families_and_their_defaults():
    assert list(families())[:len(DEFAULT_FAMILIES)] == list(DEFAULT_FAMILIES)
    assert ScienceConfig().families == DEFAULT_FAMILIES
    assert [f.name for f in chosen_on(DEFAULT_FAMILIES, "/")] == ["multi_result"]
    assert chosen_on(DEFAULT_FAMILIES, "+") == []
    # each family's definition of membership, on numbers it is known for
    x = np.array([0, 3, 13, 23, 42, 99])
    h = {n: f for n, f in families().items()}
    assert h["range"].test(x, (10, 20)).tolist() == [False, False, True, True, False, False]
    assert h["modulo"].test(x, (10, 3)).tolist() == [False, True, True, True, False, False]
    assert h["pattern"].test(x, ("..3",)).tolist() == [False, True, True, True, False, False]
    assert h["value"].test(x, (42,)).tolist() == [False] * 4 + [True, False]
    assert h["multi_result"].test(x, (0, 99)).tolist() == [True] + [False] * 4 + [True]
    ident = Heuristic("identical", "both", ())
    assert ident.contains(np.array([1, 2]), np.array([1, 3]), np.array([2, 5])).tolist() == [
        True, False]
    assert Heuristic("modulo", "both", (5, 2)).contains(
        np.array([2, 7, 2]), np.array([12, 12, 3]), np.zeros(3)).tolist() == [True, True, False]
    assert Heuristic("range", "result", (20, 10)).label == "result in [20, 30)"


def test_docs_table_is_the_registrys():
    """docs/method.md's table of families is written from the registry (a family's own
    line), so it names every family there is."""
    from catalog.labels.families.__main__ import DOC, rendered

    text = DOC.read_text()
    assert rendered(text) == text, "run python -m catalog.labels.families --write"
    for name in families():
        assert f"| `{name}` |" in text


def test_a_stored_row_of_a_family_not_registered_reads_as_its_key():
    h = Heuristic("squares", "result", (4,))
    assert h.label == "squares:result:4"
    with pytest.raises(ValueError, match="unknown heuristic family 'squares'"):
        h.contains(np.zeros(1), np.zeros(1), np.zeros(1))


def test_an_unknown_family_is_refused_with_its_name():
    with pytest.raises(ValueError, match="'squares' unknown"):
        check_names(["range", "squares"])
    with pytest.raises(ValueError, match="non-empty"):
        check_names([])
    with pytest.raises(ValueError, match="'squares' unknown"):
        partitions_for(cells_of("+", 10), ScienceConfig(operand_hi=10,
                                                         families=("squares",)))


@pytest.mark.parametrize("bad,why", [
    (dict(pair=lambda a, b, p: a == b), "needs a null of its own"),
    (dict(null="own"), "only a chosen set"),
    (dict(partitions=None), "has partitions"),
    (dict(null="exact"), "null must be one of"),
    (dict(name="two words"), "must be an identifier"),
])
def test_a_family_that_cannot_be_tested_is_refused(bad, why):
    base = dict(name="x", doc="", color="#000", describe=lambda who, p: "",
                test=lambda x, p: x > 0, partitions=lambda cells, config: [])
    with pytest.raises(ValueError, match=why):
        Family(**{**base, **bad})


def test_a_planted_family_is_picked_up_from_its_own_file(planted):
    """The planted file alone (docs/extending.md's example): the registry, the config,
    the labels (the catalog's own label rule, value null and gate), the charts' colours
    and the docs' table."""
    from reports.plots import family_colors

    check_names(["range", planted])
    assert families()[planted].null == "value"  # a one-number family gets the value null
    assert family_colors()[planted] == "#17becf"
    assert "| `square` | value | a perfect square |" in docs_table()
    h = Heuristic(planted, "result", ())
    assert h.label == "result is a perfect square"
    assert h.contains(np.zeros(4), np.zeros(4), np.array([0, 2, 4, 49])).tolist() == [
        True, False, True, True]

    op, hi = "+", 30
    cells = cells_of(op, hi)
    config = ScienceConfig(operand_hi=hi, families=("range", "modulo", planted))
    keys = {h.key for p in partitions_for(cells, config) for h in p.heuristics}
    assert {f"{planted}:{t}" for t in ("op1", "op2", "result")} <= keys
    rng = np.random.default_rng(82)
    n = 24
    square = families()[planted].test(cells.result, ()).astype(np.float32)
    maps = rng.standard_normal((n, len(cells.a))).astype(np.float32) * 0.3
    planted_rows = np.arange(4)  # these follow "the result is a perfect square"
    maps[planted_rows] += 2.0 * square
    m = labelled(op, cells, maps, maps, config)
    got = {(int(m.neuron[i]), m.row_heuristic(i).key) for i in range(len(m)) if m.implements[i]}
    carriers = {nrn for nrn, key in got if key == f"{planted}:result"}
    assert carriers == set(planted_rows.tolist()), got
