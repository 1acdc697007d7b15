"""TransformerLens configs read from a Hugging Face config, for the architectures whose
weights TransformerLens 3.9 converts but whose configs it knows only for named checkpoints.

TransformerLens 3.9 ships weight converters for Gemma 1-3 and OLMo 1-2, but builds their
configs from tables keyed by hub names (``google/gemma-2-2b``, ``allenai/OLMo-2-0425-1B``,
...): any other checkpoint of these architectures (a fine-tune, a local folder, a GGUF, a
new size) was refused. Here the same fields are read from the model's own config, so
every size loads; ``catalog.sources.hf`` then checks the converted model against
transformers' log-probabilities before it is used (``check_against_transformers``).
"""

from __future__ import annotations

import math
from typing import Any

from catalog.sources.base import ModelSourceError

# attention layers this long or longer: TransformerLens allocates an (n_ctx, n_ctx) mask per
# layer, 64 MiB at 8,192 positions; arithmetic prompts are far shorter (its own tables for
# Gemma 3 use the same cap)
MAX_CONTEXT = 8192

OWN_CONFIGS = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
               "OlmoForCausalLM", "Olmo2ForCausalLM")


def _rope(config, layer_type: str | None = None) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type] or {}
    elif "full_attention" in params:
        params = params["full_attention"] or {}
    if not params and getattr(config, "rope_theta", None) is not None:
        params = {"rope_theta": config.rope_theta, "rope_type": "default"}
    kind = params.get("rope_type", "default")
    if kind not in ("default", None):
        raise ModelSourceError(
            f"{config.model_type} with {kind!r} rotary scaling is not converted here "
            "(TransformerLens's configs for named checkpoints cover it; this path reads "
            "plain rotary embeddings only)")
    return params


def _attention(config, cfg: dict) -> None:
    """Sliding-window layers and soft caps, where the config has them."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        cfg["attn_types"] = ["local" if t == "sliding_attention" else "global"
                             for t in layer_types]
        if "sliding_attention" in layer_types and getattr(config, "sliding_window", None):
            cfg["use_local_attn"] = True
            cfg["window_size"] = int(config.sliding_window)
    if getattr(config, "attn_logit_softcapping", None) is not None:
        cfg["attn_scores_soft_cap"] = float(config.attn_logit_softcapping)
    if getattr(config, "final_logit_softcapping", None) is not None:
        cfg["output_logits_soft_cap"] = float(config.final_logit_softcapping)
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar is not None:
        cfg["attn_scale"] = math.sqrt(float(scalar))


def config_dict(config, arch: str) -> dict[str, Any] | None:
    """TransformerLens's config fields for ``arch`` read from ``config`` (a transformers
    config), or None where TransformerLens reads the config itself."""
    if arch not in OWN_CONFIGS:
        return None
    n_heads = config.num_attention_heads
    cfg: dict[str, Any] = {
        "d_model": config.hidden_size,
        "d_head": getattr(config, "head_dim", None) or config.hidden_size // n_heads,
        "n_heads": n_heads,
        "n_key_value_heads": getattr(config, "num_key_value_heads", None) or n_heads,
        "d_mlp": config.intermediate_size,
        "n_layers": config.num_hidden_layers,
        "n_ctx": min(int(config.max_position_embeddings), MAX_CONTEXT),
        "d_vocab": config.vocab_size,
        "act_fn": (getattr(config, "hidden_activation", None) or config.hidden_act),
        "initializer_range": config.initializer_range,
        "positional_embedding_type": "rotary",
        "rotary_base": _rope(config).get("rope_theta", 10000.0),
        "gated_mlp": True,
        "original_architecture": arch,
    }
    if cfg["n_key_value_heads"] == n_heads:
        del cfg["n_key_value_heads"]
    elif arch.startswith("Olmo"):
        # TransformerLens 3.9's OLMo converters write one key and value per head
        raise ModelSourceError(
            f"{arch} with grouped key/value heads ({cfg['n_key_value_heads']} for "
            f"{n_heads} query heads) is not converted: TransformerLens 3.9 converts OLMo "
            "with one key/value head per query head (OLMo 1, OLMo 2 1B-13B)")
    if arch.startswith("Gemma"):
        cfg.update(eps=config.rms_norm_eps, normalization_type="RMS", final_rms=True,
                   use_attn_scale=True)
        if arch != "GemmaForCausalLM":
            cfg["use_normalization_before_and_after"] = True
        if arch == "Gemma3ForCausalLM":
            cfg["use_qk_norm"] = True
            local = _rope(config, "sliding_attention").get("rope_theta")
            if local is None:
                local = getattr(config, "rope_local_base_freq", None)
            if local is not None and local != cfg["rotary_base"]:
                cfg["rotary_base_local"] = local
        _attention(config, cfg)
    elif arch == "OlmoForCausalLM":
        # OLMo 1's layer norms have no weights or biases: a plain LayerNorm
        cfg.update(eps=1e-5, normalization_type="LN",
                   clip_qkv=getattr(config, "clip_qkv", None))
    else:  # OLMo 2: norms after attention and MLP, query/key norms over all heads
        cfg.update(eps=config.rms_norm_eps, normalization_type="RMS")
    if getattr(config, "attention_bias", False):
        raise ModelSourceError(f"{arch} with attention biases is not converted here")
    return cfg


def hooked_config(cfg: dict[str, Any], folder: str, device, dtype, fold_ln: bool = True):
    """A HookedTransformerConfig from ``config_dict``'s fields, processed as TransformerLens
    processes the fields of its own tables (``get_pretrained_model_config``): weights
    loaded rather than initialised, layer norms folded where the architecture allows."""
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

    cfg = dict(cfg)
    if fold_ln and cfg["original_architecture"] not in POST_NORM_ARCHITECTURES:
        cfg["normalization_type"] = {"LN": "LNPre", "RMS": "RMSPre"}.get(
            cfg["normalization_type"], cfg["normalization_type"])
    cfg.update(model_name=folder.rstrip("/").split("/")[-1], init_weights=False,
               tokenizer_name=folder, quantization_method=None, device=device, dtype=dtype,
               from_checkpoint=False, n_devices=1, default_prepend_bos=True)
    return HookedTransformerConfig.from_dict(cfg)
