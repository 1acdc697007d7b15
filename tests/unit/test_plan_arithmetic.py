"""The planner's arithmetic (jobs.plan.estimate) on a made-up calibration: the units it
counts for a request and the seconds and bytes it derives from them."""

import pytest

from catalog.config import ExecutionConfig, ScienceConfig
from jobs.costs import Calibration, GridCosts, exact_row_macs, grid_cells, shape_macs, sketch_codes
from jobs.plan import estimate
from schema.engine import scratch_url

CAL = Calibration(
    model="m", device="cpu", n_layers=4, d_mlp=100, gated=False,
    seconds={"grid": [1.0, 0.001], "lens": [0.0, 0.5], "attribution": [2.0, 0.01],
             "exact": [0.0, 1e-5], "summary": [3.0, 0.02], "means": [0.0, 0.0001],
             "write": [0.0, 1e-7], "components": [1.0, 0.05]},
    bytes={"neuron_op": 300.0, "neuron_lens": 2000.0, "neuron_score": 200.0,
           "grid_row": 100.0, "grid_full_cell": 0.5, "grid_sketch_code": 0.8},
    rows_per_neuron_op=5.0, live_by_layer=[0.0, 1.0, 1.0, 0.5], matching_ratio=0.5,
    calibration_s=1.0)
COSTS = GridCosts(heuristics_s=0.25, per_neuron={"+": 0.01, "-": 0.02},
                  per_call={"+": 0.1, "-": 0.1})


