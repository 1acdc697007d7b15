"""Circuits and faithfulness: the statistics by hand, the protocol's rules, the invariants
(everything kept: F = 1; everything ablated: F = 0), a hand-built model whose answer is
carried by known late neurons and needs its whole early MLP, exact component effects
against one-hook forwards, and the knockouts."""

import math

import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from catalog.builtin.vocab import builtin_tokenizer
from catalog.circuits import faithfulness, knockouts, paper
from catalog.config import ScienceConfig
from catalog.config.vocab import ROLES
from catalog.core.tokens import detect_number_tokens
from catalog.labels.heuristics import Heuristic
from catalog.measuring import ablation
from catalog.measuring.ablation import Circuit
from catalog.measuring.components import component_effects
from catalog.measuring.patching import effect_from_logprobs
from catalog.measuring.prompts import build_prompts, sample_pairs
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model

# ------------------------------------------------------------------ statistics by hand


def test_prompt_metrics_by_hand():
    logits = torch.tensor([[1.0, 4.0, 2.0], [3.0, -1.0, 6.0]])
    m = faithfulness.prompt_metrics(logits, torch.tensor([2, 0]), torch.tensor([1, 2]))
    assert m[:, 0].tolist() == [0.5, 0.5]  # NL = logit(answer) / max logit
    lse = torch.logsumexp(logits.double(), 1).numpy()
    np.testing.assert_allclose(m[:, 1], [2.0 - lse[0], 3.0 - lse[1]])  # log-probability
    assert m[:, 2].tolist() == [2.0 - 4.0, 3.0 - 6.0]  # logit difference to the cf answer


def test_point_statistics_by_hand():
    circuit = np.array([0.5, 1.0, 0.3])
    empty = np.array([0.0, 0.5, 0.3])
    model = np.array([1.0, 1.0, 0.3])
    st = faithfulness.point_stats(circuit, empty, model, faithfulness.resamples(3, 0))
    # per prompt 0.5, 1.0 and undefined (model = empty): the paper's mean leaves it out
    assert st.mean_ratio == pytest.approx(0.75)
    assert st.median_ratio == pytest.approx(0.75)
    assert st.mean_ratio_se == pytest.approx(np.std([0.5, 1.0], ddof=1) / math.sqrt(2))
    # ratio of means: (0.6 - 0.8/3) / (2.3/3 - 0.8/3)
    assert st.ratio_of_means == pytest.approx((1.8 / 3 - 0.8 / 3) / (2.3 / 3 - 0.8 / 3))
    assert st.n == 3 and st.n_small == 1  # |model - empty| < 0.05 for the third prompt


def test_areas_by_hand():
    cpr, cmd = faithfulness.areas(np.array([0.1, 0.5, 1.0]), np.array([0.2, 0.6, 1.0]))
    assert cpr == pytest.approx(0.4 * 0.4 + 0.5 * 0.8)  # trapezoids under the curve
    assert cmd == pytest.approx(0.4 * 0.6 + 0.5 * 0.2)  # and between the curve and 1
    cpr, cmd = faithfulness.areas(np.array([0.0, 1.0]), np.array([1.5, 1.5]))
    assert (cpr, cmd) == (pytest.approx(1.5), pytest.approx(0.5))  # overshoot counts in CMD


def test_circuit_sizes_and_top_k_mask():
    assert paper.circuit_sizes(512, (0.01, 0.02, 0.05)) == [6, 11, 26]
    assert paper.circuit_sizes(10, (0.01, 0.05)) == [1]
    assert faithfulness.fraction_counts(10, (0.001, 0.01, 0.5)) == [1, 1, 5]
    mask = paper.top_k_mask(np.array([[0.1, 0.5, 0.3], [2.0, -1.0, 0.0]]), 2)
    assert mask.tolist() == [[False, True, True], [True, False, True]]
    assert not paper.top_k_mask(np.ones((2, 3)), 0).any()


# ------------------------------------------------------------------ the protocol's rules


