"""Few-shot prompts: deterministic solved examples, left out of pairs, and a shared prefix
whose keys and values computed once give the same activations as the full forward."""

import numpy as np
import pytest

from catalog.config import ScienceConfig
from catalog.grids import run_grid
from catalog.prompts import build_prompts, sample_pairs
from catalog.sources import load_model
from catalog.tokens import detect_number_tokens

CONFIG = ScienceConfig(operators=("+", "-"), operand_hi=12, few_shot="Solve. ", shots=3,
                       shot_separator="; ", pairs_per_op=30)


@pytest.fixture(scope="module")
def pythia(pythia_hub):
    return load_model(pythia_hub, checkpoint=1000)


def test_shots_are_deterministic_solved_examples_of_the_same_operator(pythia):
    numbers = detect_number_tokens(pythia.tokenizer, prepend_bos=False)
    t1 = build_prompts(pythia.tokenizer, numbers, CONFIG)
    t2 = build_prompts(pythia.tokenizer, numbers, CONFIG)
    for o, op in enumerate(CONFIG.operators):
        np.testing.assert_array_equal(t1.prefix_tokens[o], t2.prefix_tokens[o])
        shots = np.nonzero(t1.is_shot & (t1.op == o))[0]
        assert len(shots) == 3
        text = pythia.tokenizer.decode(t1.prefix_tokens[o])
        assert text.startswith("Solve. ")
        for i in shots:  # each example is written out with its answer
            assert f"{t1.a[i]}{op}{t1.b[i]}={t1.result[i]}; " in text
        # every prompt of the operator starts with the same prefix
        for i in np.nonzero(t1.op == o)[0][:20]:
            np.testing.assert_array_equal(t1.tokens[i][:len(t1.prefix_tokens[o])],
                                          t1.prefix_tokens[o])
    other = build_prompts(pythia.tokenizer, numbers,
                          ScienceConfig(**{**CONFIG.as_dict(), "seed": 1}))
    assert not np.array_equal(other.is_shot, t1.is_shot)  # the seed picks the examples


def test_prefix_reuse_equals_the_full_forward_and_shots_are_not_pairs(pythia):
    numbers = detect_number_tokens(pythia.tokenizer, prepend_bos=False)
    table = build_prompts(pythia.tokenizer, numbers, CONFIG)
    layers = list(range(pythia.model.cfg.n_layers))
    reused = run_grid(pythia.model, table, layers, batch_size=64, reuse_prefix=True)
    correct_reused = table.correct.copy()
    full = run_grid(pythia.model, table, layers, batch_size=64, reuse_prefix=False)
    assert len(table.prefix_tokens[0]) > 5
    for layer in layers:
        assert np.abs(full[layer]).max() > 1e-2
        np.testing.assert_allclose(reused[layer], full[layer], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(correct_reused, table.correct)
    table.correct[:] = True  # a random model answers little; any pairs will do
    for op in CONFIG.operators:
        clean, cf = sample_pairs(table, op, 30, seed=0)
        assert len(clean) == 30
        assert not table.is_shot[clean].any() and not table.is_shot[cf].any()


def test_named_and_natural_language_templates():
    qa = ScienceConfig(template="qa")
    assert qa.template == "Q: How much is {a} {op_word} {b}? A:"
    assert qa.prompt_text(3, "*", 4) == "Q: How much is 3 times 4? A:"
    assert ScienceConfig(template="{a} {op_word} {b} =").prompt_text(8, "/", 2) == \
        "8 divided by 2 ="
    with pytest.raises(ValueError, match="lacks"):
        ScienceConfig(template="{a} and {b}")
    with pytest.raises(ValueError, match="placeholder"):
        ScienceConfig(template="{a}{op}{b}={c}")
    with pytest.raises(ValueError, match="shots"):
        ScienceConfig(shots=-1)
    assert ScienceConfig(shots=3).config_hash() != ScienceConfig().config_hash()


def test_knockouts_and_ablations_with_prefix_reuse_equal_full_forwards(pythia):
    """Zeroing neurons at the last position gives the same predictions with the cached
    prefix as with full forwards; mean-ablating with the cached prefix equals a full forward
    that ablates only the prompt's own positions (the documented meaning)."""
    import torch

    from catalog import circuits
    from catalog.grids import PrefixRunner, post_hook_name

    model, tok = pythia.model, pythia.tokenizer
    numbers = detect_number_tokens(tok, prepend_bos=False)
    table = build_prompts(tok, numbers, CONFIG)
    run_grid(model, table, [], batch_size=64)
    prompts = np.arange(0, len(table), 3)
    n_layers, d_mlp = model.cfg.n_layers, model.cfg.d_mlp
    zero = np.random.default_rng(0).random((len(prompts), n_layers, d_mlp)) < 0.3
    got = circuits.accuracy_with_zeroed(model, table, prompts, zero)
    # the reference: full forwards, one prompt at a time, zeroing at the last position
    want = []
    for j, p in enumerate(prompts):
        z = torch.as_tensor(zero[j])

        def edit(act, hook, _z=z):
            act = act.clone()
            act[:, -1] = act[:, -1].masked_fill(_z[hook.layer()], 0.0)
            return act
        logits = model.run_with_hooks(torch.from_numpy(table.tokens[p][None]), fwd_hooks=[
            (post_hook_name(layer), edit) for layer in range(n_layers)])
        want.append(int(logits[0, -1].argmax()) == table.answer[p])
    np.testing.assert_array_equal(got, np.array(want))

    runner = PrefixRunner(model, table)
    means = circuits.position_means(model, table, runner=runner)
    op, skip_p = 0, len(table.prefix_tokens[0])
    sel = np.nonzero(table.op == op)[0][:8]
    skip, = {runner.skip(op, len(table.tokens[i])) for i in sel}
    assert skip == skip_p
    keep = np.random.default_rng(1).random((n_layers, d_mlp)) < 0.5
    mean = means[len(table.tokens[sel[0]]) - skip]

    def ablate(layer, act):
        return torch.where(torch.as_tensor(keep[layer]), act, mean[layer])

    fast = circuits._run_with_neuron_edit(runner, sel, skip, ablate)

    def full_edit(act, hook):
        act = act.clone()
        act[:, skip:] = torch.where(torch.as_tensor(keep[hook.layer()]), act[:, skip:],
                                    mean[hook.layer()])
        return act

    slow = model.run_with_hooks(torch.from_numpy(table.token_matrix(sel)), fwd_hooks=[
        (post_hook_name(layer), full_edit) for layer in range(n_layers)])[:, -1]
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


def test_attribution_with_prefix_reuse_equals_full_forwards(pythia):
    from catalog.patching import attribution_patching

    model, tok = pythia.model, pythia.tokenizer
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=False), CONFIG)
    acts = run_grid(model, table, [2, 4], batch_size=64)
    table.correct[:] = True
    clean, cf = sample_pairs(table, "-", 12, seed=3)
    cf_acts = {layer: acts[layer][cf] for layer in (2, 4)}
    fast = attribution_patching(model, table, [2, 4], clean, cf_acts, cf)
    slow = attribution_patching(model, table, [2, 4], clean, cf_acts, cf, reuse_prefix=False)
    for layer in (2, 4):
        assert np.abs(slow[layer]).max() > 1e-4
        np.testing.assert_allclose(fast[layer], slow[layer], rtol=1e-3,
                                   atol=1e-4 * np.abs(slow[layer]).max())


