"""Training dynamics with planted checkpoints (catalog.circuits.final, catalog.core.dynamics).

The checkpoints are made from a trained tiny built-in model, so what changes from one
"step" to the next is known exactly:
- the final circuit: before the planted step, the last layer's neurons are permuted (the
  model computes the same function, every answer is the same, but the neurons the final
  checkpoint ranks first sit elsewhere): the final circuit is no better than its random
  control there, and equal to the checkpoint's own circuit after it;
- births: the last layer's neurons labelled with one family are switched off (made
  constant) before one step and those of another family before a later step: the birth
  steps come out at those steps, in that order, through the whole pipeline (labels,
  enrichment, the birth rule).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from catalog.circuits.final import FinalCircuit
from catalog.config import ScienceConfig
from catalog.core.dynamics import birth_step, seed_orders, sign_test
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model

# labels of the rule before 0.10.0 (result_beyond_operands off): these tests are of the
# births and the summary's shares, not of the label rule, and the tiny model's last layer
# keeps 6 labelled neurons for `+` under catalog 0.11.0 (most of its result labels are
# parity, a tie with |op1 - op2|, or follow max / min), fewer than the 16 the birth test
# needs to tell a group from 0
CONFIG = ScienceConfig(operators=("+",), operand_hi=20, faithfulness_prompts=40,
                       faithfulness_seeds=2, spectra=False, result_beyond_operands=False)


@pytest.fixture(scope="module")
def final(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", cfg.steps, builtin_config=cfg, cache_root=root)
    run = CheckpointRun(lm.model, lm.tokenizer, CONFIG).prepare()
    out = run.run_all(keep=True, run_knockouts=False)
    return lm, out


def _permuted(model, layer: int, order: np.ndarray):
    """The same function with ``layer``'s MLP neurons in another order."""
    m = copy.deepcopy(model)
    mlp = m.blocks[layer].mlp
    idx = torch.as_tensor(order)
    with torch.no_grad():
        mlp.W_in.copy_(mlp.W_in[:, idx])
        mlp.b_in.copy_(mlp.b_in[idx])
        mlp.W_out.copy_(mlp.W_out[idx, :])
    return m


def _switched_off(model, layer: int, neurons: list[int]):
    m = copy.deepcopy(model)
    mlp = m.blocks[layer].mlp
    with torch.no_grad():
        mlp.W_in[:, neurons] = 0.0
        mlp.b_in[neurons] = -1.0  # a constant 0 after the activation: never labelled
        mlp.W_out[neurons, :] = 0.0
    return m


def _point(curves, circuit: str, k: int) -> dict:
    pt, = [p for c in curves for p in c.points
           if p["circuit"] == circuit and p["k"] == k and p["metric"] == "nl"]
    return pt


def test_the_final_circuit_is_faithful_only_after_its_neurons_are_in_place(final):
    lm, out = final
    model, summary = lm.model, out.summary
    fin = FinalCircuit.from_curves(summary.curves, 300)
    plan = fin.plans["+"]
    last = model.cfg.n_layers - 1
    assert plan.pruned and last in plan.pruned
    order = np.random.default_rng(5).permutation(model.cfg.d_mlp)
    checkpoints = {100: _permuted(model, last, order), 200: _permuted(model, last, order),
                   250: model, 300: model}  # planted: the final neurons are in place at 250
    # the control's size nearest 10% of the layer: where the ranking matters most
    sizes = sorted({p["k"] for c in summary.curves for p in c.points if p["circuit"] == "random"})
    k = min(sizes, key=lambda x: abs(x - 0.1 * model.cfg.d_mlp))
    got = {}
    for step, m in checkpoints.items():
        run = CheckpointRun(m, lm.tokenizer, CONFIG).prepare()
        curves = run.final_curves(fin)
        assert {c.protocol for c in curves} == {"final"}
        assert {p["circuit"] for c in curves for p in c.points} == {"ranked", "random"}
        got[step] = (_point(curves, "ranked", k), _point(curves, "random", k))
    own = [p for c in summary.curves if c.protocol == "paper" for p in c.points
           if p["circuit"] == "ranked" and p["k"] == k and p["metric"] == "nl"][0]
    for step in (250, 300):  # in place: the final circuit is this checkpoint's own circuit
        ranked, rand = got[step]
        assert ranked["ratio_of_means"] == pytest.approx(own["ratio_of_means"], abs=1e-6)
        assert ranked["ratio_of_means"] > rand["ratio_of_means"] + 2 * max(
            rand["ratio_of_means_se"], ranked["ratio_of_means_se"])
    for step in (100, 200):  # elsewhere: the final neurons are random neurons here
        ranked, rand = got[step]
        assert abs(ranked["ratio_of_means"] - rand["ratio_of_means"]) < \
            3 * np.hypot(ranked["ratio_of_means_se"], rand["ratio_of_means_se"]) + 0.05
        assert ranked["ratio_of_means"] < got[300][0]["ratio_of_means"] - 0.1
    # measured in a summary, the final circuit gives the same numbers as alone
    run = CheckpointRun(checkpoints[100], lm.tokenizer, CONFIG).prepare()
    digests = run.run_all(summary=False).digests
    inside = run.summarize_digests(digests, run_knockouts=False, final=fin)
    assert inside.final_step == 300
    assert _point(inside.final_curves, "ranked", k) == got[100][0]


