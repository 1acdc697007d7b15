"""One prompt explained (catalog.explain): a hand-built bag of heuristics whose answer is
carried by known neurons is explained by exactly those, its terms add up, and knocking
them out breaks the answer while random neurons do not; the decomposition equals one
hooked forward per component on the built-in model and on a tiny model of every
architecture; bad prompts get a message that names what is wrong."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_architectures import ARCHITECTURES, random_model
from transformer_lens import HookedTransformer, HookedTransformerConfig

from catalog.builtin import builtin_tokenizer, builtin_vocab
from catalog.config import ScienceConfig
from catalog.explain.decompose import decompose, decompose_batch
from catalog.explain.grid import PARTS, explain_prompts, summarize_prompts
from catalog.explain.prompt import PromptError, _one_pass, build, explain, written
from catalog.labels.heuristics import Heuristic
from catalog.sources import from_hf_model

from reference import reference_direct_effect

# ------------------------------------------------------------ a hand-built bag of heuristics

SIDE = 10  # operands 0..9 of "+"; results 0..18
ONE_A, ONE_B, COPY_A, COPY_B, POS, VOTE = 0, 10, 20, 30, 40, 45  # residual dims
D_MODEL = VOTE + 19
N_DISTRACT = 15
VOTE_SIZE = 8.0  # a firing neuron (0.5) adds 4 to each logit it promotes


def planted_neurons() -> list[tuple[Heuristic, list[int], list[int], list[int]]]:
    """(the heuristic a neuron is labelled with, the op1 values and op2 values it needs,
    the results it promotes). Every neuron fires (0.5) iff op1 is in its first set AND op2
    in its second; each promotes a set of results that contains a + b when it fires:
    op1 = i promotes [i, i + 10); op2 = j promotes [j, j + 10); (op1, op2) residues mod 2
    and mod 5 promote the result's residue. Only a + b gets all four votes: in a window of
    at most 10 results one residue mod 10 is unique."""
    every = list(range(SIDE))
    out = []
    for i in every:
        out.append((Heuristic("value", "op1", (i,)), [i], every, list(range(i, i + 10))))
    for j in every:
        out.append((Heuristic("value", "op2", (j,)), every, [j], list(range(j, j + 10))))
    for m in (2, 5):
        for p in range(m):
            for q in range(m):
                out.append((Heuristic("modulo", "result", (m, (p + q) % m)),
                            [x for x in every if x % m == p], [x for x in every if x % m == q],
                            [r for r in range(19) if r % m == (p + q) % m]))
    return out


def _plant(sd: dict, planted: list, slots: dict[int, int]) -> None:
    """Write each placed planted neuron's conjunction and votes; the rest stay dead."""
    mlp = "blocks.0.mlp."
    sd[mlp + "b_in"][:] = -1.0
    for k, (_, need_a, need_b, promotes) in enumerate(planted):
        if k not in slots:
            continue
        n = slots[k]
        for x in need_a:
            sd[mlp + "W_in"][COPY_A + x, n] = 1.0
        for x in need_b:
            sd[mlp + "W_in"][COPY_B + x, n] = 1.0
        sd[mlp + "b_in"][n] = -1.5
        for r in promotes:
            if r < 19:
                sd[mlp + "W_out"][n, VOTE + r] = VOTE_SIZE


