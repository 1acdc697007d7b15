"""The built-in arithmetic model (``builtin``), at any cached checkpoint step."""

from __future__ import annotations

import torch

from catalog import builtin
from catalog.builtin.model import N_CTX
from catalog.core.tokens import detect_number_tokens
from catalog.sources.base import LoadedModel, ModelShape, ModelSourceError, Source, model_info


def _is_builtin(name: str) -> bool:
    return name.partition("@")[0] in (builtin.BUILTIN_NAME, "builtin")


def _builtin_config(name: str, builtin_config, cache_root) -> builtin.TrainConfig:
    if builtin_config is not None:
        return builtin_config
    try:
        return builtin.config_from_name(name, cache_root)
    except FileNotFoundError as exc:
        raise ModelSourceError(str(exc)) from exc


def _load_builtin(name, checkpoint, *, tokenizer=None, device="cpu", dtype=torch.float32,
                  builtin_config=None, cache_root=None) -> LoadedModel:
    cfg = _builtin_config(name, builtin_config, cache_root)
    steps = builtin.available_steps(cfg, cache_root)
    if checkpoint is None:
        if not steps:
            raise ModelSourceError(
                "the built-in model has no checkpoints yet; train it first "
                "(ncat train-builtin, or catalog.builtin.train())")
        checkpoint = steps[-1]
    try:
        model, meta = builtin.load_checkpoint(cfg, checkpoint, cache_root, device=device)
    except FileNotFoundError as exc:
        raise ModelSourceError(str(exc)) from exc
    except ValueError as exc:
        raise ModelSourceError(str(exc)) from exc
    model.to(dtype)
    tok = tokenizer or builtin.builtin_tokenizer()
    info = model_info(builtin.model_name(cfg), "builtin", checkpoint, f"step{checkpoint}",
                 meta["weights_hash"], model, tok)
    return LoadedModel(model, tok, info)


def _builtin_checkpoints(name: str, builtin_config=None, cache_root=None) -> list[int]:
    return builtin.available_steps(_builtin_config(name, builtin_config, cache_root), cache_root)


def _inspect_builtin(name, checkpoint, builtin_config=None, cache_root=None, **_) -> ModelShape:
    cfg = _builtin_config(name, builtin_config, cache_root)
    steps = builtin.available_steps(cfg, cache_root)
    if not steps:
        raise ModelSourceError(f"{name!r} has no checkpoints yet; train it first "
                               "(ncat train-builtin)")
    if checkpoint is not None and checkpoint not in steps:
        raise ModelSourceError(f"built-in checkpoint step {checkpoint} not found; "
                               f"available steps: {steps}")
    tok = builtin.builtin_tokenizer()
    return ModelShape(cfg.n_layers, detect_number_tokens(tok), n_ctx=N_CTX, tokenizer=tok,
                      footprint=_footprint(cfg))


def _footprint(cfg: builtin.TrainConfig):
    """The built-in model's parameters, counted on the meta device."""
    from transformer_lens import HookedTransformer

    from catalog.measuring.memory import Footprint

    tl = builtin.builtin_model_config(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_mlp)
    with torch.device("meta"):
        n = sum(p.numel() for p in HookedTransformer(tl, move_to_device=False).parameters())
    return Footprint("builtin", int(n), tl.n_layers, tl.d_model, int(tl.d_mlp or 0), tl.d_vocab)


def _canonical_builtin(name, builtin_config=None, cache_root=None, **_) -> str:
    return builtin.model_name(_builtin_config(name, builtin_config, cache_root))


SOURCE = Source("builtin", _is_builtin, _load_builtin, _builtin_checkpoints, _inspect_builtin,
                _canonical_builtin)
