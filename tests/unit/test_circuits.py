"""Faithfulness and knockouts: formulas on hand numbers, and their limits on a real model."""

import numpy as np
import pytest
import torch

from catalog import circuits
from catalog.config import MeasureConfig
from catalog.heuristics import Heuristic
from catalog.run import CheckpointRun
from catalog.sources import load_model


def test_normalized_logit_and_faithfulness_by_hand():
    logits = torch.tensor([[1.0, 4.0, 2.0], [3.0, -1.0, 6.0]])
    nl = circuits.normalized_logit(logits, torch.tensor([2, 0]))
    assert nl.tolist() == [0.5, 0.5]
    # per prompt: (0.5 - 0) / (1 - 0) = 0.5 and (1 - 0.5) / (1 - 0.5) = 1; mean 0.75
    assert circuits.faithfulness([0.5, 1.0], [0.0, 0.5], [1.0, 1.0]) == pytest.approx(0.75)
    # a prompt whose model and empty NL coincide carries no information
    assert circuits.faithfulness([0.3, 0.2], [0.2, 0.5], [1.2, 0.5]) == pytest.approx(0.1)


def test_circuit_sizes_and_top_k_mask():
    assert circuits.circuit_sizes(512, (0.01, 0.02, 0.05)) == [6, 11, 26]
    assert circuits.circuit_sizes(10, (0.01, 0.05)) == [1]
    mask = circuits.top_k_mask(np.array([[0.1, 0.5, 0.3], [2.0, -1.0, 0.0]]), 2)
    assert mask.tolist() == [[False, True, True], [True, False, True]]


@pytest.fixture(scope="module")
def trained(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    prep = CheckpointRun(lm.model, lm.tokenizer,
                         MeasureConfig(operators=("+", "-"), operand_hi=20)).prepare()
    prep.table.correct[:] = True
    return lm, prep


def test_full_circuit_is_fully_faithful_and_empty_is_zero(trained):
    lm, prep = trained
    n_layers, d_mlp = lm.model.cfg.n_layers, lm.model.cfg.d_mlp
    effect = np.random.default_rng(0).standard_normal((n_layers, d_mlp))
    means = circuits.position_means(lm.model, prep.table)
    prompts = prep.table.op_index("+")[:50]
    curve = dict(circuits.faithfulness_curve(lm.model, prep.table, prompts, effect,
                                             [d_mlp, 8], means))
    assert curve[d_mlp] == pytest.approx(1.0, abs=1e-6)
    assert np.isfinite(curve[8])


def test_position_means_equal_a_direct_average(trained):
    lm, prep = trained
    means = circuits.position_means(lm.model, prep.table, batch_size=64)
    (length, idx), = prep.table.buckets().items()
    _, cache = lm.model.run_with_cache(torch.from_numpy(prep.table.token_matrix(idx)))
    direct = cache["blocks.1.mlp.hook_post"].mean(0)
    torch.testing.assert_close(means[length][1], direct, rtol=1e-5, atol=1e-6)


def test_knockouts_zero_the_right_neurons(trained):
    lm, prep = trained
    model, table = lm.model, prep.table
    prompts = table.op_index("+")
    none = np.zeros((model.cfg.n_layers, model.cfg.d_mlp), dtype=bool)
    base = circuits.accuracy_with_zeroed(model, table, prompts, none)
    pred = model(torch.from_numpy(table.token_matrix(prompts)))[:, -1].argmax(-1).numpy()
    assert np.array_equal(base, pred == table.answer[prompts])
    everything = ~none
    zeroed = circuits.accuracy_with_zeroed(model, table, prompts, everything)
    assert (zeroed != base).any()  # zeroing every neuron changes some answers
    h = Heuristic("range", "op1", (0, 10))
    row = circuits.heuristic_knockout(model, table, prompts, h, everything)
    assert row["n_associated"] == 10 * 20 and row["n_neurons"] == everything.sum()
    assert row["label"] == "op1 in [0, 10)"
    pk = circuits.prompt_knockout(model, table, prompts[:30], [h], [everything], everything,
                                  n_per_layer=3, seed=0)
    assert pk["n_prompts"] == 30
    # prompts with op1 < 10 lose 3 neurons per layer, the others none
    expected = 3 * model.cfg.n_layers * (table.a[prompts[:30]] < 10).mean()
    assert pk["mean_neurons_zeroed"] == pytest.approx(expected)