def hand_model(slots: dict[int, int] | None = None, width: int | None = None,
               planted: list | None = None) -> tuple[HookedTransformer, list]:
    """One layer: head 0 at '=' copies op1's one-hot, head 1 copies op2's; the MLP holds
    the planted neurons, then distractors that read random mixtures and write little.
    ``slots`` (planted index -> neuron; default: planted neuron k is neuron k) places
    them in an MLP of ``width`` neurons whose last N_DISTRACT are the distractors; a planted
    neuron left out of ``slots`` is absent (its neuron stays dead: never fires, writes
    nothing). ``planted`` replaces ``planted_neurons()``."""
    vocab = builtin_vocab()
    planted = planted if planted is not None else planted_neurons()
    d_mlp = width or len(planted) + N_DISTRACT
    if slots is None:
        slots = {k: k for k in range(len(planted))}
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=D_MODEL, n_heads=2, d_head=SIDE, d_mlp=d_mlp,
        d_vocab=len(vocab), n_ctx=8, act_fn="relu", normalization_type=None,
        positional_embedding_type="standard", default_prepend_bos=True)
    model = HookedTransformer(cfg)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for n in range(SIDE):
        sd["embed.W_E"][vocab[str(n)], ONE_A + n] = 1.0
    for p in range(5):
        sd["pos_embed.W_pos"][p, POS + p] = 1.0
    att = "blocks.0.attn."
    for head, src in ((0, 1), (1, 3)):  # BOS, op1, +, op2, =
        sd[att + "W_Q"][head, POS + 4, 0] = 30.0
        sd[att + "W_K"][head, POS + src, 0] = 30.0
        for n in range(SIDE):
            sd[att + "W_V"][head, ONE_A + n, n] = 1.0
            sd[att + "W_O"][head, n, (COPY_A if head == 0 else COPY_B) + n] = 1.0
    mlp = "blocks.0.mlp."
    _plant(sd, planted, slots)
    g = torch.Generator().manual_seed(3)
    rest = slice(d_mlp - N_DISTRACT, d_mlp)
    sd[mlp + "W_in"][COPY_A:COPY_B + SIDE, rest] = torch.rand(2 * SIDE, N_DISTRACT, generator=g)
    sd[mlp + "b_in"][rest] = -0.5
    sd[mlp + "W_out"][rest, VOTE:VOTE + 19] = 0.1 * torch.randn(N_DISTRACT, 19, generator=g)
    for r in range(19):
        sd["unembed.W_U"][VOTE + r, vocab[str(r)]] = 1.0
    model.load_state_dict(sd)
    model.eval()
    return model, planted


@pytest.fixture(scope="module")
def hand():
    model, planted = hand_model()
    config = ScienceConfig(operators=("+",), operand_hi=SIDE, shots=0, seed=0)
    labels = {(0, k): [h] for k, (h, *_rest) in enumerate(planted)}
    return model, planted, config, labels


def firing(planted, a: int, b: int) -> set[int]:
    return {k for k, (_, na, nb, _) in enumerate(planted) if a in na and b in nb}


@pytest.mark.parametrize("a, b", [(2, 7), (9, 9), (0, 0), (4, 5), (8, 1)])
def test_the_planted_neurons_are_named_and_add_up(hand, a, b):
    model, planted, config, labels = hand
    e = explain(model.to(torch.float64), builtin_tokenizer(), f"{a}+{b}=", config,
                labels=labels, seeds=8)
    # (no end token after the answer in this model: its first token is the test)
    assert e.result == a + b and e.rank_answer == 1 and e.predicted == str(a + b)
    # (the hand-built model is not named as the built-in one: greedy decoding goes on
    # while the next token is a number, and its first is the answer)
    assert e.written.split()[0] == str(a + b) and e.answer_token == str(a + b)
    assert e.p_answer > 0.9
    want = firing(planted, a, b)
    assert len(want) == 4
    # exactly the four that fire are the top four, and they carry the answer
    assert {r.neuron for r in e.toward[:4]} == want
    assert e.toward[4].contribution < 0.1 * min(r.contribution for r in e.toward[:4]) \
        if len(e.toward) > 4 else True
    assert all(lab.holds for r in e.toward[:4] for lab in r.labels)
    assert e.shares["labelled, heuristic holds"] > 0.9
    # the terms add up to T (float64 model: to the rounding of its forward)
    total = e.neurons_total + e.heads_total + e.embed + e.biases
    assert abs(e.target - total) <= 1e-9 * max(abs(e.target), 1.0)
    assert abs(sum(e.shares.values()) - 1.0) < 1e-9
    assert set(e.by_family) == {"value", "modulo"}
    assert e.by_family["value"] == pytest.approx(sum(
        r.contribution for r in e.toward[:4] if r.labels[0].family == "value"))
    # knockout: the planted neurons break it, random ones of the layer do not
    ko = e.knockout
    holds = {k for k, (h, *_r) in enumerate(planted)
             if h.contains(np.array([a]), np.array([b]), np.array([a + b]))[0]}
    assert ko is not None and {n for _, n in ko.neurons} == holds >= want
    assert not ko.top_after and ko.p_knocked < 0.5 * ko.p_clean
    assert sum(ko.top_random) >= len(ko.top_random) - 1
    assert ko.p_random_mean > 2 * ko.p_knocked


