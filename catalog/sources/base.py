"""The model-source vocabulary: what a loaded model is (``LoadedModel``, ``ModelInfo``),
what validation learns without weights (``ModelShape``), one origin of models
(``Source``) and the registry of them, tried in order by ``catalog.sources.find_source``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from transformer_lens import HookedTransformer

from catalog.core.tokens import detect_number_tokens
from catalog.sources.names import ModelSourceError as ModelSourceError  # re-exported


@dataclass(frozen=True)
class ModelInfo:
    """What the catalog records about a loaded model checkpoint."""

    name: str
    source: str  # builtin | known | gguf | local | hub
    checkpoint: int | None  # training step, None for a model without checkpoints
    revision: str | None  # e.g. "step1000" for hub checkpoints
    weights_hash: str
    n_layers: int
    d_model: int
    d_mlp: int
    d_vocab: int
    act_fn: str
    gated_mlp: bool
    number_limit: int
    digit_level: bool
    # the largest difference of next-token log-probabilities from transformers on the load's
    # check (catalog.sources.hf.check_against_transformers); None where nothing is compared
    # (the built-in model has no transformers counterpart)
    transformers_nats: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def check(self) -> str:
        """The load's check against transformers, in words."""
        return transformers_check(self.transformers_nats)


def transformers_check(nats: float | None) -> str:
    """A load's difference from transformers as commands, reports and pages say it."""
    if nats is None:
        return "not compared with transformers (no counterpart there)"
    return (f"next-token log-probabilities within {nats:.2g} nats of transformers' (checked "
            "on every load; over 0.01 is refused)")


@dataclass
class LoadedModel:
    model: HookedTransformer
    tokenizer: object
    info: ModelInfo


@dataclass(frozen=True)
class ModelShape:
    """What validation needs to know about a model, without loading its weights."""

    n_layers: int
    numbers: object  # catalog.core.tokens.NumberTokens
    n_ctx: int | None = None  # positions the model reads (None: not known without weights)
    tokenizer: object = None  # for checking prompt lengths before anything is queued
    # catalog.measuring.memory.Footprint: parameters and widths, for memory
    footprint: object = None


@dataclass(frozen=True)
class Source:
    """One origin of models: which names it takes, how it loads, lists checkpoints,
    inspects a model without its weights (where it can), and names it in the catalog."""

    name: str
    accepts: Callable[[str], bool]
    load: Callable[..., LoadedModel]
    checkpoints: Callable[..., list[int] | None]
    inspect: Callable[..., ModelShape]
    canonical: Callable[..., str]
    # the loader takes the working dtype and hashes and processes in float32 itself
    # (GGUF: one tensor at a time); the others are given float32 and cast after
    loads_in_dtype: bool = False


SOURCES: dict[str, Source] = {}


def register_source(source: Source) -> Source:
    """Add a model source; a second source of the same name is refused."""
    if source.name in SOURCES:
        raise ValueError(f"model source {source.name!r} is already registered")
    SOURCES[source.name] = source
    return source


def model_info(name, source, checkpoint, revision, whash, model, tokenizer) -> ModelInfo:
    """The ModelInfo of a loaded model and tokenizer."""
    numbers = detect_number_tokens(tokenizer, prepend_bos=model.cfg.default_prepend_bos)
    return ModelInfo(
        name=name, source=source, checkpoint=checkpoint, revision=revision, weights_hash=whash,
        n_layers=model.cfg.n_layers, d_model=model.cfg.d_model, d_mlp=model.cfg.d_mlp,
        d_vocab=model.cfg.d_vocab, act_fn=str(model.cfg.act_fn),
        gated_mlp=bool(model.cfg.gated_mlp), number_limit=numbers.limit,
        digit_level=numbers.digit_level,
        transformers_nats=getattr(model, "transformers_nats", None),
    )
