"""The label rule's fits kept on disk for the next process (``catalog.labels.fit_store``):
a process that finds them builds nothing and explains every map as the process that built
them did, to the bit; a changed rule, a torn file, a full bound or an unwritable home never
gives a wrong fit or an error."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest
import torch
from labelling import cells_of

from catalog.config import ScienceConfig
from catalog.labels import fit_models, fit_store
from catalog.labels import operator_labels as ol

CONFIG = ScienceConfig(operand_hi=16)


def _bound(monkeypatch, value: int) -> None:
    """``NCAT_FIT_CACHE_BYTES`` set, as a new process would read it."""
    monkeypatch.setenv("NCAT_FIT_CACHE_BYTES", str(value))
    fit_store.where.cache_clear()
    monkeypatch.setattr(fit_store, "_COUNTED", {})


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on, in a home of its own; this process's in-memory fits forgotten. The
    settings read back at the end (the rest of the suite runs with the store off)."""
    monkeypatch.setenv("NCAT_HOME", str(tmp_path))
    _bound(monkeypatch, 1 << 30)
    monkeypatch.setattr(ol, "_FITS", ol.OrderedDict())
    monkeypatch.setattr(fit_models, "_MODELS", fit_models.weakref.WeakValueDictionary())
    yield tmp_path / "fits"
    monkeypatch.undo()
    fit_store.where.cache_clear()


def _forget(monkeypatch) -> None:
    """A new process: nothing of the fits built so far kept in memory."""
    monkeypatch.setattr(ol, "_FITS", ol.OrderedDict())
    monkeypatch.setattr(fit_models, "_MODELS", fit_models.weakref.WeakValueDictionary())
    gc.collect()


def _explained(fit, maps: torch.Tensor) -> list[np.ndarray]:
    ex = fit.explain(maps)
    return [ex.operands, ex.result, ex.joint, ex.other, *ex.rivals.values()]


def _refuse_building(monkeypatch) -> None:
    def no(*_a, **_k):
        raise AssertionError("built again although it was stored")
    monkeypatch.setattr(ol, "build_operand_fit", no)
    monkeypatch.setattr(fit_models.FoldModel, "of", classmethod(no))


def test_a_stored_fit_is_read_back_and_explains_every_map_to_the_bit(store, monkeypatch):
    cells = cells_of("+", 16)
    maps = torch.as_tensor(np.random.default_rng(0).normal(size=(40, len(cells.a))))
    built = ol.operand_fit(CONFIG, cells)
    want = _explained(built, maps)
    files = sorted(p.name.split("-")[0] for p in store.glob("*.pt"))
    # the fit and each explanation's held-out model, one file each
    models = {id(m) for m in built._models.values()}
    assert files.count("fit") == 1 and files.count("fold") == len(models) > 3
    del built
    _forget(monkeypatch)
    _refuse_building(monkeypatch)
    read = ol.operand_fit(CONFIG, cells)
    got = _explained(read, maps)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
    assert read.op == "+" and np.array_equal(read.cells[2], cells.result)


def test_another_rule_config_or_grid_is_built_not_read(store, monkeypatch):
    cells = cells_of("+", 16)
    ol.operand_fit(CONFIG, cells).explain(torch.ones(2, len(cells.a), dtype=torch.float64))
    n = len(list(store.glob("*.pt")))
    counted = []
    real = ol.build_operand_fit
    monkeypatch.setattr(ol, "build_operand_fit",
                        lambda *a, **k: counted.append(1) or real(*a, **k))
    for change in ("code", "config", "grid"):
        _forget(monkeypatch)
        if change == "code":
            monkeypatch.setattr(fit_store, "code_version", lambda: "another rule")
            ol.operand_fit(CONFIG, cells)
        elif change == "config":
            ol.operand_fit(ScienceConfig(operand_hi=16, seed=1), cells)
        else:
            ol.operand_fit(CONFIG, cells_of("-", 16))
    assert len(counted) == 3
    assert len(list(store.glob("fit-*.pt"))) == 4 and len(list(store.glob("*.pt"))) > n


def test_a_torn_file_is_built_again_and_replaced(store, monkeypatch):
    cells = cells_of("*", 12)
    want = ol.operand_fit(CONFIG, cells).additive.residual(
        torch.arange(len(cells.a), dtype=torch.float64)[None])
    (path,) = store.glob("fit-*.pt")
    path.write_bytes(path.read_bytes()[:1000])  # a write cut short by another tool
    _forget(monkeypatch)
    again = ol.operand_fit(CONFIG, cells)
    got = again.additive.residual(torch.arange(len(cells.a), dtype=torch.float64)[None])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    _forget(monkeypatch)
    _refuse_building(monkeypatch)
    assert ol.operand_fit(CONFIG, cells).op == "*"  # the rebuilt file reads back whole


def test_the_least_recently_used_files_go_first_past_the_bound(store, monkeypatch):
    store.mkdir(parents=True)
    for i, name in enumerate(["a", "b", "c", "d"]):
        (store / f"fit-{name}.pt").write_bytes(b"x" * 100)
        os.utime(store / f"fit-{name}.pt", (1000 + i, 1000 + i))
    os.utime(store / "fit-a.pt", (2000, 2000))  # read back last
    # what a process killed while writing left, an hour and a minute ago, and one being
    # written now by another process
    for name, age in (("old", 3660), ("now", 0)):
        (store / f".writing-{name}.pt").write_bytes(b"x" * 10)
        os.utime(store / f".writing-{name}.pt", (time.time() - age, time.time() - age))
    fit_store.trim(store, 250)
    assert sorted(p.name for p in store.glob("*.pt")) == [".writing-now.pt", "fit-a.pt",
                                                          "fit-d.pt"]
    # an object larger than the bound is not written at all
    _bound(monkeypatch, 5000)
    fit_store.save("fit", ("big",), torch.zeros(1000), 10_000)
    assert sorted(p.name for p in store.glob("fit-*.pt")) == ["fit-a.pt", "fit-d.pt"]
    # saves (about 2 kB each on disk) list the folder once, then again only when what was
    # counted and written since passes the bound; then the least recently used go first
    for name in ("s1", "s2"):
        fit_store.save("fit", (name,), torch.zeros(100), 400)
    assert len(list(store.glob("fit-*.pt"))) == 4  # 4.1 kB: under the bound
    fit_store.save("fit", ("s3",), torch.zeros(100), 400)
    left = {p.name for p in store.glob("fit-*.pt")}
    assert len(left) == 2 and not left & {"fit-a.pt", "fit-d.pt"}
    assert sum(p.stat().st_size for p in store.glob("fit-*.pt")) <= 5000


def test_off_or_unwritable_the_fit_is_built_and_nothing_fails(store, tmp_path, monkeypatch):
    cells = cells_of("-", 12)
    _bound(monkeypatch, 0)
    assert ol.operand_fit(CONFIG, cells).op == "-" and not store.exists()
    _bound(monkeypatch, 1 << 30)
    store.write_text("a file where the folder would be")
    _forget(monkeypatch)
    assert ol.operand_fit(CONFIG, cells).op == "-"
    assert store.read_text() == "a file where the folder would be"
