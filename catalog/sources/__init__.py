"""Model sources: one way to ask for a model, whatever its origin (``catalog.sources.loading``
says which and how). Importing this package is cheap: ``check_model_name`` and
``ModelSourceError`` (``names``) need no torch, so commands refuse a path that does not
exist before any heavy import; every other name loads ``loading`` (torch,
transformer_lens, the registered sources) the first time it is asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from catalog.sources.names import ModelSourceError, check_model_name

if TYPE_CHECKING:
    from catalog.sources.loading import (
        SOURCES,
        LoadedModel,
        ModelInfo,
        ModelShape,
        Source,
        cached_revisions,
        canonical_name,
        check_weight_files,
        find_source,
        from_hf_model,
        inspect_model,
        list_checkpoints,
        load_model,
        register_source,
        transposed_layout,
    )

__all__ = ["SOURCES", "LoadedModel", "ModelInfo", "ModelShape", "ModelSourceError", "Source",
           "cached_revisions", "canonical_name", "check_model_name",
           "check_weight_files", "find_source", "from_hf_model", "inspect_model",
           "list_checkpoints", "load_model", "register_source", "transposed_layout"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from catalog.sources import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'catalog.sources' has no attribute {name!r}")

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config", "measuring", "builtin")
