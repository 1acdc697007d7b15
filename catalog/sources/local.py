"""A local Hugging Face model directory (a path holding ``config.json``): its safetensors
read one tensor at a time where their names are the model's (``streaming``), else loaded
whole by transformers in float32 and cast after."""

from __future__ import annotations

from pathlib import Path

import torch

from catalog.core.weights import weights_hash
from catalog.sources.base import LoadedModel, ModelShape, ModelSourceError, Source, model_info
from catalog.sources.hf import check_weight_files, from_hf_model, inspect_hf
from catalog.sources.streaming import load_streamed_or_none


def _is_local(name: str) -> bool:
    return (Path(name) / "config.json").is_file()


def _load_local(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
                **_) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if checkpoint is not None:
        raise ModelSourceError(
            f"local model directory {name!r} has no training checkpoints; got checkpoint "
            f"{checkpoint} (point at one directory per checkpoint instead)")
    try:
        tok = tokenizer or AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise ModelSourceError(f"local model directory {name!r} cannot be loaded: {exc}") from exc
    streamed = load_streamed_or_none(Path(name), None, tok, name, device, dtype)
    if streamed is not None:
        model, whash = streamed
        info = model_info(str(Path(name).resolve()), "local", None, None, whash, model, tok)
        return LoadedModel(model, tok, info)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    except Exception as exc:
        raise ModelSourceError(f"local model directory {name!r} cannot be loaded: {exc}") from exc
    whash = weights_hash(hf_model.state_dict())
    model = from_hf_model(hf_model, tok, name, device, torch.float32, release_source=True)
    info = model_info(str(Path(name).resolve()), "local", None, None, whash, model, tok)
    return LoadedModel(model, tok, info)


def _inspect_local(name, checkpoint, **_) -> ModelShape:
    if checkpoint is not None:
        raise ModelSourceError(f"local model directory {name!r} has no training checkpoints; "
                               f"got checkpoint {checkpoint}")
    check_weight_files(Path(name))
    return inspect_hf(name, None, source="local")


def _canonical_path(name, **_) -> str:
    return str(Path(name).resolve())


SOURCE = Source("local", _is_local, _load_local, lambda name, **_: None, _inspect_local,
                _canonical_path, loads_in_dtype=True)
