"""Patching: the effect metric on hand numbers; batched exact patching equals a naive loop."""

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer

from catalog.builtin import builtin_model_config, builtin_tokenizer
from catalog.config import ScienceConfig
from catalog.measuring.grids import post_hook_name
from catalog.measuring.patching import (
    attribution_patching,
    effect_from_logprobs,
    exact_patching,
    patching_effect,
)
from catalog.measuring.prompts import sample_pairs
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model

from reference import naive_patching


def test_effect_metric_on_hand_computed_numbers():
    # P(r)=0.5, P(r')=0.1 clean; patched P*(r)=0.25, P*(r')=0.2:
    # 1/2 * [(0.2 - 0.1) / 0.1 + (0.5 - 0.25) / 0.25] = 1/2 * (1 + 1) = 1
    assert patching_effect(0.5, 0.1, 0.25, 0.2) == pytest.approx(1.0)
    # the second term divides by the PATCHED probability: 1/2 * [0 + (0.4 - 0.8) / 0.8]
    assert patching_effect(0.4, 0.3, 0.8, 0.3) == pytest.approx(-0.25)
    lp = torch.log(torch.tensor([0.5, 0.1, 0.25, 0.2], dtype=torch.float64))
    assert float(effect_from_logprobs(*lp)) == pytest.approx(1.0, rel=1e-12)


def check_exact_equals_naive(model, tokenizer, layers, hi, grouped=True):
    model = model.to(torch.float64)
    config = ScienceConfig(operand_hi=hi, pairs_per_op=6)
    prep = CheckpointRun(model, tokenizer, config, layers=layers).prepare()
    prep.table.correct[:] = True  # random / tiny models answer little; any pairs will do
    for op in ("+", "/"):
        clean, cf = sample_pairs(prep.table, op, 6, seed=1)
        for layer in layers:
            fast = exact_patching(model, prep.table, layer, clean, cf,
                                  prep.activations(layer)[cf].astype(np.float64), chunk=24,
                                  grouped=grouped)
            slow = naive_patching(model, prep.table, layer, clean, cf)
            assert np.abs(slow).max() > 1e-3  # the check is not vacuous
            np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-7)


def test_exact_patching_equals_naive_loop_on_builtin(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root, dtype=torch.float64)
    check_exact_equals_naive(lm.model, lm.tokenizer, [0, 1], hi=20)


def test_exact_patching_through_transformer_lens_cached_forward_equals_naive_loop(
        tiny_builtin):
    """The path of models that catalog.measuring.single_position does not reproduce (ALiBi,
    attention sinks, ...): each row through TransformerLens's cached forward."""
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root, dtype=torch.float64)
    check_exact_equals_naive(lm.model, lm.tokenizer, [0, 1], hi=20, grouped=False)


def test_exact_patching_equals_naive_loop_on_builtin_default_shape():
    """The built-in model at its default size (2 x 512 neurons), weights as initialised."""
    model = HookedTransformer(builtin_model_config())
    model.eval()
    check_exact_equals_naive(model, builtin_tokenizer(), [0, 1], hi=15)


def test_exact_patching_equals_naive_loop_on_pythia_shape(pythia_hub):
    lm = load_model(pythia_hub, checkpoint=1000, dtype=torch.float64)
    assert lm.model.cfg.parallel_attn_mlp and lm.model.cfg.positional_embedding_type == "rotary"
    # With a parallel residual, layer 0's MLP at the last position sees only the "="
    # token, so its neurons cannot differ between prompts: layers 1, 3 and 5 are checked.
    check_exact_equals_naive(lm.model, lm.tokenizer, [1, 3, 5], hi=12)


def test_attribution_is_the_first_order_term_of_exact_patching(tiny_builtin):
    """Exact patching toward the counterfactual by a small step eps gives eps * attribution."""
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root, dtype=torch.float64)
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         ScienceConfig(operand_hi=20, pairs_per_op=20)).prepare()
    prep.table.correct[:] = True
    clean, cf = sample_pairs(prep.table, "+", 20, seed=0)
    eps = 1e-6
    toks = torch.from_numpy(prep.table.token_matrix(clean))
    for layer in (0, 1):
        cf_acts = prep.activations(layer)[cf].astype(np.float64)
        attr = attribution_patching(lm.model, prep.table, [layer], clean, {layer: cf_acts},
                                    cf)[layer]
        # clean activations from a float64 forward of exactly these prompts, so the tiny
        # step is not drowned by the float32 rounding of the stored grid
        with torch.no_grad():
            name = post_hook_name(layer)
            clean_acts = lm.model.run_with_cache(toks, names_filter=name)[1][name][:, -1].numpy()
        step = clean_acts + eps * (cf_acts - clean_acts)
        exact = exact_patching(lm.model, prep.table, layer, clean, cf, step) / eps
        assert np.abs(attr).max() > 1e-2
        np.testing.assert_allclose(exact, attr, rtol=1e-3, atol=1e-4 * np.abs(attr).max())