def test_unlabelled_prompts_still_decompose_and_have_no_knockout(hand):
    model, planted, config, _ = hand
    e = explain(model, builtin_tokenizer(), "3+4=", config, labels=None)
    assert e.knockout is None and not e.labelled
    assert e.shares["labelled, heuristic holds"] == 0.0
    assert e.shares["other neurons"] > 0.9
    # the four planted neurons that fire on 3+4 carry its answer about equally: 50% of T
    # takes two of them, 80% all four
    assert len(firing(planted, 3, 4)) == 4
    assert (e.n_for["50%"], e.n_for["80%"]) == (2, 4)


@pytest.mark.parametrize("text, message", [
    ("hello", "not an arithmetic prompt"),
    ("3*4=", "operator '\\*' is not measured"),
    ("12+4=", "must be in the config's range \\[0, 10\\)"),
])
def test_bad_prompts_get_a_clear_message(hand, text, message):
    model, _, config, _ = hand
    with pytest.raises(PromptError, match=message):
        explain(model, builtin_tokenizer(), text, config)


def test_a_prompt_longer_than_the_context_is_refused(hand):
    model, _, config, _ = hand
    long = ScienceConfig(operators=("+",), operand_hi=SIDE, shots=3, seed=0)
    with pytest.raises(PromptError, match="longer than the model's context \\(8\\)"):
        build(model, builtin_tokenizer(), "3+4=", long)


def test_an_invalid_cell_is_refused():
    model, _ = hand_model()
    config = ScienceConfig(operators=("-",), operand_hi=SIDE, shots=0)
    with pytest.raises(PromptError, match="negative"):
        build(model, builtin_tokenizer(), "3-4=", config)


# ------------------------------------------------------------ over a grid of prompts

def test_the_grid_aggregate_is_the_planted_mechanism(hand):
    """Every prompt of the hand-built model: the four firing neurons carry it, so the
    labelled neurons that hold carry most of T on every prompt, the neurons for 80% are
    those four (or fewer), they combine an op1, an op2 and two residue heuristics, and each
    labelled neuron's term is higher where its heuristic holds than where it does not."""
    model, planted, config, labels = hand
    model = model.to(torch.float64)
    side = np.arange(SIDE)
    a, b = (g.ravel() for g in np.meshgrid(side, side, indexing="ij"))
    terms = explain_prompts(model, builtin_tokenizer(), config, "+", a, b, labels, batch=7)
    # each prompt's split equals explain()'s for it (batched, with per-row competitors)
    for i in (0, 23, 99):
        e = explain(model, builtin_tokenizer(), f"{a[i]}+{b[i]}=", config, labels=labels,
                    seeds=0)
        assert terms.target[i] == pytest.approx(e.target, rel=1e-12)
        for part in PARTS:
            assert terms.shares[part][i] == pytest.approx(e.shares[part], abs=1e-12)
        assert terms.n_for["80%"][i] == e.n_for["80%"]
        assert terms.heuristics_in_80[i] == e.heuristics_in_80
    assert np.allclose(sum(terms.shares.values()), 1.0, atol=1e-9)
    s = summarize_prompts(terms, [0])
    assert s["n_prompts"] == 100 and s["n_labelled"] == len(planted)
    assert s["mostly_labelled"]["count"] == 100 and s["mostly_labelled"]["ci"][0] > 0.96
    assert s["n_for"]["80%"]["median"] <= 4 and s["n_for"]["80%"]["never"] == 0
    assert s["heuristics_in_80"]["median"] in (3.0, 4.0)
    # base rate: the labels that hold per prompt (one op1, one op2, the 2 + 5 neurons of
    # the result's residues mod 2 and 5; more than the 4 that fire) over the layer's 64
    assert s["neuron_base_rate"] == pytest.approx((1 + 1 + 2 + 5) / (len(planted) + N_DISTRACT))
    paired = s["paired"]
    assert paired["n_neurons"] == len(planted)
    assert paired["higher_when_holds"] == len(planted)
    assert paired["difference"]["mean"] > 10 * paired["difference"]["se"]
    assert paired["by_layer"]["0"]["n_neurons"] == len(planted)
    assert paired["by_layer"]["0"]["mean"] == pytest.approx(paired["difference"]["mean"])


