"""Wrong answers (issue 83; catalog.explain.wrong_answers): which heuristics push what a
model writes where it is wrong, against the labels placed at random, and whether two runs
fail on the same prompts beyond what each run's difficulty predicts.

The hand-built model of tests/unit/test_explain.py answers every "a + b" on [0, 10) right;
two planted neurons make it write 16 for 7 + 8 and 8 for 3 + 4, each labelled "result =
<what it writes>". Those labels hold for the written value and not the true result, and
they must carry T_w beyond their placements at random; with the two neurons unlabelled,
the written value's labels carry nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_explain import SIDE, VOTE, VOTE_SIZE, hand_model, planted_neurons

from catalog.builtin import builtin_tokenizer
from catalog.config import ScienceConfig
from catalog.explain.holds import Label
from catalog.explain.wrong_answers import (
    SPLIT,
    result_strata,
    shared_failures,
    written,
    wrong_split,
)
from catalog.labels.heuristics import Heuristic

BAD = [(7, 8, 16), (3, 4, 8)]  # (op1, op2, what the model writes)


@pytest.fixture(scope="module")
def misled():
    planted = planted_neurons()
    bad = [(Heuristic("value", "result", (w,)), [a], [b], [w]) for a, b, w in BAD]
    model, planted = hand_model(planted=planted + bad)
    first_bad = len(planted) - len(bad)
    with torch.no_grad():  # three votes' worth: more than the two the true answer has over it
        for k, (_, _, w) in enumerate(BAD):
            model.blocks[0].mlp.W_out[first_bad + k, VOTE + w] = 3 * VOTE_SIZE
    config = ScienceConfig(operators=("+",), operand_hi=SIDE, shots=0, seed=0)
    labels = {(0, k): [Label(h)] for k, (h, *_r) in enumerate(planted)}
    return model, config, labels, first_bad


def test_the_model_writes_the_planted_wrong_answers(misled):
    model, config, _, _ = misled
    got = written(model, builtin_tokenizer(), config, "+")
    assert len(got.a) == SIDE * SIDE
    wrong = {(int(a), int(b), int(v)) for a, b, v in
             zip(got.a[got.wrong], got.b[got.wrong], got.value[got.wrong], strict=True)}
    assert wrong == set(BAD)
    right = ~got.wrong
    assert np.array_equal(got.value[right], got.result[right])


def test_labels_that_hold_for_the_written_value_carry_it_beyond_their_placements(misled):
    model, config, labels, first_bad = misled
    got = written(model, builtin_tokenizer(), config, "+")
    out = wrong_split(model, got, labels, placements=12)
    assert out["wrong"] == 2 and out["split_over"] == 2
    shares = out["shares"]
    assert sum(shares[k] for k in SPLIT) == pytest.approx(1.0, abs=1e-9)
    only_w = out["against_placements"][SPLIT[0]]
    assert shares[SPLIT[0]] > 0.5, shares
    assert only_w["adds"]["ci"][0] > 0 and only_w["verdict"] == "adds", only_w
    # the true result's residue neurons hold for the true result only, and push away
    assert shares[SPLIT[1]] < 0

    # the same model with the two planted neurons unlabelled: nothing holds for the
    # written value alone, and the figure does not say "adds"
    unlabelled = {k: v for k, v in labels.items() if k[1] < first_bad}
    out = wrong_split(model, got, unlabelled, placements=12)
    assert out["shares"][SPLIT[0]] == pytest.approx(0.0, abs=1e-12)
    assert out["against_placements"][SPLIT[0]]["verdict"] != "adds"


def test_shared_failures_against_each_runs_difficulty():
    # 40 prompts in two strata; run i fails 10 of the hard half, run j fails 5 of the
    # hard half, 4 of them shared with i
    strata = np.repeat([0, 1], 20)
    wrong_i, wrong_j = np.zeros(40, bool), np.zeros(40, bool)
    wrong_i[20:30] = True
    wrong_j[26:31] = True  # 26..29 shared (4), 30 not
    top_i = np.arange(40)
    top_j = np.where(np.arange(40) < 28, np.arange(40), -1)  # same token on 26, 27
    got = shared_failures(wrong_i, wrong_j, strata, top_i, top_j)
    assert got["shared"] == 4 and got["wrong_i"] == 10 and got["wrong_j"] == 5
    assert got["given_i"] == pytest.approx(0.4)
    assert got["base_j"] == pytest.approx(5 / 40)
    # independent runs would share 10 * 5/20 = 2.5 in the hard stratum, 0 in the easy one
    assert got["expected_shared_by_stratum"] == pytest.approx(2.5)
    assert got["shared_over_expected"] == pytest.approx(4 / 2.5)
    assert got["same_wrong_token"] == 2
    lo, hi = got["given_i_ci"]
    assert lo < 0.4 < hi


def test_result_strata_are_quantiles_that_keep_equal_results_together():
    r = np.array([5, 1, 9, 3, 7, 2, 8, 0, 6, 4])
    assert np.array_equal(result_strata(r, bins=5), r // 2)
    tied = np.array([0] * 6 + [1, 2, 3, 4])
    got = result_strata(tied, bins=5)
    assert len(set(got[:6])) == 1 and got[0] < got[6] <= got[-1]
