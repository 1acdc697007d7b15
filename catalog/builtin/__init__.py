"""The built-in arithmetic model: the catalog's offline stand-in for Pythia checkpoints.

Real language models cannot be downloaded on every machine, yet every part of the
catalog (measurements, storage, training dynamics) needs a model with checkpoints
that really learned arithmetic. This module defines a small transformer with one
token per integer 0..999, the four operator tokens, ``=`` and a BOS token, and a
seeded, deterministic trainer on ``a op b =`` prompts. Checkpoints are saved at
log-spaced steps (0, 1, 2, 4, ..., like Pythia's early schedule) plus the final
step, cached on disk, and reused by every later call with the same settings.

The model is a plain TransformerLens ``HookedTransformer``, so every measurement
runs on it exactly as on a hub model.

The package is split by concept: ``vocab`` (tokens and tokenizer), ``model`` (the
architecture, the training configuration and its checkpoint cache) and ``training``
(data, evaluation and the reproducible trainer).
"""

from catalog.builtin.model import (
    BUILTIN_NAME,
    TRAINER_VERSION,
    TrainConfig,
    available_steps,
    builtin_model_config,
    checkpoint_dir,
    checkpoint_path,
    config_from_name,
    default_cache_root,
    load_checkpoint,
    model_name,
)
from catalog.builtin.training import ArithmeticData, adopt, build_data, evaluate, train
from catalog.builtin.vocab import MAX_NUMBER, builtin_tokenizer, builtin_vocab

__all__ = [
    "BUILTIN_NAME", "MAX_NUMBER", "TRAINER_VERSION", "ArithmeticData", "TrainConfig",
    "adopt", "available_steps", "build_data", "builtin_model_config", "builtin_tokenizer",
    "builtin_vocab", "checkpoint_dir", "checkpoint_path", "config_from_name",
    "default_cache_root", "evaluate", "load_checkpoint", "model_name", "train",
]

# the catalog's packages this one may import; tests/unit/test_layers.py fails on any
# import of another
MAY_IMPORT: tuple[str, ...] = ("core", "config", "measuring")
