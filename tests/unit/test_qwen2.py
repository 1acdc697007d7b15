"""The Qwen2 architecture (attention biases, grouped KV heads, tied or untied embeddings)
through TransformerLens with full weight processing equals transformers."""


import pytest
import torch

from catalog.sources import from_hf_model


@pytest.mark.parametrize("tied", [True, False])
def test_qwen2_logits_equal_transformers(tied):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=176,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=tied,
                      rms_norm_eps=1e-6, rope_theta=10000.0)
    hf = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # biases and norms away from their init, so they matter
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.5)
    assert hf.model.layers[0].self_attn.q_proj.bias is not None
    model = from_hf_model(hf, None, "random Qwen2", "cpu", torch.float32)
    assert model.cfg.n_key_value_heads == 2 and model.cfg.gated_mlp
    tokens = torch.randint(0, 300, (4, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(tokens).logits.log_softmax(-1)
        got = model(tokens).log_softmax(-1)  # center_unembed shifts logits, not probabilities
    assert (got - want).abs().max() < 1e-3, float((got - want).abs().max())
    # and the MLP neurons TransformerLens exposes are transformers' act(gate) * up
    cache = {}
    model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.hook_post",
                                             lambda a, hook: cache.update(tl=a))])
    grab = {}
    h = hf.model.layers[1].mlp.down_proj.register_forward_hook(
        lambda m, inp, out: grab.update(hf=inp[0]))
    with torch.no_grad():
        hf(tokens)
    h.remove()
    assert torch.allclose(cache["tl"], grab["hf"], atol=1e-4)
