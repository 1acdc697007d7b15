"""The label rule's fits kept on disk for the next process.

An operator's ``OperandFit`` and the held-out ``FoldModel``s its explanations use depend
on the science config and the operand grid alone, never on the weights: every process that
catalogs a checkpoint of a config builds the same ones again (about 20 s of one core for
the demo's four operators on [0, 100), a third of a steady-state checkpoint). They are
kept under ``NCAT_HOME/fits``, one file per object, named by what it is built from and by
a digest of the code that builds it (the labels package and those it may import, numpy's
and torch's versions): a changed rule is a new name, never an old fit read as new. Files are
written whole (a temporary file renamed into place), read back on the device they were
built for, and the least recently used are removed past ``NCAT_FIT_CACHE_BYTES``
(``0``: nothing is kept; an object larger than the bound is not written). A file that
cannot be read is removed and the object built again; a cache that cannot be written is
skipped. They are pickles, as the built-in checkpoints in the same home are: trusted as
the home is.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from catalog.config.settings import get_settings

T = TypeVar("T")

# a file still being written after this long was left by a process that was killed
STALE_WRITE_SECONDS = 3600


@functools.cache
def code_version() -> str:
    """A digest of the sources the fits are built by (catalog's labels package and every
    package it may import) and of numpy's and torch's versions."""
    from catalog.labels import MAY_IMPORT

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.blake2b(digest_size=16)
    for sub in ("labels", *MAY_IMPORT):
        for path in sorted((root / sub).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    digest.update(f"numpy {np.__version__} torch {torch.__version__}".encode())
    return digest.hexdigest()


# the folder's stored bytes as this process last counted them (``trim``) plus what it
# wrote since: the folder is listed again only when that passes the bound (a process
# building the demo's fits writes over 300 files; listing the folder after each was
# quadratic). Other processes' writes are counted at the next listing, by whichever
# process lists first.
_COUNTED: dict[Path, int] = {}


@functools.cache
def where() -> tuple[Path, int] | None:
    """The store's folder and byte bound from this process's settings (read once: a
    fold model is looked up hundreds of times per fit); None when the bound is 0."""
    settings = get_settings()
    if settings.ncat_fit_cache_bytes <= 0:
        return None
    return settings.ncat_home / "fits", settings.ncat_fit_cache_bytes


def _path(folder: Path, kind: str, key: tuple) -> Path:
    name = hashlib.blake2b(repr((kind, key, code_version())).encode(), digest_size=16)
    return folder / f"{kind}-{name.hexdigest()}.pt"


def load(kind: str, key: tuple, cls: type[T], device) -> T | None:
    """The ``cls`` object stored under ``kind`` and ``key``, on ``device``; None where
    there is none or it cannot be read (then its file is removed)."""
    store = where()
    if store is None:
        return None
    path = _path(store[0], kind, key)
    if not path.is_file():
        return None
    try:
        obj = torch.load(path, map_location=torch.device(str(device or "cpu")),
                         weights_only=False)
        if not isinstance(obj, cls):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a {cls.__name__}")
        os.utime(path)  # used now: the last to be removed
        return obj
    except Exception:  # noqa: BLE001 - a torn, foreign or stale file is built again
        path.unlink(missing_ok=True)
        return None


def save(kind: str, key: tuple, obj: object, size: int) -> None:
    """Store ``obj`` (``size`` bytes held) under ``kind`` and ``key`` unless it is there
    or larger than the bound; then remove the least recently used files past the bound."""
    store = where()
    if store is None or size > store[1]:
        return
    folder, bound = store
    path = _path(folder, kind, key)
    if path.is_file():
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".writing-", suffix=".pt")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(obj, f)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        counted = _COUNTED.get(folder)
        written = path.stat().st_size
        _COUNTED[folder] = (trim(folder, bound) if counted is None or counted + written > bound
                            else counted + written)
    except OSError:
        pass  # a read-only or full home: built again next time


def trim(folder: Path, bound: int) -> int:
    """Remove the least recently used stored files until those left hold ``bound`` bytes
    at most, and any file a process began writing over ``STALE_WRITE_SECONDS`` ago (it
    was killed while writing); the stored bytes left."""
    files = []
    now = time.time()
    for path in folder.glob("*.pt"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # removed by another process meanwhile
        if path.name.startswith(".writing-"):
            if now - st.st_mtime > STALE_WRITE_SECONDS:
                path.unlink(missing_ok=True)
            continue
        files.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: (f[0], f[2].name)):
        if total <= bound:
            break
        path.unlink(missing_ok=True)
        total -= size
    return total
