"""Does the label matter? The controls of catalog.explain.controls and .shares can come out
against the bag of heuristics, and do when the labels mean nothing.

A hand-built model (tests/unit/test_explain.py) whose answer is carried by four firing
neurons of 49 planted ones: the op1 and op2 value neurons and the residue neurons. Only
the op1, op2 and mod-2 neurons are labelled; the 25 mod-5 neurons, one of which fires on
every prompt and carries a quarter of the answer, are strong UNLABELLED neurons beside
them. With the true labels, what the label adds (knockout and share of T, ranked by
direct term, by total effect, and drawn as the paper draws) is positive with its
interval above 0; with the same labels placed on random neurons (same counts), it is
within its interval of 0 in every figure: the control that can refute the first test.
A planted bottom-side neuron: "holds" is right on every prompt; a neuron labelled with a
set and its complement on one side gets a note, and never holds for both.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_explain import N_DISTRACT, SIDE, hand_model, planted_neurons

from catalog.builtin import builtin_tokenizer
from catalog.config import ScienceConfig
from catalog.explain.controls import MATCHED
from catalog.explain.decompose import decompose_batch
from catalog.explain.grid import explain_prompts, summarize_prompts
from catalog.explain.holds import Label, complement_pairs, holds
from catalog.explain.prompt import build_many, explain
from catalog.labels.heuristics import Heuristic
from catalog.measuring.lens import lens_at

EVERY = list(range(SIDE))
LABELLED = 24  # planted neurons 0-23: op1 values, op2 values, the four mod-2 neurons
BOTTOM = Heuristic("modulo", "op1", (2, 1))  # the extra neuron is LOW on "op1 odd"


def grid():
    side = np.arange(SIDE)
    return tuple(g.ravel() for g in np.meshgrid(side, side, indexing="ij"))


def typical_of_model(model, config) -> tuple[dict, dict]:
    """Each neuron's mean activation and mean KV value over the grid (what the catalog
    stores as mean_act and mean_kv)."""
    a, b = grid()
    prompts = build_many(model, builtin_tokenizer(), "+", a, b, config)
    answers = np.array([p.answer for p in prompts])
    dec = decompose_batch(model, np.stack([p.tokens for p in prompts]), answers,
                          np.unique(answers))
    act = dec.activations[:, 0]  # (P, d_mlp)
    kv = act * lens_at(model, 0, answers).T
    return ({(0, n): float(v) for n, v in enumerate(act.mean(0))},
            {(0, n): float(v) for n, v in enumerate(kv.mean(0))})


@pytest.fixture(scope="module")
def bag():
    planted = planted_neurons() + [(BOTTOM, [x for x in EVERY if x % 2 == 0], EVERY, [])]
    model, planted = hand_model(planted=planted)
    model = model.to(torch.float64)
    config = ScienceConfig(operators=("+",), operand_hi=SIDE, shots=0, seed=0)
    typical, typical_kv = typical_of_model(model, config)
    true = {(0, k): [Label(h)] for k, (h, *_r) in enumerate(planted[:LABELLED])}
    return model, planted, config, true, typical, typical_kv


def reassigned(labels: dict, width: int, seed: int) -> dict:
    """The same label lists on random neurons of the layer (same count)."""
    rng = np.random.default_rng(seed)
    where = rng.choice(width, len(labels), replace=False)
    return {(0, int(n)): xs for n, xs in zip(where, labels.values(), strict=True)}


def figures(bag, labels, model=None) -> dict:
    base, planted, config, _, typical, typical_kv = bag
    model = model if model is not None else base
    a, b = grid()
    terms = explain_prompts(model, builtin_tokenizer(), config, "+", a, b, labels,
                            typical=typical, typical_kv=typical_kv, draws=4,
                            top_set=np.ones((1, len(planted) + N_DISTRACT), dtype=bool))
    return summarize_prompts(terms, [0])


def every_figure(s: dict):
    """(name, {mean, se, ci, n, null_mean, null_sd, adds, verdict}) of every "what the
    label adds" figure."""
    for ranking, by in s["knockouts"].items():
        for control in MATCHED:
            yield f"knockout by {ranking} vs {control}", by["label_adds"][control]
    for ranking, by in s["share_adds"].items():
        for control in MATCHED:
            yield f"share of T ({ranking}) vs {control}", by[control]


