"""The science of the arithmetic neuron catalog, usable from a notebook with no database.

    from catalog import load_model, measure, MeasureConfig
    lm = load_model("builtin")                       # or "EleutherAI/pythia-14m", checkpoint=1000
    result = measure(lm.model, lm.tokenizer, MeasureConfig(operand_hi=100))

Names are imported on first use, so ``catalog.config`` or ``catalog.arith`` can be used
without importing torch (the job system's parent process relies on that).
"""

import importlib

_EXPORTS = {
    "MeasureConfig": "catalog.config",
    "CheckpointResult": "catalog.measurement",
    "LayerResult": "catalog.measurement",
    "measure": "catalog.measurement",
    "LoadedModel": "catalog.sources",
    "ModelInfo": "catalog.sources",
    "ModelSourceError": "catalog.sources",
    "list_checkpoints": "catalog.sources",
    "load_model": "catalog.sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'catalog' has no attribute {name!r}")
