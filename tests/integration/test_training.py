"""Training dynamics in the store (issue 48): the final circuit at every earlier checkpoint,
whichever order the checkpoints were catalogued in, the views, the report's section and
the command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from catalog.builtin import model_name
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model
from jobs import store_results
from schema import store, training

from helpers import SEED_CONFIG, SEED_STEPS
from tiny_model import TINY

ROOT = Path(__file__).resolve().parents[2]


def test_the_final_circuit_is_at_every_earlier_checkpoint(seeded, tiny_builtin):
    """The fixture catalogued its checkpoints in step order and filled the final circuit in
    afterwards (jobs.final_circuits.fill): every earlier step has it, against the last
    step, equal to measuring it directly from the stored final circuit; at the last step
    the view repeats the own circuit."""
    cfg, root = tiny_builtin
    last, earlier = SEED_STEPS[-1], SEED_STEPS[:-1]
    with store.connect(seeded) as conn:
        rows = conn.execute(
            "SELECT step, k, own, final, random, n, final_step FROM final_circuit_faithfulness "
            "WHERE metric = 'nl' AND op = '+' ORDER BY step, k").fetchall()
        ids_of = dict(conn.execute("SELECT step, id FROM checkpoint").fetchall())
        model_id, config_id = conn.execute(
            "SELECT model_id, config_id FROM checkpoint_summary s JOIN checkpoint c "
            "ON c.id = s.checkpoint_id LIMIT 1").fetchone()
        assert {r[0] for r in rows} == set(SEED_STEPS)
        assert {r[6] for r in rows} == {last}
        for step, k, own, final, _rnd, n, _ in rows:
            assert n > 0 and final is not None and own is not None, (step, k)
            if step == last:
                assert final == own
        # the stored points equal the final circuit measured here, from the store
        step = earlier[0]
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        ids = store_results.CatalogIds(model_id, ids_of[step], config_id)
        final, final_id = store_results.final_circuit(conn, ids, SEED_CONFIG, lm.model, step)
        assert final_id == ids_of[last] and final.step == last
        curves = CheckpointRun(lm.model, lm.tokenizer, SEED_CONFIG).prepare().final_curves(final)
        stored = {(op, c, m, k): v for op, c, m, k, v in conn.execute(
            "SELECT op, circuit, metric, k, ratio_of_means FROM final_circuit_point "
            "WHERE checkpoint_id = %s", (ids_of[step],))}
        want = {(c.op, p["circuit"], p["metric"], p["k"]): p["ratio_of_means"]
                for c in curves for p in c.points}
        assert stored.keys() == want.keys()
        for key, v in want.items():
            assert (stored[key] is None and v is None) or \
                stored[key] == pytest.approx(v, rel=1e-6, abs=1e-6), key  # REAL column
        # nothing is left to fill, and the last step is never measured against itself
        assert training.lacking_final(conn, model_id=model_id, config_id=config_id,
                                      final_checkpoint_id=ids_of[last]) == []
        assert store_results.final_circuit(
            conn, store_results.CatalogIds(model_id, ids_of[last], config_id), SEED_CONFIG,
            lm.model, last) is None


def test_a_checkpoint_with_nothing_to_measure_is_not_left_to_fill(seeded):
    """A checkpoint whose own paper curves have no point (it answers no prompt right, as
    the demo's steps 0-2) has nothing to measure the final circuit on: it is not listed as
    lacking it, while a checkpoint with points whose final curves are missing is. (Listed,
    it was loaded and prepared again after every later summary: 8 grid passes of a demo.)"""
    with store.connect(seeded) as conn, conn.transaction(force_rollback=True):
        ids_of = dict(conn.execute("SELECT step, id FROM checkpoint").fetchall())
        model_id, config_id = conn.execute(
            "SELECT model_id, config_id FROM checkpoint_summary s JOIN checkpoint c "
            "ON c.id = s.checkpoint_id LIMIT 1").fetchone()
        empty, lacking = ids_of[SEED_STEPS[0]], ids_of[SEED_STEPS[1]]
        conn.execute("DELETE FROM final_circuit_point WHERE checkpoint_id = ANY(%s)",
                     ([empty, lacking],))
        last = ids_of[SEED_STEPS[-1]]
        both = training.lacking_final(conn, model_id=model_id, config_id=config_id,
                                      final_checkpoint_id=last)
        assert sorted(both) == sorted([(empty, SEED_STEPS[0]), (lacking, SEED_STEPS[1])])
        conn.execute("DELETE FROM circuit_point WHERE checkpoint_id = %s", (empty,))
        assert training.lacking_final(conn, model_id=model_id, config_id=config_id,
                                      final_checkpoint_id=last) == [(lacking, SEED_STEPS[1])]


def test_heuristic_shares_per_step_with_their_intervals(seeded):
    with store.connect(seeded) as conn:
        rows = conn.execute(
            "SELECT model, model_group, seed, step, op, family, labelled_all, n_all, share_all, "
            "share_all_lo, share_all_hi, labelled_top, n_top FROM heuristic_share").fetchall()
        n_layers, d_mlp = conn.execute("SELECT n_layers, d_mlp FROM model").fetchone()
    assert {r[3] for r in rows} == set(SEED_STEPS)
    for model, group, seed, _step, _op, _fam, k, n, share, lo, hi, kt, nt in rows:
        assert group == model.split("@seed")[0] and seed == 0  # TINY's name has no seed
        assert n == n_layers * d_mlp and 0 <= k <= n and kt <= nt
        assert share == pytest.approx(k / n) and lo <= share <= hi
    anys = {(r[3], r[4]): r[6] for r in rows if r[5] == "any"}
    for (step, op), k in anys.items():  # a family's count never exceeds "any"
        assert all(r[6] <= k for r in rows if (r[3], r[4]) == (step, op))


def test_the_report_has_a_training_section(seeded, tmp_path):
    from reports.report import report
    from schema.report_reads import gather_report

    with store.connect(seeded) as conn:
        name = conn.execute("SELECT name FROM model").fetchone()[0]
    d = gather_report(seeded, name, SEED_STEPS[-1])
    assert d.training is not None and d.training.seeds == [0]
    html_path, md_path = report(seeded, name, SEED_STEPS[-1], tmp_path)
    md = md_path.read_text()
    assert "## Training" in md and "### The final circuit at earlier steps" in md
    table = md[md.index("### The final circuit at earlier steps"):]
    for step in SEED_STEPS:
        assert f"| + | {step} |" in table
    assert "Birth step per family" in md


def test_the_final_circuit_command(seeded, tiny_builtin):
    _, root = tiny_builtin
    env = {"DATABASE_URL": seeded, "NCAT_HOME": str(root.parent), "PATH": "/usr/bin:/bin"}
    with store.connect(seeded) as conn:
        name = conn.execute("SELECT name FROM model").fetchone()[0]
    ok = subprocess.run([sys.executable, "-m", "jobs.cli", "final-circuit", name], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert f"{name}, config" in ok.stdout and "measured in" not in ok.stdout  # all there
    bad = subprocess.run([sys.executable, "-m", "jobs.cli", "final-circuit", "no-such-model"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no catalogued checkpoint of 'no-such-model'" in bad.stderr


def test_checkpoints_catalogued_latest_first_measure_the_final_circuit_in_their_summary(
        db, tiny_builtin):
    """``ncat catalog`` orders checkpoints latest first: the earlier one's own summary
    measures the final circuit (nothing is left for a fill)."""
    _, root = tiny_builtin

    env = {"DATABASE_URL": db, "NCAT_HOME": str(root.parent), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "jobs.cli", "catalog", model_name(TINY), "--checkpoints",
           "128,300", "--ops", "+", "--hi", "12", "--quiet"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = [x for x in out.stdout.splitlines() if "stored in" in x]
    assert "step 300" in lines[0] and "step 128" in lines[1]  # latest first
    assert "the final circuit measured" not in out.stdout  # no fill was needed
    with store.connect(db) as conn:
        got = conn.execute(
            "SELECT c.step, f.step FROM final_circuit_point p JOIN checkpoint c "
            "ON c.id = p.checkpoint_id JOIN checkpoint f ON f.id = p.final_checkpoint_id "
            "GROUP BY 1, 2").fetchall()
    assert got == [(128, 300)]


def test_seed_names_round_trip():
    from catalog import builtin

    cfg = builtin.TrainConfig(seed=2)
    assert builtin.model_name(cfg) == "builtin-arith@seed2"
    assert builtin.config_from_name("builtin-arith@seed2") == cfg
    assert builtin.model_name(builtin.TrainConfig()) == "builtin-arith"
    other = builtin.TrainConfig(seed=2, steps=100)
    assert builtin.model_name(other) == f"builtin-arith@{other.key()}"


def test_a_family_no_neuron_carries_at_a_step_has_a_zero_share_there(seeded):
    """Issue 81: a family absent from a step's summary (no neuron carries it there) still
    has its row at that step, 0 of the step's neurons with the interval [0, z^2/(n+z^2)],
    so a plot through training shows 0, not a gap. Planted by taking one family's entry
    out of one summary, inside a transaction that is rolled back."""
    from catalog.core.stats import wilson

    cols = ("SELECT step, op, family, labelled_all, n_all, share_all, share_all_lo, "
            "share_all_hi, labelled_top, n_top, share_top, share_top_lo, share_top_hi "
            "FROM heuristic_share")
    with store.connect(seeded) as conn:
        before = conn.execute(cols).fetchall()
        step, op, family = next((r[0], r[1], r[2]) for r in before
                                if r[2] != "any" and r[3] > 0 and r[0] == SEED_STEPS[0])
        with conn.transaction(force_rollback=True):
            conn.execute(
                "UPDATE checkpoint_summary s SET enrichment = (SELECT jsonb_agg(e) FROM "
                "jsonb_array_elements(s.enrichment) e WHERE NOT (e->>'op' = %s AND "
                "e->>'family' = %s)) FROM checkpoint c WHERE c.id = s.checkpoint_id "
                "AND c.step = %s", (op, family, step))
            after = conn.execute(cols).fetchall()
    assert len(after) == len(before)  # every family still at every step and operator
    (row,) = [r for r in after if (r[0], r[1], r[2]) == (step, op, family)]
    _, _, _, k, n, share, lo, hi, kt, nt, st, tlo, thi = row
    assert (k, share, lo, kt, st, tlo) == (0, 0, 0, 0, 0, 0)
    assert hi == pytest.approx(wilson(0, n)[1], rel=1e-6)
    assert thi == pytest.approx(wilson(0, nt)[1], rel=1e-6)
    # every step and operator has the same families: those the group's summaries name
    fams: dict = {}
    for r in before:
        fams.setdefault(r[1], set()).add(r[2])
    for s_, o in {(r[0], r[1]) for r in before}:
        assert {r[2] for r in before if (r[0], r[1]) == (s_, o)} == fams[o]
