"""A GGUF file (a path ending in ``.gguf``), and the known models fetched with ``ncat fetch
NAME`` (``catalog.sources.registry``), which are GGUF files loaded by name.

Loaded one tensor at a time in the working dtype (``streaming``); a file that cannot be
(a tensor processor that splits or merges tensors) is loaded whole by transformers in
float32 and cast after."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from catalog.core.tokens import detect_number_tokens
from catalog.core.weights import weights_hash
from catalog.measuring.memory import trim
from catalog.sources.base import LoadedModel, ModelShape, ModelSourceError, Source, model_info
from catalog.sources.hf import check_convertible, context_length, from_hf_model, hf_footprint
from catalog.sources.streaming import load_streamed_or_none
from catalog.sources.tensor_files import streams


def _is_gguf(name: str) -> bool:
    return name.lower().endswith(".gguf")


def _gguf_path(name: str, checkpoint: int | None) -> Path:
    """The GGUF file ``name``; a missing file or a checkpoint is refused."""
    path = Path(name)
    if not path.is_file():
        raise ModelSourceError(f"GGUF file {name!r} does not exist")
    if checkpoint is not None:
        raise ModelSourceError(f"a GGUF file has no training checkpoints; got checkpoint "
                               f"{checkpoint} for {name!r}")
    return path


def _load_gguf(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
               **_) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = _gguf_path(name, checkpoint)
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {name!r} cannot be read: {exc}") from exc
    check_convertible(config, name)  # from the metadata, before any weight is dequantized
    try:
        tok = tokenizer or AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {name!r} cannot be loaded: {exc}") from exc
    trim()  # the metadata, parsed twice above into many small arrays
    streamed = load_streamed_or_none(path, config, tok, name, device, dtype)
    if streamed is not None:  # one tensor at a time, in the working dtype
        model, whash = streamed
        info = model_info(str(path.resolve()), "gguf", None, None, whash, model, tok)
        return LoadedModel(model, tok, info)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {name!r} cannot be loaded: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    model = from_hf_model(hf_model, tok, name, device, torch.float32, release_source=True)
    info = model_info(str(path.resolve()), "gguf", None, None, whash, model, tok)
    return LoadedModel(model, tok, info)


def _inspect_gguf_file(path: Path) -> ModelShape:
    """Layers and number tokens from a GGUF file's metadata and tokenizer (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        raise ModelSourceError(f"GGUF file {str(path)!r} cannot be read: {exc}") from exc
    # TransformerLens prepends BOS where the tokenizer has one (not for GPT-NeoX)
    prepend = cfg.model_type != "gpt_neox" and tok.bos_token_id is not None
    return ModelShape(int(cfg.num_hidden_layers), detect_number_tokens(tok, prepend_bos=prepend),
                      n_ctx=context_length(cfg), tokenizer=tok,
                      footprint=hf_footprint(cfg, "gguf-streamed" if streams(cfg.model_type)
                                             else "gguf"))


def _inspect_gguf(name, checkpoint, **_) -> ModelShape:
    path = _gguf_path(name, checkpoint)
    return _inspect_gguf_file(path)


def _canonical_path(name, **_) -> str:
    return str(Path(name).resolve())


def _is_known(name: str) -> bool:
    import catalog.sources.registry as registry

    return name in registry.KNOWN


def _known_path(name: str) -> Path:
    import catalog.sources.registry as registry
    from catalog.config.settings import get_settings

    path = registry.fetched_path(name, get_settings().ncat_home)
    if path is None:
        raise ModelSourceError(f"{name} is a known model that is not fetched yet; run "
                               f"`ncat fetch {name}` first ({registry.KNOWN[name].about})")
    return path


def _load_known(name, checkpoint, **kwargs) -> LoadedModel:
    if checkpoint is not None:
        raise ModelSourceError(f"{name} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    lm = _load_gguf(str(_known_path(name)), None, **kwargs)
    lm.info = replace(lm.info, name=name, source="known")
    return lm


def _inspect_known(name, checkpoint, **_) -> ModelShape:
    if checkpoint is not None:
        raise ModelSourceError(f"{name} has no training checkpoints; got checkpoint "
                               f"{checkpoint}")
    return _inspect_gguf_file(_known_path(name))


SOURCE = Source("gguf", _is_gguf, _load_gguf, lambda name, **_: None, _inspect_gguf,
                _canonical_path, loads_in_dtype=True)
KNOWN = Source("known", _is_known, _load_known, lambda name, **_: None, _inspect_known,
               lambda name, **_: name, loads_in_dtype=True)