def test_a_final_circuit_of_another_shape_is_refused(final):
    lm, out = final
    fin = FinalCircuit.from_curves(out.summary.curves, 300)
    plan = fin.plans["+"]
    plan2 = copy.copy(plan)
    plan2.score = plan.score[:, :10]
    with pytest.raises(ValueError, match="this model has"):
        FinalCircuit(300, {"+": plan2}).check(lm.model.cfg.n_layers, lm.model.cfg.n_heads,
                                              lm.model.cfg.d_mlp)


def _labelled(result, o: int = 0) -> set[int]:
    m = result.matches
    return {int(n) for n in m.neuron[m.implements & (m.op == o)]}


def test_planted_births_come_out_at_their_steps_in_order(final):
    """Two groups of the last layer's labelled neurons (the model's own heuristics, each
    group its own neurons) are switched on at two planted steps: every neuron gets its
    label back when it is on and none while it is off, and the birth rule, run on the
    labelled shares the summary reports, finds each group's step, in order."""
    lm, out = final
    last, width = lm.model.cfg.n_layers - 1, lm.model.cfg.d_mlp
    labelled = sorted(_labelled(out.results[last]))
    assert len(labelled) >= 16, labelled  # 8 of 64 is the least the rule can tell from 0
    groups = {"early": set(labelled[:len(labelled) // 2]),
              "late": set(labelled[len(labelled) // 2:])}
    born = {"early": 4, "late": 16}
    series: dict[str, list] = {g: [] for g in groups}
    for step in (0, 1, 2, 4, 8, 16, 32):
        off = sorted(n for g, ns in groups.items() if step < born[g] for n in ns)
        m = _switched_off(lm.model, last, off) if off else lm.model
        run = CheckpointRun(m, lm.tokenizer, CONFIG, layers=[last]).prepare()
        got = run.run_all(keep=True, run_knockouts=False)
        now = _labelled(got.results[last])
        assert now == set(labelled) - set(off), step
        any_row, = [r for r in got.summary.enrichment
                    if r["layer"] == "all" and r["op"] == "+" and r["family"] == "any"]
        assert (any_row["labelled_layer"], any_row["n_layer"]) == (len(now), width)
        for g, ns in groups.items():
            series[g].append((step, len(now & ns), width))
    births = {g: birth_step(s) for g, s in series.items()}
    assert births == born
    order, = seed_orders({0: births})
    assert (order.first, order.second, order.before, order.after) == ("early", "late", 1, 0)


def test_the_birth_rule_by_hand():
    n = 500
    # a share that rises, falls back, then rises for good is born at the last rise
    series = [(0, 5, n), (1, 5, n), (2, 60, n), (4, 6, n), (8, 70, n), (16, 80, n)]
    assert birth_step(series) == 8
    assert birth_step(list(reversed(series))) == 8  # any order
    assert birth_step([(1, 100, n), (2, 100, n)]) is None  # no step-0 control
    assert birth_step([(0, 5, n), (1, 9, n)]) is None  # within chance of the control
    assert birth_step([(0, 0, n), (1, 9, n)]) == 1  # 9/500 is above 0/500's interval
    assert birth_step([(0, 0, n), (1, 60, n), (2, 0, 0)]) is None  # nothing measured last


def test_the_seed_order_test_by_hand():
    assert sign_test(3, 0) == pytest.approx(0.25)  # three seeds can never reach 0.05
    assert sign_test(6, 0) == pytest.approx(2 / 64)
    assert sign_test(2, 2) == 1.0 and sign_test(0, 0) == 1.0
    births = {0: {"range": 4, "modulo": 16, "digit": None},
              1: {"range": 8, "modulo": 16, "digit": 2},
              2: {"range": 16, "modulo": 8, "digit": 2}}
    got = {(o.first, o.second): o for o in seed_orders(births)}
    rm = got[("range", "modulo")]
    assert (rm.before, rm.after, rm.tied, rm.unborn) == (2, 1, 0, 0) and not rm.consistent
    dm = got[("digit", "modulo")]
    assert (dm.before, dm.after, dm.unborn) == (2, 0, 1) and dm.consistent
    assert dm.p_value == pytest.approx(0.5)



def test_the_reports_birth_table_counts_a_missing_family_as_zero():
    """A checkpoint where no neuron carries a family stores no row for it; the report's
    births read that as 0 labelled (else a family absent at step 0 would have no control
    and never be born), and the final circuit's share is the ratio of the sums."""
    from reports import training as rt
    from schema.training import TrainingData

    n = 1000
    shares = []
    for seed in (0, 1):
        for step, mod in ((0, None), (2, None), (4, 80), (8, 90)):
            shares.append(("m", seed, step, "+", "any", 0, 50, mod or 0, n))
            if mod is not None:
                shares.append(("m", seed, step, "+", "modulo", 0, 50, mod, n))
    final = [("m", seed, step, "+", 20, 0.02, own, 0.01, fin, 0.01, rnd, 0.01, 100, 8)
             for seed in (0, 1)
             for step, own, fin, rnd in ((2, 0.5, 0.1, 0.1), (4, 0.5, 0.4, 0.1),
                                         (8, 0.9, 0.9, 0.2))]
    # an operator whose own circuit is no better than random (the demo's `/`): the final
    # circuit's large value over it is noise, and neither ratio is given
    final += [("m", seed, step, "/", 20, 0.02, own, 0.01, fin, 0.01, rnd, 0.01, 100, 8)
              for seed in (0, 1)
              for step, own, fin, rnd in ((2, 0.10, 0.40, 0.09), (4, 0.12, 0.35, 0.10),
                                          (8, 0.9, 0.9, 0.2))]
    d = TrainingData("m", 1, shares, final, [])
    assert rt.births(d) == {"+": {0: {"modulo": 4}, 1: {"modulo": 4}}}
    share = rt.final_share(d)["+"]
    assert share["plain"] == {0: pytest.approx(0.5 / 1.0), 1: pytest.approx(0.5)}
    assert share["above_random"][0] == pytest.approx((0.0 + 0.3) / (0.4 + 0.4))
    assert share["steps"] == {0: 2, 1: 2}
    div = rt.final_share(d)["/"]
    assert div["plain"] == {0: None, 1: None} and div["above_random"] == {0: None, 1: None}
    md = "\n".join(rt.markdown(d))
    assert "| / | all (2/2 steps) | final / own | - | - | - |" in md
    assert "| + | modulo | 4 | 4 |" in md and "79%" in md
    # a model whose only weights have no training step (a GGUF file's final weights)
    # stores a final-circuit row with no step: no training figure, and no error
    stepless = [("q", 0, None, "+", 20, 0.02, 0.5, 0.01, 0.5, 0.01, 0.1, 0.01, 100, None)]
    d = TrainingData("q", 1, [], stepless, [])
    assert rt.final_share(d) == {} and rt.final_rows(d) == {}
    assert "final circuit" not in "\n".join(rt.markdown(d))