def test_exact_patching_with_prefix_reuse_equals_full_forwards(pythia):
    from catalog.patching import exact_patching

    model, tok = pythia.model, pythia.tokenizer
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=False), CONFIG)
    acts = run_grid(model, table, [1, 4], batch_size=64)
    table.correct[:] = True
    clean, cf = sample_pairs(table, "+", 8, seed=2)
    for layer in (1, 4):
        fast = exact_patching(model, table, layer, clean, cf, acts[layer][cf], chunk=50)
        slow = exact_patching(model, table, layer, clean, cf, acts[layer][cf], chunk=50,
                              reuse_prefix=False)
        assert np.abs(slow).max() > 1e-4
        np.testing.assert_allclose(fast, slow, rtol=1e-3, atol=1e-5 * np.abs(slow).max())


@pytest.mark.parametrize("shots", [0, 3])
def test_last_position_edits_against_kept_context_equal_full_forwards(pythia, shots):
    """Knockouts run only the last position against the clean keys and values of the
    others (with or without a shared prefix): the logits equal a full forward with the same
    edit, and the edit changes them (so the comparison is not between two clean runs)."""
    import torch

    from catalog.grids import PrefixRunner, post_hook_name

    model, tok = pythia.model, pythia.tokenizer
    config = ScienceConfig(**{**CONFIG.as_dict(), "shots": shots,
                              "few_shot": "Solve. " if shots else ""})
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=False), config)
    n_layers, d_mlp = model.cfg.n_layers, model.cfg.d_mlp
    zero = torch.as_tensor(np.random.default_rng(2).random((n_layers, d_mlp)) < 0.4)

    def edit(act, hook):
        return act.masked_fill(zero[hook.layer()], 0.0)

    def edit_last(act, hook):
        act = act.clone()
        act[:, -1] = act[:, -1].masked_fill(zero[hook.layer()], 0.0)
        return act

    runner = PrefixRunner(model, table)
    hooks = [(post_hook_name(layer), edit) for layer in range(n_layers)]
    checked = 0
    for skip, sel in runner.groups():
        sel = sel[:6]
        assert (skip > 0) == bool(shots)
        fast = runner.last_position_logits(sel, skip, fwd_hooks=hooks)
        again = runner.last_position_logits(sel, skip, fwd_hooks=hooks)  # the kept context
        toks = torch.from_numpy(table.token_matrix(sel))
        slow = model.run_with_hooks(toks, fwd_hooks=[
            (post_hook_name(layer), edit_last) for layer in range(n_layers)])[:, -1]
        clean = model(toks)[:, -1]
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(again, fast)
        torch.testing.assert_close(runner.last_logits(sel, skip), clean, rtol=1e-4, atol=1e-4)
        assert (slow - clean).abs().max() > 1e-2
        checked += 1
    assert checked >= 2


def test_attribution_of_all_layers_at_once_equals_one_layer_at_a_time(pythia):
    """One backward pass serves every layer; counterfactual activations computed inside
    equal the grid's."""
    from catalog.patching import attribution_patching

    model, tok = pythia.model, pythia.tokenizer
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=False), CONFIG)
    layers = list(range(model.cfg.n_layers))
    acts = run_grid(model, table, layers, batch_size=64)
    table.correct[:] = True
    clean, cf = sample_pairs(table, "+", 10, seed=4)
    together = attribution_patching(model, table, layers, clean, None, cf)
    for layer in (1, 3, layers[-1]):  # (Pythia's layer-0 MLP sees only the "=" token)
        alone = attribution_patching(model, table, [layer], clean, {layer: acts[layer][cf]}, cf)
        assert np.abs(alone[layer]).max() > 1e-5
        np.testing.assert_allclose(together[layer], alone[layer], rtol=1e-3,
                                   atol=1e-4 * np.abs(alone[layer]).max())