def test_tiered_patching_equals_exact_on_the_exact_set(tiny_builtin):
    """--exact top:N patches exactly the N neurons of largest |attribution| per layer and
    operator (by the ranking statistic, a 10%-trimmed mean over pairs), with the same
    numbers as patching every neuron; the others keep their attribution estimate."""
    import dataclasses

    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    full_cfg = ScienceConfig(operand_hi=20, pairs_per_op=16)
    tier_cfg = dataclasses.replace(full_cfg, exact="top:7")
    full = CheckpointRun(lm.model, lm.tokenizer, full_cfg, layers=[0, 1]).prepare()
    tier = CheckpointRun(lm.model, lm.tokenizer, tier_cfg, layers=[0, 1]).prepare()
    for layer in (0, 1):
        a, b = full.run_layer(layer), tier.run_layer(layer)
        for o, op in enumerate(full_cfg.operators):
            clean, cf = tier.pairs[op]
            per_pair = attribution_patching(lm.model, tier.table, [layer], clean,
                                            {layer: tier.activations(layer)[cf]}, cf)[layer]
            cut = int(0.1 * per_pair.shape[1])
            trimmed = np.sort(per_pair, axis=1)[:, cut:per_pair.shape[1] - cut].mean(1)
            want = set(np.argsort(-np.abs(trimmed), kind="stable")[:7].tolist())
            exact = np.nonzero(b.is_exact[:, o])[0]
            assert set(exact.tolist()) == want and a.is_exact[:, o].all()
            np.testing.assert_allclose(b.effect_exact[exact, o], a.effect_exact[exact, o],
                                       rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(b.effect_trimmed[exact, o], a.effect_trimmed[exact, o],
                                       rtol=1e-5, atol=1e-7)
            rest = ~b.is_exact[:, o]
            assert np.isnan(b.effect_exact[rest, o]).all()
            # float32 sums: their rounding is relative to the largest terms, not to each
            # mean (1.7e-8 off on a mean of 4.4e-4 among means up to 0.07, one CI run)
            np.testing.assert_allclose(b.effect_trimmed[rest, o], trimmed[rest], rtol=1e-5,
                                       atol=1e-5 * np.abs(trimmed).max())
            np.testing.assert_array_equal(b.effect_attr[:, o], a.effect_attr[:, o])
            facts = b.patching[op]
            assert facts["n_exact"] == 7 and -1 <= facts["spearman"] <= 1
            assert a.patching[op]["n_exact"] == full.d_mlp


def _bf16_builtin():
    torch.manual_seed(0)
    model = HookedTransformer(builtin_model_config())
    model.eval()
    model.to(torch.bfloat16)
    model.cfg.dtype = torch.bfloat16
    return model


def test_low_precision_models_unembed_in_float32():
    """A bfloat16 model's logits are the float32 final LayerNorm and unembedding of its
    residual stream, not bfloat16-rounded logits (steps of 0.06 near 10)."""
    from catalog.measuring.grids import final_logits

    model = _bf16_builtin()
    resid = (torch.randn(64, 1, model.cfg.d_model) * 3).to(torch.bfloat16)
    got = final_logits(model, resid)
    assert got.dtype == torch.float32
    x = resid.double()
    x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    want = x @ model.W_U.double() + model.b_U.double()
    assert (got.double() - want).abs().max() < 1e-4
    rounded = model.unembed(model.ln_final(resid)).double()  # what bfloat16 gives
    assert (rounded - want).abs().max() > 1e-3  # the check is not vacuous


def test_exact_effects_do_not_see_the_full_forwards_rounding(monkeypatch):
    """The clean baseline of exact patching runs the same single-position path as the
    patched rows, so whatever a full forward's kernels round differently (a GPU's bfloat16
    kernels for another batch shape) cannot become an effect: noise added to the full
    forward's logits changes no effect, and a patch with the clean activation is 0."""
    from catalog.measuring import grids

    model = _bf16_builtin()
    config = ScienceConfig(operand_hi=15, pairs_per_op=12, dtype="bfloat16")
    run = CheckpointRun(model, builtin_tokenizer(), config).prepare()
    run.table.correct[:] = True
    clean, cf = sample_pairs(run.table, "+", 12, seed=1)
    for layer in (0, 1):
        acts = run.activations(layer)
        base = exact_patching(model, run.table, layer, clean, cf, acts[cf], with_log=True)
        null = exact_patching(model, run.table, layer, clean, cf, acts[clean], with_log=True)
        assert np.abs(null[0]).max() == 0 and np.abs(null[1]).max() == 0
        assert np.abs(base[1]).max() > 1e-3
        original = grids.PrefixRunner.last_logits

        def noisy(self, *args, _orig=original, **kwargs):
            logits = _orig(self, *args, **kwargs)
            return logits + 0.05 * torch.randn_like(logits)

        with monkeypatch.context() as m:
            m.setattr(grids.PrefixRunner, "last_logits", noisy)
            again = exact_patching(model, run.table, layer, clean, cf, acts[cf], with_log=True)
        np.testing.assert_array_equal(again[0], base[0])
        np.testing.assert_array_equal(again[1], base[1])


def test_attribution_needs_no_gradient_on_the_weights(tiny_builtin):
    """Loaded models' weights require no grad (a gradient per weight doubled a run's
    memory): attribution patching of every layer at once, and of every head and MLP
    layer, equals what the same model gives with trainable weights, and leaves no
    gradient on any weight."""
    from catalog.measuring.components import component_effects

    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    assert not any(p.requires_grad for p in lm.model.parameters())
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         ScienceConfig(operand_hi=20, pairs_per_op=20)).prepare()
    prep.table.correct[:] = True
    clean, cf = sample_pairs(prep.table, "+", 20, seed=0)
    layers = list(range(lm.model.cfg.n_layers))

    def both():
        attr = attribution_patching(lm.model, prep.table, layers, clean, None, cf)
        comp = component_effects(lm.model, prep.table, clean, cf, (), "mean")
        return attr, comp

    frozen_attr, frozen_comp = both()
    assert all(p.grad is None for p in lm.model.parameters())
    lm.model.requires_grad_(True)
    attr, comp = both()
    for layer in layers:
        assert np.abs(attr[layer]).max() > 1e-3
        np.testing.assert_allclose(frozen_attr[layer], attr[layer], rtol=1e-5, atol=1e-7)
    assert np.nanmax(np.abs(comp.effect_log)) > 1e-3
    np.testing.assert_allclose(frozen_comp.effect_log, comp.effect_log, rtol=1e-5, atol=1e-7)
