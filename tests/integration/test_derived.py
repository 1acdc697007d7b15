"""Folding one checkpoint at a time into the derived tables (migration 0011) gives what a
full rebuild gives, whatever order the checkpoints and their layers arrive in.

A synthetic model is written straight into the measurement tables: labels that persist
and lapse across steps (a Markov chain per (layer, neuron, op, heuristic)), so emergence
runs start, lengthen, break and get extended by steps inserted between others. After each
fold the derived tables are compared with ``refresh_catalog_views(model)`` run in a
transaction that is rolled back, so the incremental state carries on untouched.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from schema import store

DERIVED = ("heuristic_census", "heuristic_emergence", "checkpoint_overlap", "label_histogram",
           "emergence_histogram")
# emergence_histogram (0014) must equal this count over the runs, whatever wrote them
COUNTED = """
    SELECT model, model_id, config_id, op, family, emergence_step, count(*) AS pairs
    FROM heuristic_emergence WHERE model_id = %s
    GROUP BY model, model_id, config_id, op, family, emergence_step"""
N_LAYERS, N_NEURONS, OPS, N_HEUR = 3, 30, ("+", "-"), 6
STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


def _setup(conn, name: str, n_configs: int = 1) -> tuple[int, list[int], dict[int, int]]:
    model = store.scalar(conn.execute(
        "INSERT INTO model (name, source, n_layers, d_model, d_mlp, d_vocab, act_fn, "
        "gated_mlp, number_limit, digit_level) VALUES (%s, 'hub', %s, 8, %s, 100, 'gelu', "
        "false, 99, false) RETURNING id", (name, N_LAYERS, N_NEURONS)))
    configs = [store.scalar(conn.execute(
        "INSERT INTO measure_config (config_hash, config, operators, operand_lo, operand_hi, "
        "template, pairs_per_op, seed, heuristic_variant, catalog_version) VALUES "
        "(%s, '{}', '+-', 0, 10, '{a}{op}{b}=', 10, 0, 'paper', 'test') "
        "ON CONFLICT (config_hash) DO UPDATE SET seed = 0 RETURNING id",
        (f"cfg{i}",))) for i in range(n_configs)]
    for i in range(N_HEUR):
        conn.execute("INSERT INTO heuristic (key, family, target, params, label) VALUES "
                     "(%s, %s, 'result', %s, %s) ON CONFLICT (key) DO NOTHING",
                     (f"fam{i % 3}:{i}", f"fam{i % 3}", json.dumps([i]), f"h{i}"))
    checkpoints = {step: store.scalar(conn.execute(
        "INSERT INTO checkpoint (model_id, step, weights_hash) VALUES (%s, %s, %s) "
        "RETURNING id", (model, step, f"{name}{step}"))) for step in STEPS}
    return model, configs, checkpoints


def _labels(rng: random.Random) -> dict:
    """(step, layer, neuron, op, heuristic index) -> (score, p, base rate, implements):
    each pair's labels persist from step to step with probability 0.8."""
    out = {}
    for layer in range(N_LAYERS):
        for neuron in range(N_NEURONS):
            for op in OPS:
                for h in range(N_HEUR):
                    held = rng.random() < 0.3
                    for step in STEPS:
                        if rng.random() > 0.8:
                            held = not held
                        if held or rng.random() < 0.2:  # some stored scores are not labels
                            score = rng.uniform(0.6, 1.0) if held else rng.uniform(0.3, 0.6)
                            out[(step, layer, neuron, op, h)] = (
                                score, 10 ** rng.uniform(-20, -1), rng.random(), held)
    return out