def test_the_true_labels_add_to_every_figure(bag):
    s = figures(bag, bag[3])
    seen = 0
    for name, stat in every_figure(s):
        assert stat["n"] >= 90, name
        assert stat["adds"]["ci"][0] > 0 and stat["verdict"] == "adds", (name, stat)
        assert stat["placements"] == 8
        seen += 1
    assert seen == 3 * 2 + 2 * 2
    # the knockout breaks the answer; the unlabelled control (which may hold the firing
    # mod-5 neuron) mostly does not
    direct = s["knockouts"]["direct"]["sets"]
    assert direct["knockout"]["top"]["mean"] < 0.3
    assert direct["unlabelled"]["top"]["mean"] > 0.6
    # the same ranking with labels ignored does at least as much as the knockout
    assert direct["same ranking"]["p"]["mean"] <= direct["knockout"]["p"]["mean"] + 1e-9


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_labels_placed_at_random_add_nothing_in_any_figure(bag, seed):
    model, planted, *_ = bag
    s = figures(bag, reassigned(bag[3], len(planted) + N_DISTRACT, seed))
    for name, stat in every_figure(s):
        assert stat["n"] == 100 and stat["placements"] == 8, (name, stat)
        lo, hi = stat["adds"]["ci"]
        assert lo <= 0 <= hi and stat["verdict"] == "nil", (name, stat)


def test_one_prompts_knockout_names_what_the_label_adds(bag):
    model, planted, config, true, typical, typical_kv = bag
    for text in ("2+7=", "9+9=", "4+5="):
        e = explain(model, builtin_tokenizer(), text, config, labels=true, typical=typical,
                    typical_kv=typical_kv, seeds=6)
        ko = e.knockout
        assert ko is not None and set(ko.controls) == {"unlabelled", "not holding",
                                                       "same ranking", "random"}
        assert all(len(ko.controls[c].p) == 6 for c in ("unlabelled", "not holding", "random"))
        assert ko.label_adds["unlabelled"] > 0.3 and ko.label_adds["not holding"] > 0.3
        assert e.share_adds["direct"]["unlabelled"] > 0.3
        d = e.to_dict()["knockout"]
        assert d["label_adds"] == ko.label_adds and d["controls"]["unlabelled"]["p"]


def test_a_bottom_side_label_holds_exactly_where_the_neuron_is_low(bag):
    model, planted, config, _, typical, typical_kv = bag
    n = len(planted) - 1  # the extra neuron: fires (0.5) where op1 is even
    label = Label(BOTTOM, bottom=True)
    a, b = grid()
    prompts = build_many(model, builtin_tokenizer(), "+", a, b, config)
    answers = np.array([p.answer for p in prompts])
    dec = decompose_batch(model, np.stack([p.tokens for p in prompts]), answers,
                          np.unique(answers))
    got = holds(label, a, b, a + b, dec.activations[:, 0, n], lens_at(model, 0, answers)[n],
                typical[(0, n)], typical_kv[(0, n)])
    assert np.array_equal(got, a % 2 == 1)
    # the same set on the top side holds nowhere (the neuron is never high on it)
    top = holds(Label(BOTTOM), a, b, a + b, dec.activations[:, 0, n],
                lens_at(model, 0, answers)[n], typical[(0, n)], typical_kv[(0, n)])
    assert not top.any()
    # the grid's own "holds" (explain_prompts, with the catalog's means) is the same
    terms = explain_prompts(model, builtin_tokenizer(), config, "+", a, b, {(0, n): [label]},
                            typical=typical, typical_kv=typical_kv, knockouts=False)
    assert np.array_equal(terms.n_holding, (a % 2 == 1).astype(int))


def test_a_set_and_its_complement_on_one_side_get_a_note_and_never_both_hold(bag):
    model, planted, config, true, typical, typical_kv = bag
    even, odd = Heuristic("modulo", "op2", (2, 0)), Heuristic("modulo", "op2", (2, 1))
    a, b = grid()
    pairs = complement_pairs([Label(even), Label(odd), Label(BOTTOM)], a, b, a + b)
    assert [(x.heuristic, y.heuristic) for x, y in pairs] == [(even, odd)]
    assert complement_pairs([Label(even), Label(odd, bottom=True)], a, b, a + b) == []
    labels = dict(true)
    k = 10 + 7  # the "op2 = 7" neuron, which fires on every prompt with op2 = 7
    labels[(0, k)] = [Label(even), Label(odd)] + labels[(0, k)]
    for text in ("2+7=", "3+7=", "0+7="):
        e = explain(model, builtin_tokenizer(), text, config, labels=labels, typical=typical,
                    typical_kv=typical_kv, seeds=0)
        rows = [r for r in e.toward if (r.layer, r.neuron) == (0, k)]
        assert rows and any("complement" in note for note in rows[0].notes)
        held = {x.label for x in rows[0].labels if x.holds}
        assert held == {odd.label, "op2 = 7"}
        assert all(not ({even.label, odd.label} <= {x.label for x in r.labels if x.holds})
                   for r in e.toward + e.away)


