"""Few-shot prompts: deterministic solved examples, left out of pairs, and a shared prefix
whose keys and values computed once give the same activations as the full forward."""

import numpy as np
import pytest

from catalog.config import ScienceConfig
from catalog.core.tokens import detect_number_tokens
from catalog.measuring.grids import run_grid
from catalog.measuring.prompts import build_prompts, sample_pairs
from catalog.sources import load_model

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


def test_knockouts_with_prefix_reuse_equal_full_forwards(pythia):
    """Zeroing neurons at the last position gives the same predictions with the cached
    prefix as with full forwards (ablations with a prefix: tests/unit/test_ablation.py)."""
    import torch

    from catalog.circuits import knockouts
    from catalog.measuring.grids import post_hook_name

    model, tok = pythia.model, pythia.tokenizer
    numbers = detect_number_tokens(tok, prepend_bos=False)
    table = build_prompts(tok, numbers, CONFIG)
    run_grid(model, table, [], batch_size=64)
    prompts = np.arange(0, len(table), 3)
    n_layers, d_mlp = model.cfg.n_layers, model.cfg.d_mlp
    zero = np.random.default_rng(0).random((len(prompts), n_layers, d_mlp)) < 0.3
    got = knockouts.accuracy_with_zeroed(model, table, prompts, zero)
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


def test_many_edits_in_one_forward_equal_one_forward_each(pythia):
    """``zeroed_answers_many`` (the summary's knockouts and steering) runs the rows of many
    edits of the same prompts together against one cached context, in chunks of a byte
    budget: each request's answers equal ``zeroed_answers`` of that request alone, with
    zeroed and set neurons, a request of a few rows, and a single mask for all rows."""
    from catalog.circuits import knockouts
    from catalog.measuring.grids import PrefixRunner

    model, tok = pythia.model, pythia.tokenizer
    numbers = detect_number_tokens(tok, prepend_bos=False)
    table = build_prompts(tok, numbers, CONFIG)
    run_grid(model, table, [], batch_size=64)
    prompts = np.arange(1, len(table), 2)
    shape = (model.cfg.n_layers, model.cfg.d_mlp)
    rng = np.random.default_rng(1)
    rows = np.sort(rng.choice(len(prompts), 9, replace=False))
    requests = [
        (rng.random((len(prompts), *shape)) < 0.3, None, None),
        (rng.random(shape) < 0.5, None, None),  # one mask for every prompt
        (rng.random((len(prompts), *shape)) < 0.2,
         rng.normal(0, 3, (len(prompts), *shape)).astype(np.float32), None),
        (rng.random((len(rows), *shape)) < 0.4, None, rows),
        (rng.random((len(rows), *shape)) < 0.4,
         rng.normal(0, 3, (len(rows), *shape)).astype(np.float32), rows),
    ]
    runner = PrefixRunner(model, table)
    assert any(skip for skip, _ in runner.groups(prompts))  # the context is cached
    want = []
    for mask, values, sel in requests:
        if sel is None:
            want.append(knockouts.zeroed_answers(model, table, prompts, mask, runner, values))
        else:
            want.append(knockouts.zeroed_answers(model, table, prompts[sel], mask, runner,
                                                 values))
    for budget in (knockouts.MANY_BYTES, 1):  # all in one forward per group; a row each
        got = knockouts.zeroed_answers_many(model, table, prompts, requests, runner,
                                            max_bytes=budget)
        for (p, top, token), (wp, wtop, wtoken) in zip(got, want, strict=True):
            assert len(p) == len(wp)
            np.testing.assert_allclose(p, wp, rtol=1e-5, atol=1e-7)
            np.testing.assert_array_equal(token, wtoken)
            np.testing.assert_array_equal(top, wtop)
    # the edits change answers: the test would see a request answered as another
    assert not np.allclose(want[0][0], want[2][0])
    assert knockouts.zeroed_answers_many(model, table, prompts, [], runner) == []
    evaluator = knockouts.PromptEvaluator(model, table, prompts, runner)
    np.testing.assert_allclose(evaluator(*requests[3])[0], want[3][0], rtol=1e-5, atol=1e-7)


