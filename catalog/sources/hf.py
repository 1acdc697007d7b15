"""Hugging Face models in memory: their conversion into a weight-processed
``HookedTransformer``, their config and tokenizer read without weights, and a check that
a folder's safetensors files are whole. Every transformers-backed source uses these."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer
from transformer_lens import loading_from_pretrained as tl_loading
from transformer_lens.utilities.activation_functions import softcap_enabled
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from catalog.core.tokens import detect_number_tokens
from catalog.sources.architectures import config_dict, hooked_config
from catalog.sources.base import ModelShape, ModelSourceError

# Config attributes that TransformerLens 3.x reads under names recent transformers
# configs may lack, by architecture: the old name and how to find its value. A GPT-2
# config built in code and saved has n_positions only (the hub's gpt2 config.json has
# n_ctx too).
_TL_ALIASES: dict[str, dict[str, Callable[[Any], Any]]] = {
    "GPT2LMHeadModel": {"n_ctx": lambda c: getattr(c, "n_positions", None)},
}


def _tl_config(neutral: str, config, arch: str, device=None, dtype=torch.float32):
    """TransformerLens's config of a model whose config is saved in ``neutral``: from its
    own tables, or for the architectures it knows only by hub name, from the config's
    fields (``architectures``)."""
    own = config_dict(config, arch)
    if own is None:
        return tl_loading.get_pretrained_model_config(neutral, fold_ln=True, device=device,
                                                      dtype=dtype)
    return hooked_config(own, neutral, device, dtype)


def _cannot_convert(arch: str, shown: str, exc: Exception) -> ModelSourceError:
    from importlib.metadata import version

    return ModelSourceError(
        f"TransformerLens {version('transformer-lens')} cannot convert the {arch} "
        f"model {shown!r}: {exc} (it converts Llama, Mistral, Qwen2, GPT-2, "
        "GPT-NeoX/Pythia, GPT-J, GPT-Neo, OPT, Bloom and others; see its model table)")


def _architecture(config, model_class: str | None = None) -> str:
    """The config's causal-LM class name; GGUF configs do not record it, so it is the
    loaded model's class or the one transformers maps the config's model type to."""
    if not config.architectures:
        if model_class is None:
            from transformers.models.auto.modeling_auto import (
                MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            )

            model_class = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type,
                                                                config.model_type)
        config.architectures = [model_class]
    arch = config.architectures[0]
    for old, find in _TL_ALIASES.get(arch, {}).items():
        if not hasattr(config, old) and (value := find(config)) is not None:
            setattr(config, old, value)
    return arch


def check_convertible(config, shown: str) -> None:
    """Refuse, from the config alone, a model TransformerLens cannot convert: before its
    weights are read (a Gemma-3 GGUF was refused only after 86 s of dequantizing)."""
    arch = _architecture(config)
    with tempfile.TemporaryDirectory() as tmp:
        neutral = str(Path(tmp) / "model")
        config.save_pretrained(neutral)
        try:
            _tl_config(neutral, config, arch)
        except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
            raise _cannot_convert(arch, shown, exc) from exc


def from_hf_model(hf_model, tokenizer, shown: str, device, dtype,
                  release_source: bool = False) -> HookedTransformer:
    """Convert a loaded Hugging Face causal LM into a weight-processed HookedTransformer.

    TransformerLens derives its config from the model's config, saved into a folder of
    a neutral name: from a folder whose path holds "llama" or "gemma" it takes the
    architecture from the name and reads no config (a local ``~/models/Llama-3.2-1B``
    crashed). Names it reads that the config lacks are filled in (``_TL_ALIASES``). The
    weights come from ``hf_model``; nothing is downloaded. An architecture it cannot
    convert is a ModelSourceError naming it and the model (``shown``).

    With ``release_source`` the transformers model gives up its weights once the
    conversion holds them (the sources' loaders, which do not use it after): weight
    processing then frees each source tensor as it replaces it, instead of holding the
    transformers model, the state dict and the processed copies at once (Qwen2.5-Coder-0.5B:
    a peak of 9.6 GiB, 4.1x the float32 weights). The check against transformers runs on
    log-probabilities computed before.
    """
    config = hf_model.config
    arch = _architecture(config, type(hf_model).__name__)
    with tempfile.TemporaryDirectory() as tmp:
        neutral = str(Path(tmp) / "model")
        config.save_pretrained(neutral)
        try:
            cfg = _tl_config(neutral, config, arch, device, dtype)
            state_dict = tl_loading.get_pretrained_state_dict(neutral, cfg, hf_model,
                                                              dtype=dtype)
        except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
            raise _cannot_convert(arch, shown, exc) from exc
        reference = reference_logprobs(hf_model, cfg.d_vocab)
        if release_source:
            state_dict = {k: v.detach() for k, v in state_dict.items()}
            for param in hf_model.parameters():
                param.data = torch.empty(0, dtype=param.dtype, device=param.device)
        # built while the folder exists: without a tokenizer, TransformerLens looks there
        model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.cfg.model_name = shown
    # a norm after each sublayer's output (OLMo 2) cannot be folded into the next weights,
    # and a soft cap on the logits (Gemma 2) is not invariant to the constant that centring
    # the unembedding subtracts (TransformerLens's from_pretrained says both; its
    # load_and_process_state_dict does not)
    post_norm = arch in POST_NORM_ARCHITECTURES
    holder = [state_dict]
    del state_dict  # the holder's is the only reference: each processing step frees it
    load_processed(model, holder, fold_ln=not post_norm,
                   center_writing_weights=not post_norm,
                   center_unembed=not softcap_enabled(cfg.output_logits_soft_cap))
    model.to(device)
    model.eval()
    check_against_transformers(reference, model, shown)
    return model


_LN_KEYS = (".ln1.w", ".ln2.w", "ln_final.w")


class _Draining(dict):
    """A state dict that gives up each entry as it is read through ``items()``.

    TransformerLens's copying processing steps start with ``{k: v.clone() for k, v in
    state_dict.items()}``, then replace the copy's tensors one at a time. Read from this
    dict, each source tensor is freed as soon as its clone exists, so a step holds one set
    of weights and the tensors of the layer it is working on, not two full sets. A step
    that does not copy (``center_writing_weights``) changes this dict in place, which is
    as good. Only ``items()`` drains; membership, ``get`` and assignment are a dict's.
    """

    def items(self):
        for key in list(self.keys()):
            yield key, self.pop(key)


def process_weights(cfg, holder: list[dict], *, fold_ln: bool, center_writing_weights: bool,
                    center_unembed: bool) -> dict:
    """``ProcessWeights.process_weights``'s steps, in its order, on the state dict in
    ``holder`` (its only reference; the list is emptied), each step reading a draining
    copy of the last one's output; returns the processed state dict. Every step works
    key by key or layer by layer, so a state dict holding one layer's tensors (the others
    on the meta device) is processed as that layer of the whole would be
    (``streaming``)."""
    from transformer_lens.weight_processing import ProcessWeights as PW

    layer_norm = cfg.normalization_type in ("LN", "LNPre")
    steps = []
    if fold_ln:
        steps.append(lambda sd: PW.fold_layer_norm(sd, cfg, fold_biases=layer_norm,
                                                   center_weights=layer_norm))
    centre = center_writing_weights and layer_norm and not getattr(cfg, "final_rms", False)
    if centre:
        steps.append(lambda sd: PW.center_writing_weights(sd, cfg))
    if center_unembed:
        steps.append(lambda sd: PW.center_unembed(sd, cfg=cfg))
    steps.append(lambda sd: PW.fold_value_biases(sd, cfg))
    holder.append(_Draining(holder.pop()))
    for step in steps:
        holder.append(_Draining(step(holder.pop())))
    state_dict = dict(holder.pop())
    if center_writing_weights and layer_norm:
        for layer in range(cfg.n_layers):
            key = f"blocks.{layer}.attn.b_O"
            if key in state_dict:
                state_dict[key] = state_dict[key] - state_dict[key].mean()
    return state_dict


def load_processed(model: HookedTransformer, holder: list[dict], *, fold_ln: bool,
                   center_writing_weights: bool, center_unembed: bool) -> None:
    """TransformerLens's ``load_and_process_state_dict`` for the state dict in ``holder``
    (its only reference: the list is emptied), holding one copy of the weights and one
    layer's tensors besides.

    TransformerLens's processing steps each return a full copy of the state dict; called
    through ``process_weights`` the input stays alive through every step, and the model's
    own initial weights besides. Here each step reads its input from a ``_Draining`` dict
    (every source tensor freed once copied), the model's initial weights of the keys the
    state dict holds are given up first, and the processed weights are assigned to the
    model rather than copied into it. The steps and
    their order are ``ProcessWeights.process_weights``'s; a model whose norms are still
    to be swapped for folding, or weights not in float32, take TransformerLens's own path.
    """
    cfg = model.cfg
    state_dict = model.fill_missing_keys(holder.pop())
    norm = cfg.normalization_type
    fold_ln = (fold_ln and norm in ("LN", "LNPre", "RMS", "RMSPre")
               and any(k.endswith(_LN_KEYS) for k in state_dict))
    if (fold_ln and norm in ("LN", "RMS")) or any(
            v.is_floating_point() and v.dtype != torch.float32 for v in state_dict.values()):
        model.load_and_process_state_dict(state_dict, fold_ln=fold_ln,
                                          center_writing_weights=center_writing_weights,
                                          center_unembed=center_unembed)
        return
    sources = {t.untyped_storage().data_ptr() for t in state_dict.values()}
    for name, param in model.named_parameters():
        if name in state_dict:  # one element seen at the parameter's shape
            param.data = torch.zeros((), dtype=param.dtype,
                                     device=param.device).expand(param.shape)
    holder.append(state_dict)
    del state_dict
    state_dict = process_weights(cfg, holder, fold_ln=fold_ln,
                                 center_writing_weights=center_writing_weights,
                                 center_unembed=center_unembed)
    for key in list(state_dict):
        model.load_state_dict({key: state_dict.pop(key)}, strict=False, assign=True)
    for param in model.parameters():
        # the layout a copy into the model gave (elementwise results keep a transposed
        # source's strides), and no storage shared with the caller's model
        if not param.data.is_contiguous() or param.untyped_storage().data_ptr() in sources:
            param.data = param.data.clone(memory_format=torch.contiguous_format)
    if fold_ln:
        model.setup()


# largest difference of log-probabilities (nats) between the converted model and
# transformers on the check's tokens: float32 conversions of the architectures tested
# here differ by under 1e-5 on tiny random models (tests/unit/test_architectures.py)
AGREEMENT_NATS = 1e-2
CHECK_TOKENS = 8


def reference_logprobs(hf_model, d_vocab: int,
                       device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next-token log-probabilities) of ``CHECK_TOKENS`` tokens spread over the
    vocabulary, from the transformers model: what ``check_against_transformers`` compares
    a conversion with."""
    vocab = min(int(d_vocab), int(hf_model.config.vocab_size))
    tokens = (torch.arange(1, CHECK_TOKENS + 1) * (vocab // (CHECK_TOKENS + 1)))[None]
    if device is None:
        device = next(hf_model.parameters()).device
    with torch.no_grad():
        logits = hf_model(tokens.to(device)).logits
    return tokens, logits[..., :vocab].float().log_softmax(-1).cpu()


def check_against_transformers(reference: tuple[torch.Tensor, torch.Tensor],
                               model: HookedTransformer, shown: str,
                               logits: torch.Tensor | None = None) -> float:
    """Refuse a conversion (ModelSourceError, with the difference) whose next-token
    log-probabilities differ from transformers' (``reference``: ``reference_logprobs`` of
    the transformers model) by more than ``AGREEMENT_NATS``: a converter that misses a
    detail of an architecture (a norm after a sublayer, a sliding window, a soft cap)
    would otherwise catalog a different model without a word. ``logits``: the model's
    logits of the reference's tokens where they were computed already (a streamed load
    computes them in float32 before casting). Returns the difference."""
    tokens, want = reference
    vocab = want.shape[-1]
    if logits is None:
        with torch.no_grad():
            logits = model(tokens.to(model.cfg.device))
    got = logits[..., :vocab].float().log_softmax(-1).cpu()
    diff = float((got - want).abs().max())
    if not diff <= AGREEMENT_NATS:
        raise ModelSourceError(
            f"the TransformerLens conversion of {shown!r} ({model.cfg.original_architecture}) "
            f"disagrees with transformers: next-token log-probabilities differ by up to "
            f"{diff:.3g} nats on {CHECK_TOKENS} test tokens (allowed {AGREEMENT_NATS}); "
            "its converter misses part of this architecture, so it is not cataloged")
    model.__dict__["transformers_nats"] = diff  # model_info reads it: the checkpoint row keeps it
    return diff


def hf_footprint(hf_cfg, source: str):
    """The memory footprint of a Hugging Face config: its parameters counted on the meta
    device (nothing allocated), a tied embedding counted twice (TransformerLens keeps a
    separate unembedding)."""
    from transformers import AutoModelForCausalLM

    from catalog.measuring.memory import Footprint

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_cfg)
    except Exception:  # noqa: BLE001  an architecture transformers cannot build: no estimate
        return None
    n = sum(p.numel() for p in model.parameters())  # a tied weight once
    d_model = int(getattr(hf_cfg, "hidden_size", 0) or getattr(hf_cfg, "n_embd", 0))
    vocab = int(getattr(hf_cfg, "vocab_size", 0))
    if getattr(hf_cfg, "tie_word_embeddings", False):
        n += vocab * d_model
    n_layers = getattr(hf_cfg, "num_hidden_layers", None) or hf_cfg.n_layer
    d_mlp = int(getattr(hf_cfg, "intermediate_size", 0) or getattr(hf_cfg, "n_inner", 0)
                or 4 * d_model)
    return Footprint(source, int(n), int(n_layers), d_model, d_mlp, vocab)


def inspect_hf(target: str, revision: str | None, source: str = "hub") -> ModelShape:
    """Layers and number tokens from a Hugging Face config and tokenizer (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        hf_cfg = AutoConfig.from_pretrained(target, revision=revision)
        tok = AutoTokenizer.from_pretrained(target, revision=revision)
    except Exception as exc:
        where = f" at revision {revision}" if revision else ""
        raise ModelSourceError(f"cannot read {target}{where}: {type(exc).__name__}: "
                               f"{exc}") from exc
    n_layers = getattr(hf_cfg, "num_hidden_layers", None) or hf_cfg.n_layer
    # TransformerLens prepends BOS for most architectures, not for GPT-NeoX (Pythia)
    prepend = hf_cfg.model_type != "gpt_neox"
    return ModelShape(int(n_layers), detect_number_tokens(tok, prepend_bos=prepend),
                      n_ctx=context_length(hf_cfg), tokenizer=tok,
                      footprint=hf_footprint(hf_cfg, source))


def context_length(hf_cfg) -> int | None:
    """The positions a Hugging Face config says its model reads (None if it does not say)."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(hf_cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_weight_files(folder: Path) -> None:
    """Raise ModelSourceError unless every safetensors file of ``folder`` (and every shard
    its index names) is whole: the header parses and the file is exactly as long as the
    header says. Reads headers only."""
    import json
    import struct

    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError) as exc:
            raise ModelSourceError(f"{index} is not a safetensors index: {exc}") from None
        missing = sorted(x for x in shards if not (folder / x).exists())
        if missing:
            raise ModelSourceError(f"{folder}: the index names weight files that are missing: "
                                   f"{', '.join(missing)}")
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > size - 8:
                    raise ValueError(f"a header of {n} bytes in a file of {size}")
                header = json.loads(f.read(n))
            end = max((int(t["data_offsets"][1]) for k, t in header.items()
                       if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise ModelSourceError(f"weight file {path} is not valid safetensors ({exc}); "
                                   "is it truncated?") from None
        if size != 8 + n + end:
            raise ModelSourceError(f"weight file {path} holds {size:,} bytes but its header "
                                   f"describes {8 + n + end:,}: it is truncated or damaged")
