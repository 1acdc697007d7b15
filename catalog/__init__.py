"""The science of the arithmetic neuron catalog, usable from a notebook with no database.

    from catalog import load_model, measure, ScienceConfig
    lm = load_model("builtin")                       # or "EleutherAI/pythia-14m", checkpoint=1000
    result = measure(lm.model, lm.tokenizer, ScienceConfig(operand_hi=100))

``measure`` drives a ``CheckpointRun`` (catalog.run.checkpoint), the one object that runs a
checkpoint for every caller; docs/method.md defines what it measures.

Names are imported on first use, so ``catalog.config`` or ``catalog.core.arith`` can be used
without importing torch (the job system's parent process relies on that).
"""

import importlib

_EXPORTS = {
    "ScienceConfig": "catalog.config",
    "ExecutionConfig": "catalog.config",
    "Settings": "catalog.config.settings",
    "CheckpointRun": "catalog.run.checkpoint",
    "CheckpointResult": "catalog.run.checkpoint",
    "LayerResult": "catalog.run.checkpoint",
    "Summary": "catalog.run.checkpoint",
    "Matches": "catalog.labels.matching",
    "measure": "catalog.run.measurement",
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
