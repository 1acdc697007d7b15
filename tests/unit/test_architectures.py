"""Every decoder-only architecture the README's table lists loads through
``from_hf_model`` from a tiny random transformers model: its next-token log-probabilities
equal transformers', its MLP neurons are transformers' (the input of the MLP's output
projection), and batched exact patching equals the naive loop on it. A converter that
gets an architecture wrong is refused at load (``check_against_transformers``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import transformers as T
from test_patching import check_exact_equals_naive
from transformer_lens import HookedTransformer
from transformer_lens import loading_from_pretrained as tl_loading
from transformer_lens.utilities.activation_functions import softcap_enabled
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from catalog.sources import from_hf_model
from catalog.sources.base import ModelSourceError
from catalog.sources.hf import AGREEMENT_NATS, check_against_transformers, reference_logprobs

SIZE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256,
            initializer_range=0.2)  # larger than the default 0.02: neurons that matter
# sliding windows shorter than the prompts (so that local attention matters), a global
# layer among them, and the soft caps of Gemma 2
LOCAL = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention",
                                            "sliding_attention"])

# (name, config class, model class, fields beyond SIZE, the module whose input is the
# neurons: an attribute path from a decoder layer)
ARCHITECTURES = [
    ("Llama 3", T.LlamaConfig, T.LlamaForCausalLM, {}, "mlp.down_proj"),
    ("Mistral", T.MistralConfig, T.MistralForCausalLM, {}, "mlp.down_proj"),
    ("Qwen 2.5", T.Qwen2Config, T.Qwen2ForCausalLM, {}, "mlp.down_proj"),
    ("Qwen 3", T.Qwen3Config, T.Qwen3ForCausalLM, {"head_dim": 16}, "mlp.down_proj"),
    ("Gemma", T.GemmaConfig, T.GemmaForCausalLM, {"head_dim": 16}, "mlp.down_proj"),
    ("Gemma 2", T.Gemma2Config, T.Gemma2ForCausalLM,
     {"head_dim": 16, "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0,
      "query_pre_attn_scalar": 24, **LOCAL}, "mlp.down_proj"),
    ("Gemma 3", T.Gemma3TextConfig, T.Gemma3ForCausalLM,
     {"head_dim": 16, "query_pre_attn_scalar": 24,
      "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 1e4}},
      **LOCAL}, "mlp.down_proj"),
    ("Phi-3", T.Phi3Config, T.Phi3ForCausalLM, {"pad_token_id": 0}, "mlp.down_proj"),
    ("OLMo", T.OlmoConfig, T.OlmoForCausalLM, {"num_key_value_heads": 4}, "mlp.down_proj"),
    ("OLMo 2", T.Olmo2Config, T.Olmo2ForCausalLM, {"num_key_value_heads": 4},
     "mlp.down_proj"),
    ("GPT-NeoX (Pythia)", T.GPTNeoXConfig, T.GPTNeoXForCausalLM,
     {"num_key_value_heads": None, "use_parallel_residual": True}, "mlp.dense_4h_to_h"),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The built-in model's digit tokenizer, saved and read back as transformers reads a
    model's tokenizer (TransformerLens asks it for its name)."""
    from catalog.builtin import builtin_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    builtin_tokenizer().save_pretrained(folder)
    return T.AutoTokenizer.from_pretrained(folder)


def random_model(config_cls, model_cls, extra, vocab):
    fields = {**SIZE, **extra, "vocab_size": vocab}
    fields = {k: v for k, v in fields.items() if v is not None}
    torch.manual_seed(0)
    hf = model_cls(config_cls(**fields)).eval()
    with torch.no_grad():  # biases and norm weights away from their init, so they matter
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return hf


def _module(layer, path: str):
    for part in path.split("."):
        layer = getattr(layer, part)
    return layer


@pytest.mark.parametrize("name,config_cls,model_cls,extra,out_proj", ARCHITECTURES,
                         ids=[a[0] for a in ARCHITECTURES])