def test_heads_kept_and_first_heuristics_layer_rules():
    assert paper.heads_to_keep(32, 32, "auto") == 50  # Pythia-6.9B: the paper's 50
    assert paper.heads_to_keep(80, 64, "auto") == 112  # Llama3-70B (the paper: 100)
    assert paper.heads_to_keep(24, 14, "auto") == 29  # Qwen2.5-0.5B
    assert paper.heads_to_keep(1, 2, "auto") == 2  # 50 x sqrt(2 / 1024) = 2.2: all
    assert paper.heads_to_keep(2, 4, "100") == 8  # never more than every head
    assert paper.known_first_layer("EleutherAI/pythia-6.9b") == 14
    assert paper.known_first_layer("meta-llama/Meta-Llama-3-8B") == 16
    assert paper.known_first_layer("EleutherAI/gpt-j-6B") == 17
    assert paper.known_first_layer("qwen2.5-coder-0.5b") is None
    # the first layer from 1 reaching 10% of the largest whole-MLP effect (MLP 0 never)
    assert paper.first_heuristics_layer(np.array([9.0, 0.05, 0.2, 0.09, 1.0, 0.5])) == 2
    assert paper.first_heuristics_layer(np.array([5.0, 0.0, 0.0])) == 1
    assert paper.first_heuristics_layer(np.array([1.0, np.nan, -np.inf, 3.0])) == 3


def test_config_checks_name_the_bad_field():
    with pytest.raises(ValueError, match="faithfulness_protocols"):
        ScienceConfig(faithfulness_protocols=("paper", "best"))
    with pytest.raises(ValueError, match="late_from"):
        ScienceConfig(late_from="late")
    with pytest.raises(ValueError, match="heads_kept"):
        ScienceConfig(heads_kept="0")
    with pytest.raises(ValueError, match="component_positions"):
        ScienceConfig(faithfulness_protocols=("paper",), component_positions=())
    with pytest.raises(ValueError, match="attribution"):
        ScienceConfig(patching=("exact",), circuit_ranking="attribution")
    with pytest.raises(ValueError, match="circuit_counts"):
        ScienceConfig(circuit_counts="many")
    assert ScienceConfig(circuit_counts="paper").counts(600) == \
        list(range(0, 500, 10)) + [500, 550, 600]
    assert ScienceConfig(patching=("exact",)).circuit_ranking == "auto"
    # every choice is part of the config's hash: a stored curve says how it was made
    assert ScienceConfig(faithfulness_protocols=("all-layers",)).config_hash() != \
        ScienceConfig().config_hash()
    assert ScienceConfig(ablate_context="prompt").config_hash() != ScienceConfig().config_hash()


# ------------------------------------------------------------------ invariants


@pytest.fixture(scope="module")
def trained(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         ScienceConfig(operators=("+", "-"), operand_hi=20)).prepare()
    prep.table.correct[:] = True
    return lm, prep