def test_a_batch_decomposes_each_prompt_as_alone(tiny_builtin):
    """decompose_batch over prompts of several answers equals decompose of each (whose
    competitors leave its own answer out), on the built-in model in float64."""
    from catalog.sources import load_model

    cfg, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
    model = lm.model.to(torch.float64)
    config = ScienceConfig(operators=("+",), operand_hi=cfg.operand_hi)
    ps = [build(model, lm.tokenizer, t, config) for t in ("7+5=", "3+6=", "0+0=", "9+9=")]
    everyone = np.union1d(ps[0].competitors, [ps[0].answer])
    batch = decompose_batch(model, np.stack([p.tokens for p in ps]),
                            np.array([p.answer for p in ps]), everyone)
    for i, p in enumerate(ps):
        one = decompose(model, p.tokens, p.answer, p.competitors)
        assert batch[i].target == pytest.approx(one.target, rel=1e-12)
        assert np.allclose(batch[i].neurons, one.neurons, rtol=0, atol=1e-12)
        assert np.allclose(batch[i].heads, one.heads, rtol=0, atol=1e-12)
        assert batch[i].biases == pytest.approx(one.biases, abs=1e-12)


def test_total_effects_equal_exact_zeroing_to_first_order_per_prompt(tiny_builtin):
    """Each prompt's total effects (one backward) equal the exact change of T when the
    neuron's activation at the last position is scaled by 1 - 1e-6 (divided by 1e-6), for
    the 30 neurons of largest |total effect| and 10 random ones, on the built-in model in
    float64, prompt by prompt, batched as the grid batches them; zeroing exactly differs
    from the first order by the curvature, which the test bounds loosely. With the final
    norm's scale kept, as in the decomposition, a last-layer neuron's total effect is
    its direct term."""
    from catalog.explain.total import exact_zeroing, total_effects
    from catalog.sources import load_model

    cfg, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
    model = lm.model.to(torch.float64)
    config = ScienceConfig(operators=("+", "*"), operand_hi=cfg.operand_hi)
    ps = [build(model, lm.tokenizer, t, config) for t in ("7+5=", "3+6=", "9+0=")]
    everyone = np.union1d(ps[0].competitors, [ps[0].answer])
    got = total_effects(model, np.stack([p.tokens for p in ps]),
                        np.array([p.answer for p in ps]), everyone, batch=2)
    rng = np.random.default_rng(0)
    width = got.shape[2]
    for i, p in enumerate(ps):
        flat = np.abs(got[i]).ravel()
        pick = np.concatenate([np.argsort(-flat)[:30], rng.choice(flat.size, 10)])
        neurons = [(int(f) // width, int(f) % width) for f in pick]
        want = exact_zeroing(model, p.tokens, p.answer, p.competitors, neurons, scale=1e-6)
        mine = np.array([got[i][la, n] for la, n in neurons])
        assert np.allclose(mine, want, rtol=1e-4, atol=1e-7 * np.abs(want).max()), p.text
        assert np.abs(mine).max() > 1e-3
        zeroed = exact_zeroing(model, p.tokens, p.answer, p.competitors, neurons[:30])
        assert np.corrcoef(zeroed, mine[:30])[0, 1] > 0.8, p.text
        # the final norm's scale kept: a last-layer neuron's total effect is its direct term
        last = model.cfg.n_layers - 1
        direct = decompose(model, p.tokens, p.answer, p.competitors).neurons[last]
        assert np.allclose(got[i][last], direct, rtol=1e-7, atol=1e-9 * np.abs(direct).max())
        assert not np.allclose(got[i][0], 0.0)  # the first layer acts through the last


def test_the_knockout_rows_run_one_position_and_equal_full_forwards(tiny_builtin):
    """zeroed_probs runs the prompt less its last token once and each knockout row at the
    last position against those keys and values: equal to a full forward of each row
    with the same neurons zeroed at the last position (float64, the built-in model)."""
    from catalog.explain.controls import set_last, zeroed_probs
    from catalog.sources import load_model

    cfg, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
    model = lm.model.to(torch.float64)
    config = ScienceConfig(operators=("+",), operand_hi=cfg.operand_hi)
    p = build(model, lm.tokenizer, "7+5=", config)
    assert len(p.tokens) == 5  # BOS 7 + 5 =: four positions cached
    rng = np.random.default_rng(1)
    d = model.cfg.d_mlp
    sets = [[(int(la), int(n)) for la, n in zip(rng.integers(0, 2, k), rng.choice(d, k, False),
                                                 strict=True)] for k in (1, 5, 20, min(200, d))]
    p_fast, top_fast = zeroed_probs(model, p.tokens, p.answer, sets)
    mask = torch.zeros((len(sets) + 1, model.cfg.n_layers, d), dtype=torch.bool)
    for i, s in enumerate(sets):
        for la, n in s:
            mask[i + 1, la, n] = True
    toks = torch.as_tensor(p.tokens)[None].expand(len(sets) + 1, -1)
    p_full, top_full, _ = set_last(model, toks, mask, torch.full((len(sets) + 1,), p.answer))
    assert np.allclose(p_fast, p_full, rtol=1e-9, atol=1e-12)
    assert np.array_equal(top_fast, top_full)
    assert p_full[-1] != p_full[0]  # the largest set moves the answer


# ------------------------------------------------------------ against the slow reference

def check_against_reference(model, tokens, answer, competitors, n_neurons: int = 40,
                            seed: int = 0) -> None:
    """Every head and ``n_neurons`` random neurons of every layer: the decomposition's
    term equals the reference's direct effect; the terms and the rest add up to T."""
    dec = decompose(model, tokens, answer, competitors)
    assert abs(dec.error) <= 1e-9 * max(abs(dec.target), 1.0), dec.error
    rng = np.random.default_rng(seed)
    scale = max(np.abs(dec.neurons).max(), np.abs(dec.heads).max(), 1e-12)
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            ref = reference_direct_effect(model, tokens, answer, competitors, ("head", layer, h))
            assert dec.heads[layer, h] == pytest.approx(ref, abs=1e-9 * scale), (layer, h)
        for n in rng.choice(model.cfg.d_mlp, size=min(n_neurons, model.cfg.d_mlp),
                            replace=False):
            ref = reference_direct_effect(model, tokens, answer, competitors,
                                          ("neuron", layer, int(n)))
            assert dec.neurons[layer, n] == pytest.approx(ref, abs=1e-9 * scale), (layer, n)
    assert np.abs(dec.neurons).max() > 1e-6 and np.abs(dec.heads).max() > 1e-6


def test_decomposition_equals_the_reference_on_the_built_in_model(tiny_builtin):
    from catalog.sources import load_model

    cfg, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
    model = lm.model.to(torch.float64)
    config = ScienceConfig(operators=("+", "*"), operand_hi=cfg.operand_hi)
    for text in ("7+5=", "3*6="):
        p = build(model, lm.tokenizer, text, config)
        check_against_reference(model, p.tokens, p.answer, p.competitors)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The built-in tokenizer as transformers reads a model's (test_architectures)."""
    import transformers as T

    folder = tmp_path_factory.mktemp("tokenizer")
    builtin_tokenizer().save_pretrained(folder)
    return T.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[a[0] for a in ARCHITECTURES])
def test_decomposition_equals_the_reference_on_every_architecture(tokenizer, arch):
    """A tiny random model of each architecture (norm weights and biases away from their
    init, so that every frozen norm and bias term matters), in float64, its final soft cap
    (Gemma 2) off: T is the logit difference before it."""
    name, config_cls, model_cls, extra, _ = arch
    hf = random_model(config_cls, model_cls, extra, len(tokenizer))
    model = from_hf_model(hf, tokenizer, f"random {name}", "cpu", torch.float32)
    model = model.to(torch.float64)
    model.cfg.output_logits_soft_cap = -1.0
    tokens = np.array([5, 17, 3, 9, 11, 2, 40, 7], dtype=np.int64)
    competitors = np.setdiff1d(np.arange(20, 60), [33])  # never the answer (as in build)
    check_against_reference(model, tokens, 33, competitors, n_neurons=24)


def slow_greedy(model, tokenizer, p, builtin: bool) -> bool:
    """Greedy decoding one token at a time: the result's tokens, then (a model with a
    real tokenizer) a token that does not extend the number."""
    toks = torch.as_tensor(p.tokens, dtype=torch.long)[None]
    for want in p.result_tokens:
        nxt = int(model(toks)[0, -1].argmax())
        if nxt != want:
            return False
        toks = torch.cat([toks, toks.new_tensor([[nxt]])], 1)
    if toks.shape[1] >= model.cfg.n_ctx or builtin:
        return True
    return not tokenizer.decode([int(model(toks)[0, -1].argmax())])[:1].isdigit()


def slow_written(model, tokenizer, p, builtin: bool) -> str:
    """What greedy decoding writes, one forward per token: the first token, then each
    token whose text starts with a digit, at most the result's length plus two tokens (one
    token on the built-in model)."""
    toks, out = [int(x) for x in p.tokens], []
    limit = 1 if builtin else len(p.result_tokens) + 2
    while len(out) < limit and len(toks) < model.cfg.n_ctx:
        nxt = int(model(torch.as_tensor(toks, dtype=torch.long)[None])[0, -1].argmax())
        digit = tokenizer.decode([nxt])[:1].isdigit()
        if out and not digit:
            break
        out.append(nxt)
        toks.append(nxt)
        if not digit:
            break
    return tokenizer.decode(out)


def _top_of(model, p) -> list[int]:
    """The teacher-forced pass's top token at every position (prompt, then result)."""
    seq = [int(x) for x in p.tokens] + list(p.result_tokens)
    return model(torch.as_tensor(seq, dtype=torch.long)[None])[0].argmax(-1).tolist()


def test_the_one_pass_equals_greedy_decoding_the_per_layer_lens_and_each_neurons_tokens(
        tiny_builtin):
    """explain's single teacher-forced forward gives what greedy decoding, one unembedding
    per layer and one product with W_U per listed neuron give, on a trained model's correct
    and wrong prompts, with the end-of-number check on (the model named as any other) and
    off (the built-in model)."""
    from catalog.measuring.grids import final_logits
    from catalog.sources import load_model

    cfg, root = tiny_builtin
    lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
    model, tok = lm.model, lm.tokenizer
    config = ScienceConfig(operators=("+", "*"), operand_hi=cfg.operand_hi)
    name = model.cfg.model_name
    seen = {(b, c): 0 for b in (True, False) for c in (True, False)}
    rng = np.random.default_rng(0)

    # the built-in tokenizer, except that odd token ids decode as a non-digit: after the
    # number, the model's next token then ends it or extends it
    odd_ends = copy.copy(tok)
    odd_ends.decode = lambda ids, **kw: "." if ids[0] % 2 else tok.decode(ids, **kw)

    try:
        for k in range(40):
            builtin = k % 2 == 0
            model.cfg.model_name = name if builtin else "any other model"
            a, b = (int(x) for x in rng.integers(0, cfg.operand_hi, 2))
            text = f"{a}{'+*'[k % 4 // 2]}{b}="
            e = explain(model, tok, text, config, seeds=0)
            p = build(model, tok, text, config)
            t = tok if builtin else odd_ends  # only the end check decodes
            correct = e.correct if builtin else _one_pass(model, t, p)[2]
            assert correct == slow_greedy(model, t, p, builtin), text
            assert e.written == slow_written(model, tok, p, builtin), text
            if not builtin:  # tokens that end the number after one, two or three
                assert written(model, t, p, _top_of(model, p)) == slow_written(
                    model, t, p, False), text
            seen[builtin, correct] += 1
            _, cache = model.run_with_cache(torch.as_tensor(p.tokens)[None])
            for layer, rank, prob in e.lens:
                lg = final_logits(model, cache[f"blocks.{layer}.hook_resid_post"][:, -1:])
                lg = lg[0, -1].double()
                assert rank == int((lg > lg[p.answer]).sum()) + 1, (text, layer)  # 1 = top
                assert prob == pytest.approx(float(lg.softmax(-1)[p.answer]), abs=1e-6)
            for r in e.toward + e.away:
                row = model.blocks[r.layer].mlp.W_out[r.neuron] @ model.W_U
                row = row if r.activation >= 0 else -row
                assert r.promotes == [tok.decode([int(t)]) for t in row.topk(5).indices]
    finally:
        model.cfg.model_name = name
    assert min(seen.values()) >= 2, seen