def louder_residues(model):
    """The bag with its four mod-2 result neurons writing three times as loud: one
    heuristic's neurons can then move the answer (in the plain bag none can: every answer
    needs all four votes), so steering has something to find."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.blocks[0].mlp.W_out[20:24] *= 3.0
    return model


def test_steering_a_result_heuristic_moves_the_answer_above_its_control(bag):
    model = louder_residues(bag[0])
    got = figures(bag, bag[3], model)["steering"]
    into = got["modulo"]["into"]
    assert into["heuristics"] == 2 and into["prompts"] == 100  # 50 + 50 prompts
    assert into["rate"] > 0.5 and into["control_rate"] < 0.1
    assert into["difference_ci"][0] > 0.3 and into["verdict"] == "moves"
    # the labels placed at random: their "result even / odd" neurons move the answer no
    # more often than random unlabelled ones (which may draw the loud residue neurons,
    # now unlabelled, and then move it more often)
    seen = 0
    for seed in (1, 2, 3):
        null = figures(bag, reassigned(bag[3], len(bag[1]) + N_DISTRACT, seed), model)
        for family, by in null["steering"].items():
            for direction, row in by.items():
                assert row["difference_ci"][0] <= 0 and row["verdict"] != "moves", \
                    (seed, family, direction, row)
                seen += 1
    assert seen >= 6


def test_a_top_set_bounds_the_random_control_only(bag):
    """explain()'s top_set (the catalog's top neurons, the paper's pool) is where the
    random control draws from; the knockout and the matched controls still come from
    every neuron (a top set without the neurons that hold left the Prompt page with no
    knockout)."""
    model, planted, config, true, typical, typical_kv = bag
    width = len(planted) + N_DISTRACT
    top = np.zeros((1, width), dtype=bool)
    top[0, width - 5:] = True  # five distractors: none of them holds
    e = explain(model, builtin_tokenizer(), "2+7=", config, labels=true, typical=typical,
                typical_kv=typical_kv, seeds=4, top_set=top)
    ko = e.knockout
    assert ko is not None and ko.neurons and all(n < LABELLED for _, n in ko.neurons)
    assert len(ko.controls["random"].p) == 4
    # the random control's draws are all inside the top set
    from catalog.explain.controls import knockout_masks
    from catalog.explain.holds import member_kinds
    rng = np.random.default_rng(0)
    member = member_kinds(true, (1, width), np.array([2]), np.array([7]), np.array([9]))
    lab = np.zeros((1, width), dtype=bool)
    lab[0, :LABELLED] = True
    bits = np.full((1, 1, width), 15, dtype=np.int8)
    masks = knockout_masks(rng.random((1, 1, width)), lab, member, bits, 10, 4, rng,
                           random_pool=top)
    assert masks["knockout"][0].any()
    assert all((m & ~top[None]).sum() == 0 and m.any() for m in masks["random"])


def test_the_sorted_top_mask_equals_the_stable_order():
    """``top_mask`` (each row's last kept value found by a plain sort) keeps exactly the
    neurons the stable order keeps: the largest scores of the pool, ties by index, with
    ties at the cut, infinite scores, rows whose pool is smaller than the count, counts
    per row or one for all, float32 and float64; NaN scores take the stable order."""
    from catalog.explain.controls import _top_mask_by_order, top_mask

    rng = np.random.default_rng(5)
    shape = (40, 3, 64)
    for trial in range(60):
        score = rng.standard_normal(shape).astype(np.float32 if trial % 2 else np.float64)
        if trial % 3 == 0:
            score = np.round(score * 2)  # many ties, at the cut too
        if trial % 5 == 0:
            score[0, 0, :5], score[1, 1, 3:9] = -np.inf, np.inf
        pool = rng.random(shape) < rng.random()
        counts = rng.integers(0, 12, shape[:2]) if trial % 2 else int(rng.integers(0, 80))
        want = _top_mask_by_order(np.where(pool, -score, np.inf), pool, counts)
        got = top_mask(score, pool, counts)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got.sum(-1), np.minimum(
            np.broadcast_to(counts, shape[:2]), pool.sum(-1)))
    score[2, 1, 7] = np.nan
    np.testing.assert_array_equal(top_mask(score, pool, 4), _top_mask_by_order(
        np.where(pool, -score, np.inf), pool, 4))
