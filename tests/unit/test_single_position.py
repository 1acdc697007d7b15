"""catalog.measuring.single_position: one position through the later blocks with the keys shared by
each pair's rows equals TransformerLens's own cached forward (keys copied per row) in
float32, the dtype runs use; models with features it does not reproduce are sent to
TransformerLens's path. Exact patching through it equals the naive loop on every
architecture of the README's table (test_architectures, test_patching)."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.utilities import get_act_name

from catalog.measuring import single_position
from catalog.measuring.grids import cache_keys, final_logits
from catalog.measuring.patching import _last_position_forward
from catalog.sources import load_model


def _rows_through_both(model, first_block, pairs=5, chunk=7, n_pos=9):
    """The logits of ``pairs * chunk`` rows (chunk rows a pair, pair-major) at position
    ``n_pos``, by both paths: the later blocks from ``first_block``, then the unembedding."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.d_vocab, (pairs, n_pos + 1), generator=gen)
    names = [get_act_name(x, lay) for lay in range(first_block, model.cfg.n_layers)
             for x in ("k", "v")]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    past = [cache_keys(model, lay, cache[get_act_name("k", lay)][:, :-1],
                       cache[get_act_name("v", lay)][:, :-1])
            for lay in range(first_block, model.cfg.n_layers)]
    # the same rows for every pair: rows of two pairs differ only by the keys they read
    x = torch.randn(chunk, model.cfg.d_model, generator=gen).repeat(pairs, 1)
    with torch.no_grad():
        laid_out = single_position.prepare(model, first_block, past)
        ours = final_logits(model, single_position.forward(model, x, first_block, laid_out))
        theirs = _last_position_forward(model, x, first_block, past, repeat=chunk)
    return ours[:, 0], theirs


def test_rows_equal_transformer_lens_cached_forward_in_float32(pythia_hub):
    """Pythia's shape: rotary on a quarter of each head (folded into the projections), a
    parallel residual; every later block from layer 1."""
    model = load_model(pythia_hub, checkpoint=1000).model
    assert single_position.supports(model)
    ours, theirs = _rows_through_both(model, 1)
    # the pairs' keys differ and matter: a row read with another pair's keys differs
    assert (theirs[:7] - theirs[7:14]).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)


def test_local_windows_and_grouped_heads_equal_transformer_lens():
    """A model of sliding windows shorter than the keys (every other layer), grouped
    key/value heads and a soft cap on the scores, standard positions."""
    cfg = HookedTransformerConfig(
        n_layers=3, d_model=32, d_head=8, n_heads=4, n_key_value_heads=2, d_mlp=48,
        d_vocab=50, n_ctx=32, act_fn="gelu", normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=8, attn_types=["local", "global",
                                                                      "local"],
        use_local_attn=True, window_size=4, attn_scores_soft_cap=5.0, seed=0)
    model = HookedTransformer(cfg).eval()
    assert [b.attn.attn_type for b in model.blocks] == ["local", "global", "local"]
    assert single_position.supports(model)
    ours, theirs = _rows_through_both(model, 0)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("field", [{"positional_embedding_type": "alibi"},
                                   {"use_attn_result": True}, {"use_split_qkv_input": True}])
def test_features_it_does_not_reproduce_take_transformer_lens_path(field):
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, d_head=4, n_heads=4, d_mlp=16,
                                  d_vocab=20, n_ctx=16, act_fn="gelu", **field)
    assert not single_position.supports(HookedTransformer(cfg))


def test_rotation_is_folded_into_the_projections_in_float32_only(pythia_hub):
    """Rotated weights rounded to bfloat16 would round the model a second time: there the
    rows are rotated after their product, as TransformerLens does."""
    model = load_model(pythia_hub, checkpoint=1000).model
    k = torch.zeros(2, 3, model.cfg.n_heads, model.cfg.d_head)
    assert all(p.rotated for p in single_position.prepare(model, 4, [(k, k), (k, k)]))
    model = model.to(torch.bfloat16)
    kb = k.to(torch.bfloat16)
    assert not any(p.rotated for p in single_position.prepare(model, 4, [(kb, kb), (kb, kb)]))
