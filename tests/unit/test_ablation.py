"""Ablated forward passes (catalog.measuring.ablation) equal plain forward passes with hooks
at every layer and position (tests/reference.py): per-position means, mean ablation of the prompt's
own positions or of every position (a cached few-shot prefix included), counterfactual
patching, and several circuits evaluated together from a shared early part."""

import numpy as np
import pytest
import torch

from catalog.config import ScienceConfig
from catalog.core.tokens import detect_number_tokens
from catalog.measuring import ablation
from catalog.measuring.ablation import Circuit
from catalog.measuring.grids import run_grid
from catalog.measuring.prompts import build_prompts
from catalog.sources import load_model

from reference import reference_ablated_logits, reference_activations, reference_means

SHOTS = ScienceConfig(operators=("+", "-"), operand_hi=12, few_shot="Solve. ", shots=3,
                      shot_separator="; ", pairs_per_op=30)


@pytest.fixture(scope="module")
def pythia(pythia_hub):
    lm = load_model(pythia_hub, checkpoint=1000)
    numbers = detect_number_tokens(lm.tokenizer, prepend_bos=False)
    table = build_prompts(lm.tokenizer, numbers, SHOTS)
    run_grid(lm.model, table, [], batch_size=64)
    return lm, table


@pytest.fixture(scope="module")
def tiny(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    config = ScienceConfig(operators=("+", "*"), operand_hi=10)
    numbers = detect_number_tokens(lm.tokenizer, prepend_bos=True)
    table = build_prompts(lm.tokenizer, numbers, config)
    run_grid(lm.model, table, [], batch_size=64)
    return lm, table, config


def _random_circuits(model, n: int, seed: int, same_below: int = 0) -> list[Circuit]:
    """``n`` random circuits that keep the same things below layer ``same_below``."""
    rng = np.random.default_rng(seed)
    n_layers, d_mlp, n_heads = model.cfg.n_layers, model.cfg.d_mlp, model.cfg.n_heads
    first = Circuit(rng.random((n_layers, d_mlp)) < 0.4, rng.random((n_layers, n_heads)) < 0.5)
    out = [first]
    for _ in range(n - 1):
        neurons, heads = first.neurons.copy(), first.heads.copy()
        neurons[same_below:] = rng.random((n_layers - same_below, d_mlp)) < 0.4
        heads[same_below:] = rng.random((n_layers - same_below, n_heads)) < 0.5
        out.append(Circuit(neurons, heads))
    return out


def _logits(lg, idx):
    return lg.double().cpu().numpy()


@pytest.mark.parametrize("context", ["prompt", "all"])
def test_position_means_equal_whole_prompts_averaged_one_by_one(pythia, context):
    lm, table = pythia
    pop = ablation.mean_population(lm.tokenizer, table, SHOTS, "grid", 120, seed=0)
    # the paper's population: all four operators, invalid cells included, each after the
    # prefix of its own operator (one built for * and /, which the run does not measure)
    assert {pop.operators[o] for o in np.unique(pop.op)} == {"+", "-", "*", "/"}
    assert len(pop) == 120 and (pop.b > pop.a).any()  # '-' with b > a: an invalid cell
    assert all(len(p) > 5 for p in pop.prefix_tokens)
    means = ablation.position_means(lm.model, pop, context, batch_size=16)
    post, z, count = reference_means(lm.model, pop, context)
    np.testing.assert_array_equal(means.count, count)
    reach = int((count > 0).sum())
    torch.testing.assert_close(means.post[:, :reach].double(), post[:, :reach],
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(means.z[:, :reach].double(), z[:, :reach], rtol=1e-4, atol=1e-5)
    if context == "prompt":  # the prefix is never averaged: only the prompt's own tokens
        assert reach == max(len(t) - len(pop.prefix_tokens[o])
                            for t, o in zip(pop.tokens, pop.op, strict=True))


def _check_mean_ablation(model, table, population, prompts, context, circuits):
    means = ablation.position_means(model, population, context, batch_size=16)
    fast = ablation.evaluate(model, table, prompts, circuits, ablation.mean_replacement(means),
                             context, _logits, batch_size=7)
    post_d, z_d, _ = reference_means(model, population, context)
    for c, circuit in enumerate(circuits):
        for row, p in enumerate(prompts):
            toks = table.tokens[p]
            T = len(toks)
            ablate_from = 0 if context == "all" else len(table.prefix_tokens[int(table.op[p])])
            # the mean at distance T - 1 - t from the end, for each absolute position t
            post = post_d[:, :T].flip(1)
            z = z_d[:, :T].flip(1)
            want = reference_ablated_logits(model, toks, circuit, post, z, ablate_from)
            np.testing.assert_allclose(fast[c][row], want.double().numpy(), rtol=1e-4,
                                       atol=2e-4, err_msg=f"circuit {c}, prompt {p}")


@pytest.mark.parametrize("context, same_below", [("prompt", 3), ("all", 3), ("all", 0)])
def test_mean_ablation_with_a_cached_prefix_equals_full_forwards(pythia, context, same_below):
    lm, table = pythia
    pop = ablation.mean_population(lm.tokenizer, table, SHOTS, "grid", 80, seed=1)
    prompts = np.concatenate([np.nonzero(table.op == o)[0][5:11] for o in range(2)])
    # three circuits that agree below layer 3 (the early part runs once for all three), or
    # that differ from layer 0 on (nothing is shared)
    circuits = _random_circuits(lm.model, 3, seed=2, same_below=same_below)
    _check_mean_ablation(lm.model, table, pop, prompts, context, circuits)


def test_mean_ablation_without_a_prefix_equals_full_forwards(tiny):
    lm, table, config = tiny
    pop = ablation.mean_population(lm.tokenizer, table, config, "valid", 0, seed=0)
    assert len(pop) == len(table)
    prompts = np.arange(0, len(table), 17)
    circuits = _random_circuits(lm.model, 3, seed=3) + [Circuit.nothing(lm.model)]
    _check_mean_ablation(lm.model, table, pop, prompts, "prompt", circuits)


def test_everything_kept_is_the_clean_model_and_nothing_kept_ignores_the_prompt(tiny):
    lm, table, config = tiny
    pop = ablation.mean_population(lm.tokenizer, table, config, "grid", 0, seed=0)
    means = ablation.position_means(lm.model, pop, "all")
    prompts = np.arange(0, len(table), 7)
    kept, empty = ablation.evaluate(lm.model, table, prompts,
                                    [Circuit.everything(lm.model), Circuit.nothing(lm.model)],
                                    ablation.mean_replacement(means), "all", _logits)
    with torch.no_grad():
        clean = lm.model(torch.from_numpy(table.token_matrix(prompts)))[:, -1].double().numpy()
    np.testing.assert_allclose(kept, clean, rtol=1e-5, atol=1e-5)
    # every activation replaced by its mean at every position: one answer for all prompts
    np.testing.assert_allclose(empty, np.broadcast_to(empty[0], empty.shape), atol=1e-4)
    assert np.abs(empty[0] - clean).max() > 0.1


def test_counterfactual_patching_equals_full_forwards(pythia):
    lm, table = pythia
    model = lm.model
    prompts = np.concatenate([np.nonzero(table.op == o)[0][20:25] for o in range(2)])
    rng = np.random.default_rng(4)
    same_op = {o: np.nonzero(table.op == o)[0] for o in range(2)}
    cf_of = {int(p): int(rng.choice(same_op[int(table.op[p])][30:60])) for p in prompts}
    circuits = _random_circuits(model, 2, seed=5, same_below=2)
    fast = ablation.evaluate(model, table, prompts, circuits,
                             ablation.counterfactual_replacement(model, table, cf_of),
                             "prompt", _logits)
    for c, circuit in enumerate(circuits):
        for row, p in enumerate(prompts):
            toks, cf_toks = table.tokens[p], table.tokens[cf_of[int(p)]]
            assert len(toks) == len(cf_toks)  # same operator: same prefix and length
            post, z = reference_activations(model, cf_toks)
            start = len(table.prefix_tokens[int(table.op[p])])
            want = reference_ablated_logits(model, toks, circuit, post, z, start)
            np.testing.assert_allclose(fast[c][row], want.double().numpy(), rtol=1e-4,
                                       atol=2e-4)


def test_a_counterfactual_cannot_ablate_a_shared_prefix(pythia):
    lm, table = pythia
    p = int(np.nonzero(table.op == 0)[0][20])
    with pytest.raises(ValueError, match="prefix"):
        ablation.evaluate(lm.model, table, np.array([p]), [Circuit.nothing(lm.model)],
                          ablation.counterfactual_replacement(lm.model, table, {p: p + 1}),
                          "all", _logits)


def test_means_that_do_not_reach_far_enough_are_an_error(pythia):
    lm, table = pythia
    pop = ablation.mean_population(lm.tokenizer, table, SHOTS, "grid", 40, seed=0)
    means = ablation.position_means(lm.model, pop, "prompt")  # the prompt's own tokens only
    with pytest.raises(ValueError, match="population"):
        means.window(len(table.tokens[0]), edit_from=0)
