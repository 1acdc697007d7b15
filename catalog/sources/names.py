"""What can be said about a model name without importing torch: the error every source
raises, and the refusals that need no source (an empty name, a path that does not exist,
a directory that is no Hugging Face model). Commands call ``check_model_name`` before any
heavy import, so bad input is refused in well under a second (issue 79)."""

from __future__ import annotations

from pathlib import Path


class ModelSourceError(ValueError):
    """A model, path or checkpoint that cannot be loaded, with what exists instead."""


def check_model_name(name: str) -> None:
    """ModelSourceError where ``name`` cannot name any model, whatever the sources: empty,
    a path (starting with ``.``, ``/`` or ``~``, or ending in ``.gguf``) that does not
    exist, or a directory without ``config.json``."""
    if not name or not name.strip():
        raise ModelSourceError("model name is empty")
    p = Path(name)
    if (name.startswith((".", "/", "~")) or p.suffix == ".gguf") and not p.exists():
        raise ModelSourceError(f"path {name!r} does not exist")
    if p.is_dir() and not (p / "config.json").is_file():
        raise ModelSourceError(f"directory {name!r} is not a Hugging Face model (no config.json)")