def _write(conn, model: int, config: int, ck: int, step: int, layers, labels: dict,
           rng: random.Random) -> None:
    heur = dict(conn.execute("SELECT key, id FROM heuristic").fetchall())
    keys = [f"fam{i % 3}:{i}" for i in range(N_HEUR)]
    with conn.transaction():
        for layer in layers:
            conn.execute("DELETE FROM neuron_op WHERE model_id = %s AND checkpoint_id = %s "
                         "AND config_id = %s AND layer = %s", (model, ck, config, layer))
            conn.execute("DELETE FROM neuron_score WHERE model_id = %s AND checkpoint_id = %s "
                         "AND config_id = %s AND layer = %s", (model, ck, config, layer))
            with conn.cursor() as cur:
                for op in OPS:
                    ranks = list(range(N_NEURONS))
                    rng.shuffle(ranks)
                    cur.executemany(
                        "INSERT INTO neuron_op (model_id, checkpoint_id, config_id, layer, "
                        "neuron, op, max_act, mean_act, density, rank, op_accuracy) VALUES "
                        "(%s, %s, %s, %s, %s, %s, 1, 0, 0.5, %s, 0.9)",
                        [(model, ck, config, layer, n, op, ranks[n]) for n in range(N_NEURONS)])
                cur.executemany(
                    "INSERT INTO neuron_score (model_id, checkpoint_id, config_id, layer, "
                    "neuron, op, heuristic_id, score, bottom, base_rate, p_value, implements) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s)",
                    [(model, ck, config, layer, n, op, heur[keys[h]], s, b, p, i)
                     for (st, ly, n, op, h), (s, p, b, i) in labels.items()
                     if st == step and ly == layer])
            conn.execute(
                "INSERT INTO layer_result (checkpoint_id, config_id, layer, n_neurons, n_scores, "
                "written_at) VALUES (%s, %s, %s, %s, 0, clock_timestamp()) "
                "ON CONFLICT (checkpoint_id, config_id, layer) DO UPDATE "
                "SET written_at = clock_timestamp()", (ck, config, layer, N_NEURONS))


def _tables(conn, model: int) -> dict[str, list[str]]:
    return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t} WHERE model_id = %s",
                                             (model,)).fetchall())) for t in DERIVED}


def _counted(conn, model: int) -> list[str]:
    return sorted(map(repr, conn.execute(COUNTED, (model,)).fetchall()))


def _assert_equals_full_rebuild(conn, model: int) -> dict[str, list[str]]:
    folded = _tables(conn, model)
    assert folded["emergence_histogram"] == _counted(conn, model)
    with conn.transaction(force_rollback=True):
        conn.execute("SELECT refresh_catalog_views(%s)", (model,))
        full = _tables(conn, model)
        assert full["emergence_histogram"] == _counted(conn, model)
    for t in DERIVED:
        assert folded[t] == full[t], t
    return folded


@pytest.fixture
def conn(db):
    with store.connect(db, autocommit=True) as c:
        yield c


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_checkpoints_folded_in_any_order_equal_a_full_rebuild(conn, seed):
    rng = random.Random(seed)
    model, (config,), cks = _setup(conn, f"m{seed}")
    labels = _labels(rng)
    order = list(STEPS)
    rng.shuffle(order)
    outcomes = []
    for step in order:
        _write(conn, model, config, cks[step], step, range(N_LAYERS), labels, rng)
        outcomes.append(store.refresh_views(conn, model, cks[step], config))
        _assert_equals_full_rebuild(conn, model)
    assert outcomes == ["folded"] * len(STEPS)
    final = _tables(conn, model)
    assert all(final[t] for t in DERIVED), final  # every table has rows to compare
    # the runs themselves, from the planted labels: pairs held at the last step, the
    # step their unbroken run starts from, and its length
    want = {}
    for (step, layer, neuron, op, h), (_, _, _, held) in labels.items():
        if step == STEPS[-1] and held:
            run = 0
            for s in reversed(STEPS):
                if not labels.get((s, layer, neuron, op, h), (0, 0, 0, False))[3]:
                    break
                run += 1
            want[(layer, neuron, op, f"h{h}")] = (STEPS[len(STEPS) - run], run)
    got = {(r[0], r[1], r[2], r[3]): (r[4], r[5]) for r in conn.execute(
        "SELECT layer, neuron, op, heuristic, emergence_step, checkpoints_held "
        "FROM heuristic_emergence WHERE model_id = %s", (model,)).fetchall()}
    assert got == want and len({v[1] for v in want.values()}) > 3
    # the orders exercised both a new last step and steps between others
    assert order != sorted(order)