def test_each_architecture_loads_equal_to_transformers_and_patches_equal_to_naive(
        tokenizer, name, config_cls, model_cls, extra, out_proj):
    hf = random_model(config_cls, model_cls, extra, len(tokenizer))
    model = from_hf_model(hf, tokenizer, f"random {name}", "cpu", torch.float32)
    tokens = torch.randint(0, len(tokenizer), (3, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(tokens).logits.log_softmax(-1)
        got = model(tokens).log_softmax(-1)  # center_unembed shifts logits, not probabilities
    assert (got - want).abs().max() < 1e-4, float((got - want).abs().max())
    # the model is not one that any conversion would match: its layers matter
    assert (want[:, -1] - hf(tokens[:, -1:]).logits.log_softmax(-1)[:, -1]).abs().max() > 1e-2
    # the neurons TransformerLens exposes are the input of transformers' output projection
    grab: dict = {}
    handle = _module(hf.model.layers[1] if hasattr(hf, "model") else hf.gpt_neox.layers[1],
                     out_proj).register_forward_hook(lambda m, inp, out: grab.update(hf=inp[0]))
    with torch.no_grad():
        hf(tokens)
    handle.remove()
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.mlp.hook_post")
    torch.testing.assert_close(cache["blocks.1.mlp.hook_post"], grab["hf"], atol=1e-4, rtol=1e-4)
    # the catalog's batched exact patching (prefix cache, single-position forwards) equals
    # one full forward per neuron, on every layer (with a parallel residual, layer 0's MLP
    # at the last position sees only the "=" token: no effect to compare)
    layers = [1, 2] if model.cfg.parallel_attn_mlp else [0, 1, 2]
    check_exact_equals_naive(model, tokenizer, layers, hi=12)


def test_a_conversion_that_disagrees_with_transformers_is_refused(tokenizer):
    hf = random_model(T.LlamaConfig, T.LlamaForCausalLM, {}, len(tokenizer))
    model = from_hf_model(hf, tokenizer, "random Llama", "cpu", torch.float32)
    reference = reference_logprobs(hf, model.cfg.d_vocab)
    assert check_against_transformers(reference, model, "random Llama") < AGREEMENT_NATS
    with torch.no_grad():  # a converter that lost a detail: one layer's output scaled
        model.blocks[2].mlp.W_out.mul_(1.5)
    with pytest.raises(ModelSourceError, match="disagrees with transformers"):
        check_against_transformers(reference, model, "random Llama")


def test_grouped_key_values_of_olmo_are_refused_with_the_reason(tokenizer):
    hf = random_model(T.Olmo2Config, T.Olmo2ForCausalLM, {}, len(tokenizer))  # 2 of 4 heads
    with pytest.raises(ModelSourceError, match="grouped key/value heads"):
        from_hf_model(hf, tokenizer, "random OLMo 2 (GQA)", "cpu", torch.float32)


@pytest.mark.parametrize("name,config_cls,model_cls,extra,out_proj",
                         [a for a in ARCHITECTURES if a[0] in ("Qwen 2.5", "GPT-NeoX (Pythia)",
                                                               "Gemma 2", "OLMo 2")],
                         ids=["Qwen 2.5", "Gemma 2", "OLMo 2", "GPT-NeoX (Pythia)"])
def test_the_loader_that_frees_its_source_gives_transformer_lens_own_weights(
        tokenizer, name, config_cls, model_cls, extra, out_proj):
    """``from_hf_model(release_source=True)`` processes the weights one step at a time and
    assigns them (one copy and a tensor alive); its weights equal TransformerLens's own
    ``load_and_process_state_dict`` to the bit, and the transformers model it was given
    has given up its weights."""
    hf = random_model(config_cls, model_cls, extra, len(tokenizer))
    plain = from_hf_model(hf, tokenizer, name, "cpu", torch.float32)  # keeps hf usable
    reference = HookedTransformer(plain.cfg, tokenizer, move_to_device=False)
    with tempfile.TemporaryDirectory() as tmp:
        hf.config.save_pretrained(Path(tmp) / "m")
        state_dict = tl_loading.get_pretrained_state_dict(str(Path(tmp) / "m"), plain.cfg, hf)
    post = plain.cfg.original_architecture in POST_NORM_ARCHITECTURES
    reference.load_and_process_state_dict(
        state_dict, fold_ln=not post, center_writing_weights=not post,
        center_unembed=not softcap_enabled(plain.cfg.output_logits_soft_cap))
    freed = from_hf_model(hf, tokenizer, name, "cpu", torch.float32, release_source=True)
    want = dict(reference.named_parameters())
    for key, got in freed.named_parameters():
        assert got.is_contiguous(), key
        assert torch.equal(got, want[key]), key
    assert all(p.numel() == 0 for p in hf.parameters())



@pytest.mark.parametrize("draining", [True, False], ids=["draining", "plain dicts"])
def test_weight_processing_holds_one_copy_of_the_weights(tokenizer, monkeypatch, draining):
    """While TransformerLens's processing steps copy the state dict, the weights alive are
    one set plus the tensor being copied: each source is freed once its copy exists. The
    same count with plain dicts (TransformerLens's own way) reaches two sets, so the
    count can tell the difference. Counted at every copy over the tensors the processing
    was given, the tensors it copied and their copies (weak references: only those still
    alive count; a storage shared by two tensors counts once)."""
    import weakref

    import catalog.sources.hf as hf_mod

    hf = random_model(T.Qwen2Config, T.Qwen2ForCausalLM,
                      {"num_hidden_layers": 6, "intermediate_size": 256}, len(tokenizer))
    if not draining:
        monkeypatch.setattr(hf_mod, "_Draining", dict)
    seen: dict[str, int] = {"peak": 0}
    tracked: list = []
    real_load, real_clone = hf_mod.load_processed, torch.Tensor.clone

    def alive() -> int:
        storages = {}
        for ref in tracked:
            t = ref()
            if t is not None:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())

    def clone(t, *a, **k):
        out = real_clone(t, *a, **k)
        tracked.extend((weakref.ref(t), weakref.ref(out)))
        seen["peak"] = max(seen["peak"], alive())
        return out

    def load_processed(model, holder, **kw):
        tracked.extend(weakref.ref(v) for v in holder[0].values())
        seen["weights"], seen["largest"] = alive(), max(v.nbytes for v in holder[0].values())
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "clone", clone)
            return real_load(model, holder, **kw)

    monkeypatch.setattr(hf_mod, "load_processed", load_processed)
    from_hf_model(hf, tokenizer, "random Qwen 2.5", "cpu", torch.float32, release_source=True)
    w = seen["weights"]
    print(f"weights {w} B, largest tensor {seen['largest']} B, peak {seen['peak'] / w:.2f}x")
    if draining:
        assert seen["peak"] <= w + 2 * seen["largest"]
    else:
        assert seen["peak"] >= 1.9 * w