def _setup(table, width, prompts, counts, cf_of=None) -> paper.CurveSetup:
    cf_of = cf_of or {int(p): int(p + 1) for p in prompts}
    return paper.CurveSetup(table=table, width=width, fractions=(0.1, 0.5, 1.0),
                               counts=counts, seeds=[prompts[: len(prompts) // 2],
                                                     prompts[len(prompts) // 2:]],
                               cf_of=cf_of, seed=0, batch_size=64)


def _point(result, k, circuit="ranked", metric="nl"):
    pt, = [p for p in result.points if p["k"] == k and p["circuit"] == circuit
           and p["metric"] == metric]
    return pt


def test_everything_kept_is_faithful_and_everything_ablated_is_not(trained):
    lm, prep = trained
    model, table = lm.model, prep.table
    n_layers, d_mlp, n_heads = model.cfg.n_layers, model.cfg.d_mlp, model.cfg.n_heads
    score = np.random.default_rng(0).standard_normal((n_layers, d_mlp))
    prompts = table.op_index("+")[::7][:40]
    pop = ablation.mean_population(lm.tokenizer, table, prep.config, "grid", 400, seed=0)
    replace = ablation.mean_replacement(ablation.position_means(model, pop, "all"))
    for heads in (np.ones((n_layers, n_heads), bool), np.zeros((n_layers, n_heads), bool)):
        plan = paper.CircuitPlan("paper", heads, [0, 1], [], score, Circuit.nothing(model))
        got = paper.measure_curve(model, _setup(table, d_mlp, prompts, [0, d_mlp]), "+",
                                     plan, replace, "all", "grid", "rank")
        for metric in faithfulness.METRICS:
            if heads.all():  # every head and every neuron kept: the model itself
                pt = _point(got, d_mlp, metric=metric)
                assert pt["mean_ratio"] == 1.0 and pt["ratio_of_means"] == 1.0, metric
                assert pt["median_ratio"] == 1.0
            else:  # no head and no neuron kept: the empty circuit
                pt = _point(got, 0, metric=metric)
                assert pt["mean_ratio"] == 0.0 and pt["ratio_of_means"] == 0.0, metric
        assert got.baselines["nl"]["model"] > got.baselines["nl"]["empty"]
        cpr = got.areas["ranked"]["nl"]["ratio_of_means"]["cpr"]
        assert np.isfinite(cpr) and got.areas["random"]["nl"]["mean_ratio"]["cpr_se"] > 0


# ------------------------------------------------------------------ a hand-built model

KEY = [3, 17, 40, 58]  # the late neurons that carry the answer


def _hand_built(seed: int = 0) -> HookedTransformer:
    """Two layers, no norms. Layer 0's one head averages the tokens' operand codes into the
    last position; layer 0's 64 neurons turn them into features, each neuron a small share;
    layer 1's neurons ``KEY`` read the features and write the logits. Layer 1's other
    neurons are dead (always 0) and write nothing; layer 1's head writes nothing."""
    tok = builtin_tokenizer()
    d_vocab = len(tok.get_vocab())
    cfg = HookedTransformerConfig(n_layers=2, d_model=48, n_heads=2, d_head=8, d_mlp=64,
                                  d_vocab=d_vocab, n_ctx=8, act_fn="relu",
                                  normalization_type=None, default_prepend_bos=True,
                                  positional_embedding_type="standard", model_name="hand-built")
    model = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(seed)
    U, U2, V, Z, C = slice(0, 8), slice(8, 16), slice(16, 32), slice(32, 40), 40
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    # sorted: the vocabulary's dict order can differ from one process to the next
    numbers = sorted(i for t, i in tok.get_vocab().items() if t.isdigit())
    sd["embed.W_E"][numbers, U] = torch.randn(len(numbers), 8, generator=g)
    sd["embed.W_E"][:, C] = 1.0
    sd["blocks.0.attn.W_V"][0, U, :] = torch.eye(8)  # W_Q = W_K = 0: uniform attention
    sd["blocks.0.attn.W_O"][0, :, U2] = torch.eye(8)
    sd["blocks.0.mlp.W_in"][U2, :] = 2 * torch.randn(8, 64, generator=g)
    sd["blocks.0.mlp.b_in"][:] = 0.2 * torch.randn(64, generator=g)
    sd["blocks.0.mlp.W_out"][:, V] = torch.randn(64, 16, generator=g) / 8
    sd["blocks.1.mlp.b_in"][:] = -1.0  # dead neurons ...
    # KEY in their linear part (pre-activations stay positive): mean-ablating their inputs
    # is then the same as mean-ablating them, and no Jensen gap blurs the test
    sd["blocks.1.mlp.b_in"][KEY] = 30.0
    sd["blocks.1.mlp.W_in"][V, KEY] = torch.randn(16, len(KEY), generator=g)
    sd["blocks.1.mlp.W_out"][KEY, Z] = torch.randn(len(KEY), 8, generator=g) / 4  # but KEY
    # the carriers' constant part (30 each) cancelled: Z holds only what varies by prompt
    sd["blocks.1.mlp.b_out"][:] = -30.0 * sd["blocks.1.mlp.W_out"][KEY].sum(0)
    sd["unembed.W_U"][Z, :] = 3 * torch.randn(8, d_vocab, generator=g)
    sd["unembed.W_U"][C, :] = 3.0  # logits well above 0, so that NL is well conditioned
    # the mask and IGNORE buffers keep their values
    for k, v in model.state_dict().items():
        if not k.endswith(("W_E", "W_pos", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out",
                           "W_U", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U")):
            sd[k] = v
    model.load_state_dict(sd)
    return model.eval()


def test_a_hand_built_circuit_is_found_by_the_paper_protocol_not_by_all_layers():
    model = _hand_built()
    tok = builtin_tokenizer()
    config = ScienceConfig(operators=("+",), operand_hi=12)
    table = build_prompts(tok, detect_number_tokens(tok, prepend_bos=True), config)
    # what the model answers is its "answer": the top token, which KEY's logits decide
    with torch.no_grad():
        table.answer = model(torch.from_numpy(table.token_matrix(np.arange(len(table)))))[
            :, -1].argmax(-1).numpy()
    assert len(np.unique(table.answer)) > 5  # it depends on the operands
    table.correct = np.ones(len(table), dtype=bool)
    prompts = table.op_index("+")[::2][:60]
    clean, cf = sample_pairs(table, "+", 30, seed=0)
    comps = component_effects(model, table, clean, cf, ("last",), "mean")
    assert comps.mlp_last("abs")[1] > 0  # layer 1's MLP matters at the last position
    score = np.random.default_rng(1).random((2, 64))
    score[1, KEY] += 10  # the ranking puts the carriers first
    cf_of = {int(p): int(c) for p, c in zip(prompts, prompts[::-1], strict=True)}
    setup = _setup(table, 64, prompts, [len(KEY)], cf_of)
    got = {}
    for protocol in ("paper", "all-layers"):
        plan = paper.plan(protocol, model, [0, 1], score, score, comps, late_from="1",
                             heads="auto", sign="abs")
        kind, context = ("grid", "all") if protocol == "paper" else ("valid", "prompt")
        pop = ablation.mean_population(tok, table, config, kind, 0, seed=0)
        replace = ablation.mean_replacement(ablation.position_means(model, pop, context))
        got[protocol] = paper.measure_curve(model, setup, "+", plan, replace, context,
                                               kind, "rank")
    by_paper, every = got["paper"], got["all-layers"]
    assert by_paper.plan.pruned == [1] and by_paper.plan.whole == [0]
    # auto keeps 3 of the 4 heads (50 x sqrt(4 / 1024)); the one that writes, by its effect
    assert by_paper.plan.heads.sum() == 3 and by_paper.plan.heads[0, 0]
    assert every.plan.pruned == [0, 1]
    for metric in faithfulness.METRICS:
        p, a = _point(by_paper, len(KEY), metric=metric), _point(every, len(KEY), metric=metric)
        # the paper's circuit: layer 0 whole, layer 1's carriers: the model, exactly
        assert p["ratio_of_means"] == pytest.approx(1.0, abs=1e-5), metric
        assert p["mean_ratio"] == pytest.approx(1.0, abs=1e-5), metric
        # the same 4 neurons per layer with layer 0 pruned: the answer is gone. The logit
        # difference is linear in layer 0's features here: within 0.11 of 0 for each of 6
        # weight seeds tried. NL and the log-probability are not (mean-ablated features can
        # land further from the model than the empty circuit): -0.52 to 0.17 over the seeds.
        if metric == "logit_diff":
            assert abs(a["ratio_of_means"]) < 0.2, a
        else:
            assert a["ratio_of_means"] < 0.5, (metric, a)
    # a random circuit of 7 late neurons (10% of 64, the first control level) misses them
    assert _point(by_paper, 7, "random")["ratio_of_means"] < 0.5


# ------------------------------------------------------------------ component effects


def test_exact_component_effects_equal_full_forwards_with_one_hook(trained):
    lm, prep = trained
    model, table = lm.model, prep.table
    clean, cf = sample_pairs(table, "+", 6, seed=3)
    got = component_effects(model, table, clean, cf, ("op2", "last"), "mean")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    answer, cf_answer = table.answer[clean], table.answer[cf]
    want = np.zeros((n_layers, n_heads + 1, 2, len(clean)))
    with torch.no_grad():
        for i, (p, q) in enumerate(zip(clean, cf, strict=True)):
            toks = torch.from_numpy(table.tokens[p][None])
            _, cf_cache = model.run_with_cache(torch.from_numpy(table.tokens[q][None]))
            base = model(toks)[0, -1].log_softmax(-1)
            for r, role in enumerate(("op2", "last")):
                at, cf_at = (table.role_pos[p, ROLES.index(role)],
                             table.role_pos[q, ROLES.index(role)])
                for layer in range(n_layers):
                    for c in range(n_heads + 1):
                        name = f"blocks.{layer}.attn.hook_z" if c < n_heads \
                            else f"blocks.{layer}.hook_mlp_out"

                        def patch(act, hook, _c=c, _name=name, _at=at, _cf_at=cf_at,
                                  _cache=cf_cache):
                            act = act.clone()
                            if _c < n_heads:
                                act[0, _at, _c] = _cache[_name][0, _cf_at, _c]
                            else:
                                act[0, _at] = _cache[_name][0, _cf_at]
                            return act
                        lp = model.run_with_hooks(toks, fwd_hooks=[(name, patch)])[0, -1] \
                            .log_softmax(-1)
                        want[layer, c, r, i] = effect_from_logprobs(
                            base[answer[i]], base[cf_answer[i]], lp[answer[i]],
                            lp[cf_answer[i]]).item()
    for r, role in enumerate(("op2", "last")):
        np.testing.assert_allclose(got.effect_exact[:, :, ROLES.index(role)],
                                   want[:, :, r].mean(-1), rtol=2e-3, atol=2e-4)
        assert got.is_exact[:, :, ROLES.index(role)].all()
    assert np.isnan(got.effect_exact[:, :, ROLES.index("op1")]).all()  # not run exactly
    assert np.isfinite(got.effect_attr).all()  # attribution covers every role
    assert np.abs(want).max() > 1e-2


def test_exact_patching_of_the_heads_attribution_ranks_first(trained):
    lm, prep = trained
    model, table = lm.model, prep.table
    clean, cf = sample_pairs(table, "-", 8, seed=4)
    every = component_effects(model, table, clean, cf, ("last",), "mean")
    some = component_effects(model, table, clean, cf, ("last",), "mean", exact_heads=2)
    r = ROLES.index("last")
    # every MLP layer and the two heads of largest |attribution| at the last position
    assert some.is_exact[:, -1, r].all()
    heads = some.is_exact[:, :-1, r]
    assert heads.sum() == 2
    attr = np.abs(component_effects(model, table, clean, cf, (), "mean").effect_log[:, :-1, r])
    assert attr[heads].min() >= attr[~heads].max()
    exact = some.is_exact[:, :, r]
    np.testing.assert_allclose(some.effect_exact[:, :, r][exact],
                               every.effect_exact[:, :, r][exact], rtol=1e-5, atol=1e-6)
    assert np.isnan(some.effect_exact[:, :-1, r][~heads]).all()
    # the others keep the attribution estimate
    np.testing.assert_allclose(some.effect_log[:, :-1, r][~heads], attr[~heads] *
                               np.sign(some.effect_log[:, :-1, r][~heads]), rtol=1e-6)


def test_role_positions_point_at_the_operands_and_the_operator(trained):
    lm, prep = trained
    table = prep.table
    vocab = {i: t for t, i in lm.tokenizer.get_vocab().items()}
    for p in (0, 37, len(table) - 1):
        toks = table.tokens[p]
        a, b, op = table.a[p], table.b[p], table.operators[int(table.op[p])]
        got = [vocab[int(toks[i])] for i in table.role_pos[p]]
        assert got == [str(a), op, str(b), "="]


# ------------------------------------------------------------------ knockouts


def test_knockouts_zero_the_right_neurons(trained):
    lm, prep = trained
    model, table = lm.model, prep.table
    prompts = table.op_index("+")
    none = np.zeros((model.cfg.n_layers, model.cfg.d_mlp), dtype=bool)
    base = knockouts.accuracy_with_zeroed(model, table, prompts, none)
    with torch.no_grad():
        pred = model(torch.from_numpy(table.token_matrix(prompts)))[:, -1].argmax(-1).numpy()
    assert np.array_equal(base, pred == table.answer[prompts])
    everything = ~none
    zeroed = knockouts.accuracy_with_zeroed(model, table, prompts, everything)
    assert (zeroed != base).any()  # zeroing every neuron changes some answers
    h = Heuristic("range", "op1", (0, 10))
    row = knockouts.heuristic_knockout(model, table, prompts, h, everything)
    assert row["n_associated"] == 10 * 20 and row["n_neurons"] == everything.sum()
    assert row["label"] == "op1 in [0, 10)"
    pk = knockouts.prompt_knockout(model, table, prompts[:30], [h], [everything], everything,
                                   n_per_layer=3, seed=0)
    assert pk["n_prompts"] == 30
    # prompts with op1 < 10 lose 3 neurons per layer, the others none
    expected = 3 * model.cfg.n_layers * (table.a[prompts[:30]] < 10).mean()
    assert pk["mean_neurons_zeroed"] == pytest.approx(expected)


def test_knockout_verdicts_by_hand():
    # 0.5 on 100 prompts against 0.9 on 100: SE of the difference 0.058, gap -0.4: agrees
    assert knockouts.verdict(0.5, 100, 0.9, 100) == "agrees"
    assert knockouts.verdict(0.9, 100, 0.5, 100) == "contradicts"
    assert knockouts.verdict(0.8, 10, 0.85, 10) == "inconclusive"  # within two SE
    assert knockouts.verdict(1.0, 5, 0.0, 5) == "contradicts"  # no variance: any gap counts
    assert knockouts.verdict(float("nan"), 0, 0.9, 10) == "inconclusive"


def test_one_tiny_denominator_cannot_move_the_headline_more_than_its_share():
    """The headline (ratio of means) moves by at most about one prompt's share when one
    prompt's denominator is 1e-4; the paper's mean of ratios follows that prompt."""
    rng = np.random.default_rng(5)
    n = 150
    model = 1.0 + 0.2 * rng.standard_normal(n)
    empty = 0.2 * rng.standard_normal(n)
    circuit = empty + 0.5 * (model - empty) + 0.05 * rng.standard_normal(n)
    boot = faithfulness.resamples(n + 1, 0)
    before = faithfulness.point_stats(circuit, empty, model, faithfulness.resamples(n, 0))
    # one more prompt: the model barely differs from the empty circuit, the circuit does
    after = faithfulness.point_stats(np.append(circuit, 0.2),
                                     np.append(empty, 0.0), np.append(model, 1e-4), boot)
    assert abs(after.mean_ratio - before.mean_ratio) > 1.0  # the fragile statistic jumps
    assert abs(after.ratio_of_means - before.ratio_of_means) <= 2.0 / (n + 1)
    assert after.n_small == 1 and before.n_small == 0


def test_the_conditioning_count_does_not_change_with_a_shift_of_the_number_logits():
    """Adding one constant to every number token's logit changes the normalised logit's
    denominators (NL is a ratio of logits) but not the logit difference's, which the
    warnings read; a common scale does not change the relative count either."""
    rng = np.random.default_rng(2)
    n, vocab, numbers = 150, 40, torch.arange(10, 40)
    answer = numbers[torch.as_tensor(rng.integers(0, 30, n))]
    cf = numbers[torch.as_tensor(rng.integers(0, 30, n))]
    base = torch.as_tensor(rng.standard_normal((n, vocab)))
    model_l = base.clone()
    model_l[torch.arange(n), answer] += 3.0 + torch.as_tensor(rng.standard_normal(n))
    empty_l = base + 0.3 * torch.as_tensor(rng.standard_normal((n, vocab)))

    def counts(shift: float, scale: float = 1.0) -> tuple[int, int]:
        out = []
        for mi in (0, 2):  # NL, logit difference
            m_, e_ = [], []
            for logits, acc in ((model_l, m_), (empty_l, e_)):
                x = logits.clone() * scale
                x[:, numbers] += shift
                acc.append(faithfulness.prompt_metrics(x, answer, cf)[:, mi])
            out.append(faithfulness.small_denominators(m_[0], e_[0]))
        return out[0], out[1]

    _, ld0 = counts(0.0)
    _, ld1 = counts(50.0)
    _, ld2 = counts(50.0, scale=3.0)
    assert 0 < ld0 < n and ld0 == ld1 == ld2


def test_a_curve_with_no_defined_ratio_is_empty_and_silent():
    """A checkpoint that answers no prompt (the model's metric equals the empty circuit's
    on every prompt, so no ratio is defined) gets no areas, and says so without a
    RuntimeWarning for each bootstrap resample (the worker's log filled with them)."""
    import warnings

    fa = faithfulness
    fractions = np.array([0.0, 0.5, 1.0])
    model = np.full(40, 2.0)
    empty = model.copy()  # every denominator m - e is 0
    circuits = np.random.default_rng(0).normal(size=(3, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = fa.area_stats(fractions, circuits, empty, model, fa.resamples(40, 0))
    assert out["mean_ratio"] == {"cpr": None, "cmd": None, "cpr_se": None, "cmd_se": None}
    assert out["ratio_of_means"]["cpr"] is None


def test_the_clip_scale_is_the_median_of_the_nonzero_denominators():
    """The vectorised scale (sorted, zeros last) equals numpy's nanmedian over the nonzero
    |denominators|, 0 where every one is 0, on every shape the bootstrap gives it."""
    import warnings

    rng = np.random.default_rng(5)
    for shape in [(7, 200), (200,), (3, 5, 11), (4, 1), (2, 0)]:
        for _ in range(50):
            d = rng.normal(size=shape) * (rng.random(shape) < rng.random())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = np.nanmedian(np.where(d != 0, np.abs(d), np.nan), axis=-1,
                                    keepdims=True)
            got = faithfulness._scale(d)
            np.testing.assert_allclose(got, np.nan_to_num(want, nan=0.0), rtol=1e-12)


def test_a_majority_of_zero_denominators_leaves_the_headline_defined():
    """NL is 1 on the model and on the empty circuit wherever both put the answer on top:
    a denominator of exactly 0. When most prompts are such, the clip's scale comes from the
    prompts that carry a ratio, so the headline equals the plain ratio of means where no
    prompt is extreme (it was undefined: a limit of 0 clipped every term to 0)."""
    rng = np.random.default_rng(3)
    n, zero = 120, 80
    model = np.ones(n)
    empty = np.ones(n)
    empty[zero:] = rng.uniform(0.3, 0.6, n - zero)
    circuit = empty + 0.7 * (model - empty) + rng.normal(0, 0.01, n) * (model != empty)
    got = faithfulness.point_stats(circuit, empty, model, faithfulness.resamples(n, 0))
    plain = (circuit - empty).mean() / (model - empty).mean()
    assert got.ratio_of_means == pytest.approx(plain, rel=1e-12)
    assert got.ratio_of_means == pytest.approx(0.7, abs=0.02)
    assert got.n_clipped == 0 and got.ratio_of_means_se is not None
    assert math.isfinite(got.ratio_of_means_se) and 0 < got.influence_bound < 1


@pytest.mark.parametrize("kind", ["circuit value of 10", "NL denominator near 0"])
def test_one_prompt_moves_the_headline_by_no_more_than_its_stated_bound(kind):
    """Whatever one prompt's circuit value or its NL denominator, the headline (the ratio
    of means, each prompt's terms clipped to three median denominators) moves by no more
    than its stated bound, and the conditioning the report reads fires. Unclipped, the
    same prompt moves it by far more (the control that the case is a hard one)."""
    from reports.circuits import warnings

    rng = np.random.default_rng(8)
    n, vocab = 150, 30
    answer = torch.as_tensor(rng.integers(10, 30, n + 1))
    cf = torch.as_tensor(rng.integers(10, 30, n + 1))
    runs = {}
    for name, boost in (("model", 6.0), ("circuit", 4.0), ("empty", 0.5)):
        x = torch.as_tensor(rng.standard_normal((n + 1, vocab))) + 20.0
        x[torch.arange(n + 1), answer] += boost
        runs[name] = x
    if kind == "NL denominator near 0":  # the circuit's largest number logit near 0
        runs["circuit"][n] -= runs["circuit"][n].max() - 1e-3
        runs["circuit"][n, answer[n]] = 1e-3 - 2.0
    nl = {k: faithfulness.prompt_metrics(v, answer, cf)[:, 0].copy() for k, v in runs.items()}
    if kind == "circuit value of 10":
        nl["circuit"][n] = 10.0
    boot = faithfulness.resamples(n + 1, 0)
    typical = faithfulness.point_stats(nl["circuit"][:n], nl["empty"][:n], nl["model"][:n],
                                       faithfulness.resamples(n, 0))
    got = faithfulness.point_stats(nl["circuit"], nl["empty"], nl["model"], boot)
    moved = abs(got.ratio_of_means - typical.ratio_of_means)
    assert moved <= got.influence_bound < 0.15, (moved, got.influence_bound)
    assert got.n_clipped >= 1 and typical.n_clipped == 0
    assert got.max_influence >= moved * 0.5
    # unclipped, the ratio of means follows the one prompt
    num = nl["circuit"] - nl["empty"]
    raw = num.mean() / (nl["model"] - nl["empty"]).mean()
    assert abs(raw - typical.ratio_of_means) > 3 * got.influence_bound
    # the report's warnings read the point's conditioning
    point = {"k": 1, "n": got.n, **got.as_dict(), "metric": "nl", "circuit": "ranked",
             "mib": False}

    class Data:
        def curve(self, op, protocol, circuit, metric):
            return [point] if (circuit, metric) == ("ranked", "nl") else []

    said = warnings(Data(), {"op": "+", "protocol": "paper", "n_prompts": n + 1,
                             "baselines": {}, "areas": {}})
    assert any("clipped" in w and "at most" in w for w in said), said


def test_bootstrap_curves_in_one_reduction_equal_one_call_per_resample():
    """Issue 79: the areas' bootstrap curves are taken for all resamples at once; each
    equals the per-resample loop they replaced, to the bit, with undefined ratios (zero
    denominators), NaN metrics and prompts repeated by the resampling."""
    fa = faithfulness
    rng = np.random.default_rng(11)
    for n, levels in [(40, 3), (257, 9), (5, 1)]:
        model = rng.normal(size=n) * 3
        empty = np.where(rng.random(n) < 0.2, model, rng.normal(size=n))
        circuits = rng.normal(size=(levels, n)) * 2
        circuits[0, rng.random(n) < 0.05] = np.nan  # level 0's means are NaN
        boot = fa.resamples(n, 3)
        r = fa._ratios(circuits, empty[None], model[None])
        loop_means = np.stack([fa.nan_mean(r[:, b], axis=1) for b in boot])
        loop_rom = np.stack([fa._rom(circuits[:, b], empty[None, b], model[None, b])
                             for b in boot])
        np.testing.assert_array_equal(fa._boot_means(r, boot), loop_means)
        np.testing.assert_array_equal(fa._boot_rom(circuits, empty, model, boot), loop_rom)
        assert np.isfinite(loop_means).any() and np.isfinite(loop_rom).any()
