"""The science of the arithmetic neuron catalog, usable from a notebook with no database.

    from catalog import load_model, measure, MeasureConfig
    lm = load_model("builtin")                       # or "EleutherAI/pythia-14m", checkpoint=1000
    result = measure(lm.model, lm.tokenizer, MeasureConfig(operand_hi=100))
"""

from catalog.config import MeasureConfig
from catalog.measure import CheckpointResult, LayerResult, measure
from catalog.sources import LoadedModel, ModelInfo, ModelSourceError, list_checkpoints, load_model

__all__ = [
    "CheckpointResult",
    "LayerResult",
    "LoadedModel",
    "MeasureConfig",
    "ModelInfo",
    "ModelSourceError",
    "list_checkpoints",
    "load_model",
    "measure",
]