def test_emergence_histogram_follows_every_write_to_the_runs(conn):
    """The triggers of 0014 keep the counts through writes the fold never makes: an
    update moving runs between steps, a delete of one layer, a truncate, and rows
    written by hand; buckets that empty are removed, not left at zero."""
    rng = random.Random(5)
    model, (config,), cks = _setup(conn, "trig")
    labels = _labels(rng)
    for step in STEPS:
        _write(conn, model, config, cks[step], step, range(N_LAYERS), labels, rng)
        store.refresh_views(conn, model, cks[step], config)
    before = _counted(conn, model)
    assert len(before) > 10 and _tables(conn, model)["emergence_histogram"] == before
    conn.execute("UPDATE emergence_run SET emergence_step = 0 WHERE model_id = %s "
                 "AND emergence_step > 8", (model,))
    assert _tables(conn, model)["emergence_histogram"] == _counted(conn, model) != before
    steps = {r[0] for r in conn.execute("SELECT emergence_step FROM emergence_histogram "
                                        "WHERE model_id = %s", (model,)).fetchall()}
    assert steps and max(steps) <= 8  # the moved steps' buckets went, not kept at zero
    conn.execute("DELETE FROM emergence_run WHERE model_id = %s AND layer = 1", (model,))
    assert _tables(conn, model)["emergence_histogram"] == _counted(conn, model)
    conn.execute("INSERT INTO emergence_run SELECT model_id, config_id, layer + 10, neuron, "
                 "op, heuristic_id, NULL FROM emergence_run WHERE model_id = %s", (model,))
    assert _tables(conn, model)["emergence_histogram"] == _counted(conn, model)
    assert store.scalar(conn.execute("SELECT count(*) FROM emergence_histogram WHERE "
                                     "model_id = %s AND emergence_step IS NULL", (model,)))
    conn.execute("TRUNCATE emergence_run")
    assert store.scalar(conn.execute("SELECT count(*) FROM emergence_histogram")) == 0
    conn.execute("SELECT refresh_catalog_views(%s)", (model,))
    assert _tables(conn, model)["emergence_histogram"] == before


def test_split_jobs_interleaved_a_forced_rewrite_and_a_second_config(conn):
    """Layers of one checkpoint in two jobs, several jobs written before any is folded,
    folds in another order, a second config alongside, then a layer written again with
    other labels (a forced job): rebuilt, and still equal to a full rebuild."""
    rng = random.Random(7)
    model, configs, cks = _setup(conn, "split", n_configs=2)
    labels = {c: _labels(rng) for c in configs}
    jobs = [(c, step, layers) for c in configs for step in STEPS
            for layers in ((0,), (1, 2))]
    rng.shuffle(jobs)
    pending: list[tuple[int, int]] = []
    for i, (c, step, layers) in enumerate(jobs):
        _write(conn, model, c, cks[step], step, layers, labels[c], rng)
        pending.append((c, step))
        if i % 4 == 3 or i == len(jobs) - 1:  # a batch of jobs finishes, in another order
            rng.shuffle(pending)
            for c2, s2 in pending:
                assert store.refresh_views(conn, model, cks[s2], c2) in ("folded",
                                                                          "nothing new")
            pending.clear()
            _assert_equals_full_rebuild(conn, model)
    assert store.refresh_views(conn, model, cks[STEPS[3]], configs[0]) == "nothing new"
    relabelled = {k: (v[0], v[1], v[2], not v[3]) for k, v in labels[configs[0]].items()}
    _write(conn, model, configs[0], cks[STEPS[3]], STEPS[3], (1,), relabelled, rng)
    assert store.refresh_views(conn, model, cks[STEPS[3]], configs[0]) == "rebuilt"
    _assert_equals_full_rebuild(conn, model)
    # and folding carries on after the rebuild
    _write(conn, model, configs[1], cks[STEPS[2]], STEPS[2], (0,), relabelled, rng)
    assert store.refresh_views(conn, model, cks[STEPS[2]], configs[1]) == "rebuilt"
    _assert_equals_full_rebuild(conn, model)