def test_units_seconds_and_bytes_follow_the_request():
    config = ScienceConfig(operators=("+", "-"), operand_hi=50, pairs_per_op=20,
                           faithfulness_prompts=30, exact="top:10", full_grids="top:5")
    plan = estimate(CAL, config, n_checkpoints=3, layers=None, limit=520, costs=COSTS,
                    execution=ExecutionConfig(activation_budget=10**12))
    valid = grid_cells(config, 520)
    plus, minus = int(valid["+"].sum()), int(valid["-"].sum())
    assert (plus, minus) == (50 * 50, 50 * 51 // 2)
    phases = {p.name: p for p in plan.phases}
    prompts = plus + minus
    assert plan.prompts == prompts
    assert phases["grid pass"].seconds == pytest.approx(1.0 + 0.001 * prompts)
    assert phases["attribution"].units == 40
    assert phases["exact patching"].units == 10 * 20 * 2 * 4  # top:10 x pairs x ops x layers
    live = (0 + 1 + 1 + 0.5) * 100  # live neurons over the four layers
    assert phases["matching"].units == live * 2
    assert phases["matching"].seconds == pytest.approx(0.5 * (live * 0.03 + 4 * 0.2))
    # every head and MLP layer patched over 20 pairs of 2 operators
    assert phases["component effects"].units == 40
    assert phases["component effects"].seconds == pytest.approx(1.0 + 0.05 * 40)
    none = estimate(CAL, ScienceConfig(**{**config.as_dict(), "component_positions": (),
                                          "faithfulness_protocols": ("all-layers",)}),
                    n_checkpoints=1, layers=None, limit=520, costs=COSTS,
                    execution=ExecutionConfig(activation_budget=10**12))
    assert "component effects" not in {p.name for p in none.phases}
    # 30 prompts x 3 seeds x 2 operators x 1 protocol (paper); its means average the
    # grid of all four operators, 500 prompts at most (125 per operator)
    assert phases["summary"].units == 30 * 3 * 2
    assert phases["summary"].seconds == pytest.approx(3.0 + 0.02 * 180 + 0.0001 * 500)
    both = estimate(CAL, ScienceConfig(**{**config.as_dict(), "mean_prompts": 0,
                                          "faithfulness_protocols": ("paper", "all-layers")}),
                    n_checkpoints=1, layers=None, limit=520, costs=COSTS,
                    execution=ExecutionConfig(activation_budget=10**12))
    # all-layers adds a curve and a pass over the run's own prompts; no cap: the whole grid
    assert {p.name: p for p in both.phases}["summary"].seconds == pytest.approx(
        3.0 + 0.02 * 360 + 0.0001 * (4 * 50 * 50 + prompts))
    # of 3 checkpoints, two measure the final circuit: its ranked curve and random control
    # (2 of a paper curve's 3 circuit kinds), per-unit summary seconds only; one
    # checkpoint measures none
    assert phases["final circuit"].units == pytest.approx(30 * 3 * 2 * 2 / 3 * 2 / 3)
    assert phases["final circuit"].seconds == pytest.approx(0.02 * 30 * 3 * 2 * 2 / 3 * 2 / 3)
    one = {p.name: p for p in estimate(CAL, config, n_checkpoints=1, layers=None, limit=520,
                                       costs=COSTS,
                                       execution=ExecutionConfig(activation_budget=10**12)
                                       ).phases}
    assert set(phases) - set(one) == {"final circuit"}
    assert all(one[p].seconds == phases[p].seconds for p in one)
    # grids: per live layer share, 5 full grids per operator, sketches for the other
    # live neurons, a row for every neuron
    grid = 0.0
    for share in CAL.live_by_layer:
        for op, cells in (("+", plus), ("-", minus)):
            n = share * 100
            full = min(5, n)
            grid += full * cells * 0.5 + (n - full) * sketch_codes(config, valid[op]) * 0.8 \
                + 100 * 100.0
    assert plan.storage["neuron_grid"] == pytest.approx(grid)
    assert plan.storage["neuron_score"] == pytest.approx(200.0 * 5.0 * live * 2)
    assert plan.storage["neuron_op"] == 300.0 * 100 * 2 * 4
    assert phases["writing"].units == pytest.approx(plan.bytes_per_checkpoint)
    total = "Total: " in plan.render() and "3 checkpoint(s) x 4 layer(s)" in plan.render()
    assert total


def test_activations_over_the_budget_cost_one_grid_pass_per_layer():
    config = ScienceConfig(operators=("+",), operand_hi=30)
    small = estimate(CAL, config, n_checkpoints=1, layers=[1, 2], limit=520, costs=COSTS,
                     execution=ExecutionConfig(activation_budget=1))
    grid = small.phases[0]
    assert grid.units == 900 * 3  # the correctness pass, then one per layer
    assert grid.seconds == pytest.approx(3 * (1.0 + 0.001 * 900))
    assert any("NCAT_ACTIVATION_BUDGET" in n for n in small.notes)
    assert small.layers == 2


@pytest.mark.parametrize("url, expected", [
    # the embedded server: a unix socket in the query (the planner once cut "/pgdata" off
    # the socket path instead of replacing the database, on a GPU machine with no server)
    ("postgresql+psycopg://postgres:@/ncat?host=/root/.cache/neuron-catalog/pgdata",
     "postgresql+psycopg://postgres:@/scratch?host=%2Froot%2F.cache%2Fneuron-catalog%2Fpgdata"),
    ("postgresql+psycopg://postgres@localhost:5432/ncat",
     "postgresql+psycopg://postgres@localhost:5432/scratch"),
    ("postgresql+psycopg://u:secret@db.example:6543/ncat?sslmode=require",
     "postgresql+psycopg://u:secret@db.example:6543/scratch?sslmode=require"),
])
def test_scratch_database_keeps_the_server(url, expected):
    assert scratch_url(url, "scratch") == expected


def test_exact_patching_work_grows_with_the_blocks_after_the_layer():
    """An exact-patching row of layer L runs the blocks after L and the unembedding: the
    planner weights rows by those multiply-adds, so early layers cost more (on an H100,
    Qwen2.5's layer 0 took 4.7x its layer 23; counting rows alone underestimated the
    phase 2.9x)."""
    from dataclasses import replace
    from types import SimpleNamespace

    # Qwen2.5-0.5B: d_model 896, 14 heads of 64, 2 key/value heads, gated MLP of 4,864
    qwen = SimpleNamespace(d_model=896, n_heads=14, d_head=64, n_key_value_heads=2,
                           gated_mlp=True, d_mlp=4864, d_vocab=151_936)
    block, unembed = shape_macs(qwen)
    assert block == 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert unembed == 896 * 151_936
    cal = replace(CAL, block_macs=1e6, unembed_macs=4e6)
    config = ScienceConfig(operators=("+",), operand_hi=20, pairs_per_op=10, exact="all")
    first, last = (estimate(cal, config, n_checkpoints=1, layers=[layer], limit=520,
                            costs=COSTS) for layer in (0, 3))
    work = {p.name: p for p in first.phases}["exact patching"]
    rows = 100 * 10  # neurons x pairs x ops
    assert work.units == pytest.approx(rows * exact_row_macs(1e6, 4e6, 4, 0) / 1e9)
    assert work.units == pytest.approx(rows * (3 * 1e6 + 4e6) / 1e9)
    late = {p.name: p for p in last.phases}["exact patching"]
    assert work.seconds / late.seconds == pytest.approx(7 / 4)


def test_pairs_and_faithfulness_prompts_are_costed_from_the_correct_prompts():
    """Pairs and faithfulness prompts are drawn from the prompts the model answers: a
    model that answers few has little to patch. The planner once costed the pairs asked
    for, and overestimated a random-init Pythia-14m's run 2.1x (exact patching 29 s
    estimated, 0.5 s measured); the label rule's null, which it left out, took 8 s."""
    from dataclasses import replace

    config = ScienceConfig(operators=("+", "-"), operand_hi=50, pairs_per_op=20,
                           faithfulness_prompts=30, exact="top:10", full_grids="top:5")
    execution = ExecutionConfig(activation_budget=10**12)
    valid = grid_cells(config, 520)
    plus, minus = int(valid["+"].sum()), int(valid["-"].sum())
    # + answered on 0.4% of the grid (10 of 2,500 prompts), - on half of it
    cal = replace(CAL, correct_share={"+": 10 / plus, "-": 0.5}, significance_ratio=0.25,
                  explanations_ratio=0.125, spectra_ratio=0.1)
    plan = estimate(cal, config, n_checkpoints=1, layers=None, limit=520, costs=COSTS,
                    execution=execution)
    phases = {p.name: p for p in plan.phases}
    assert phases["attribution"].units == pytest.approx(10 + 20)
    assert phases["exact patching"].units == pytest.approx(10 * 30 * 4)
    assert phases["component effects"].seconds == pytest.approx(1.0 + 0.05 * 30)
    # faithfulness: min(30, 10) + min(30, 0.5 x minus) prompts, 3 seeds, 1 protocol
    assert phases["summary"].units == pytest.approx((10 + 30) * 3)
    live = (0 + 1 + 1 + 0.5) * 100
    assert phases["labels (null)"].seconds == pytest.approx(0.25 * (live * 0.03 + 4 * 0.2))
    assert phases["labels (null)"].seconds == pytest.approx(phases["matching"].seconds / 2)
    # the stored explanations and the periodic spectra of the same maps, scaled alike; no
    # spectra where the config skips them, no explanations phase where a calibration
    # (before it was timed apart) counted them in the label rule's
    assert phases["explanations"].seconds == pytest.approx(phases["matching"].seconds / 4)
    assert phases["spectra"].seconds == pytest.approx(phases["matching"].seconds / 5)
    # the K maps' explanations where asked: as long again (calibrated without them)
    both = estimate(cal, config, n_checkpoints=1, layers=None, limit=520, costs=COSTS,
                    execution=replace(execution, k_explanations=True))
    assert {p.name: p for p in both.phases}["explanations"].seconds == pytest.approx(
        phases["matching"].seconds / 2)
    off = estimate(cal, replace(config, spectra=False), n_checkpoints=1, layers=None,
                   limit=520, costs=COSTS, execution=execution)
    assert "spectra" not in {p.name for p in off.phases}
    old = estimate(replace(cal, explanations_ratio=0.0), config, n_checkpoints=1, layers=None,
                   limit=520, costs=COSTS, execution=execution)
    assert "explanations" not in {p.name for p in old.phases}
    assert any("about 30 counterfactual pairs in all, not 40" in n for n in plan.notes)
    # a model that answers nothing: no pairs, nothing patched, no faithfulness prompts
    none = estimate(replace(cal, correct_share={"+": 0.0, "-": 0.0}), config,
                    n_checkpoints=1, layers=None, limit=520, costs=COSTS, execution=execution)
    phases = {p.name: p for p in none.phases}
    assert phases["attribution"].units == 0 and phases["exact patching"].units == 0
    assert phases["summary"].units == 0
    # a model that answers everything is costed as asked, with no note
    full = estimate(replace(cal, correct_share={"+": 1.0, "-": 1.0}), config,
                    n_checkpoints=1, layers=None, limit=520, costs=COSTS, execution=execution)
    assert {p.name: p for p in full.phases}["attribution"].units == 40
    assert not any("counterfactual pairs" in n for n in full.notes)
    assert minus > 60  # half of minus's cells are more than the 30 prompts asked