def test_an_answer_must_end_where_the_result_ends(pythia):
    """A model that always says the same digit gets 0+2=2 right by teacher forcing alone,
    but it goes on to say 22: with the continuing tokens given, those prompts are wrong."""
    import copy

    import torch

    from catalog.core.tokens import continuing_ids

    model = copy.deepcopy(pythia.model)
    tok = pythia.tokenizer
    two = tok.encode("2", add_special_tokens=False)[0]
    with torch.no_grad():
        model.W_U.zero_()
        model.b_U.fill_(-10.0)
        model.b_U[two] = 10.0  # every position predicts "2"
    config = ScienceConfig(operators=("+",), operand_hi=12)
    numbers = detect_number_tokens(tok, prepend_bos=False)
    table = build_prompts(tok, numbers, config)
    is_two = table.result == 2
    run_grid(model, table, [], batch_size=64)
    assert table.correct[is_two].all() and not table.correct[~is_two].any()
    cont = continuing_ids(tok)
    assert two in cont and tok.encode(" =", add_special_tokens=False)[0] not in cont
    run_grid(model, table, [], batch_size=64, continuing=cont)
    assert not table.correct.any()
    # with nothing counted as continuing a number, the answer alone decides again
    run_grid(model, table, [], batch_size=64, continuing=cont[:0])
    assert (table.correct == is_two).all()


def test_shared_prompt_heads_equal_the_full_forward_and_run_fewer_positions(tiny_builtin,
                                                                             monkeypatch):
    """Without a few-shot prefix (the built-in model's "BOS a op b ="), the grid pass runs
    each distinct head ("BOS a op") once and two positions per prompt: the activations
    equal the full forward's to float rounding, correctness is the same, and the model
    sees under half the positions (counted at its embedding). Where a batch's copies of
    its heads' keys and values would pass ``HEAD_BYTES``, prompts run whole."""
    from catalog.measuring import kv_cache
    from catalog.measuring.kv_cache import shared_heads

    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    model = lm.model
    config = ScienceConfig(operand_hi=20)
    table = build_prompts(lm.tokenizer, detect_number_tokens(
        lm.tokenizer, prepend_bos=model.cfg.default_prepend_bos), config)
    layers = list(range(model.cfg.n_layers))
    seen = []
    handle = model.hook_embed.register_forward_hook(lambda m, i, out: seen.append(
        out.shape[0] * out.shape[1]))
    try:
        shared = run_grid(model, table, layers, batch_size=97)
        positions, correct = sum(seen), table.correct.copy()
        seen.clear()
        full = run_grid(model, table, layers, batch_size=97, reuse_prefix=False)
    finally:
        handle.remove()
    n_full = sum(len(t) for t in table.tokens)
    assert sum(seen) == n_full and positions < 0.5 * n_full
    seen.clear()
    monkeypatch.setattr(kv_cache, "HEAD_BYTES", 97 * 3 * kv_cache.token_kv_bytes(model) - 1)
    handle = model.hook_embed.register_forward_hook(lambda m, i, out: seen.append(
        out.shape[0] * out.shape[1]))
    try:
        run_grid(model, table, [], batch_size=97)
    finally:
        handle.remove()
    assert sum(seen) == n_full
    for layer in layers:
        assert np.abs(full[layer]).max() > 1e-2
        np.testing.assert_allclose(shared[layer], full[layer], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(correct, table.correct)
    assert 0 < correct.mean() < 1
    # the split: the first operand and the operator, 20 heads per operator
    toks = table.token_matrix(table.op_index("+"))
    h, head_of = shared_heads(toks, 0, 0)
    assert h == 3 and head_of is not None and len(np.unique(head_of)) == 20
    assert (toks[head_of == head_of[0], :3] == toks[0, :3]).all()
    # prompts that share nothing are run whole
    assert shared_heads(np.arange(40).reshape(8, 5), 0, 0) == (0, None)