def test_label_histogram_answers_thresholds_on_its_grid_like_the_raw_scores(conn):
    """Counting labels from the histogram equals filtering neuron_score for every score
    threshold on the 0.05 grid and every p-value threshold 10^d down to 1e-15."""
    rng = random.Random(11)
    model, (config,), cks = _setup(conn, "hist")
    labels = _labels(rng)
    # scores on the grid's edges; p-values at powers of ten and one ulp either side
    # (where log10 may round onto the wrong decade)
    for i, key in enumerate(list(labels)[:300]):
        s, p, b, held = labels[key]
        p = float(f"1e-{i % 18}")
        p = (p, math.nextafter(p, 0), math.nextafter(p, 2))[(i // 18) % 3]
        labels[key] = (round(0.6 + 0.05 * (i % 9), 2), p, b, True)
    for step in STEPS:
        _write(conn, model, config, cks[step], step, range(N_LAYERS), labels, rng)
        store.refresh_views(conn, model, cks[step], config)
    ck = cks[STEPS[-1]]
    for score in [round(0.6 + 0.05 * k, 2) for k in range(9)]:
        for d in range(-15, 1):
            raw = store.scalar(conn.execute(
                "SELECT count(*) FROM neuron_score s WHERE s.model_id = %s AND "
                f"s.checkpoint_id = %s AND s.implements AND s.score >= {score} "
                f"AND s.p_value < 1e{d}", (model, ck)))
            hist = store.scalar(conn.execute(
                "SELECT coalesce(sum(labels), 0) FROM label_histogram WHERE model_id = %s AND "
                f"checkpoint_id = %s AND score_from >= {score} AND p_decade < {d}",
                (model, ck)))
            assert hist == raw, (score, d)
    assert store.scalar(conn.execute(
        "SELECT count(*) FROM neuron_score WHERE model_id = %s AND implements "
        "AND score = 0.6::real", (model,))) > 0  # the grid's edges were exercised


def _census_from_rows(conn, model: int, k: float) -> dict:
    """(step, op, family) -> circuit neurons (rank < k) labelled with a heuristic of the
    family, counted in Python from the raw rows."""
    rank = {(ck, layer, neuron, op): r for ck, layer, neuron, op, r in conn.execute(
        "SELECT checkpoint_id, layer, neuron, op, rank FROM neuron_op WHERE model_id = %s",
        (model,)).fetchall()}
    step = dict(conn.execute("SELECT id, step FROM checkpoint WHERE model_id = %s",
                             (model,)).fetchall())
    members: dict = {}
    for ck, layer, neuron, op, family in conn.execute(
            "SELECT s.checkpoint_id, s.layer, s.neuron, s.op, h.family FROM neuron_score s "
            "JOIN heuristic h ON h.id = s.heuristic_id WHERE s.model_id = %s AND s.implements",
            (model,)).fetchall():
        if rank[(ck, layer, neuron, op)] < k:
            members.setdefault((step[ck], op, family), set()).add((layer, neuron))
    return {key: len(v) for key, v in members.items()}


def test_a_changed_setting_takes_effect_after_refresh_catalog_views(conn):
    """docs/queries.md: after `UPDATE catalog_setting ...`, `SELECT refresh_catalog_views()`
    rebuilds every model's derived rows under the new setting."""
    rng = random.Random(7)
    model, (config,), cks = _setup(conn, "settings")
    labels = _labels(rng)
    for step in STEPS:
        _write(conn, model, config, cks[step], step, range(N_LAYERS), labels, rng)
        store.refresh_views(conn, model, cks[step], config)

    def census() -> dict:
        return {(step, op, family): n for step, op, family, n in conn.execute(
            "SELECT step, op, family, circuit_neurons FROM heuristic_census "
            "WHERE model_id = %s", (model,)).fetchall()}

    k = store.scalar(conn.execute("SELECT value FROM catalog_setting WHERE key = 'circuit_k'"))
    before = census()
    assert before == _census_from_rows(conn, model, k)
    try:
        conn.execute("UPDATE catalog_setting SET value = 5 WHERE key = 'circuit_k'")
        assert census() == before  # the derived rows keep the old size until the refresh
        conn.execute("SELECT refresh_catalog_views()")
        after = census()
        assert after == _census_from_rows(conn, model, 5) and after != before
        assert sum(after.values()) < sum(before.values())
    finally:
        conn.execute("UPDATE catalog_setting SET value = %s WHERE key = 'circuit_k'", (k,))
