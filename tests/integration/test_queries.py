"""Every query of docs/queries.md, run on a seeded catalog, checked against catalog.measure."""

import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from catalog.builtin import model_name
from catalog.run.measurement import measure
from catalog.sources import load_model
from schema import store

from helpers import SEED_CONFIG, SEED_STEPS, reader_url
from tiny_model import TINY

DOC = Path(__file__).resolve().parents[2] / "docs" / "queries.md"
CIRCUIT_K = 20


def queries() -> dict[str, str]:
    text = DOC.read_text()
    found = dict(re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", text, flags=re.S))
    assert len(found) == 16, sorted(found)
    return found


def test_the_readme_queries_are_the_guides():
    """The README's study shows queries of the analyst's guide, word for word, so the
    checks of this file (each query's answer against the library's) cover them too."""
    readme = DOC.parents[1] / "README.md"
    shown = re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", readme.read_text(),
                       flags=re.S)
    assert len(shown) >= 2
    guide = queries()
    for name, sql in shown:
        assert sql == guide[name], name


@pytest.fixture(scope="module")
def direct(tiny_builtin):
    """The same checkpoints measured by the library, no database involved."""
    cfg, root = tiny_builtin
    out = {}
    for step in SEED_STEPS:
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        out[step] = measure(lm.model, lm.tokenizer, SEED_CONFIG, progress=False)
    return out


def run(url, name, model=None):
    """A documented query, asked about the seeded tiny variant of the built-in model."""
    sql = queries()[name].replace("'builtin-arith'", f"'{model or model_name(TINY)}'")
    with store.connect(url) as conn:
        return conn.execute(sql).fetchall()


def held(result, op_index):
    """(layer, neuron, heuristic key) -> score of the labels of one operator."""
    out = {}
    for layer, lr in result.layers.items():
        m = lr.matches
        for i in np.nonzero((m.op == op_index) & m.implements)[0]:
            out[(layer, int(m.neuron[i]), m.row_heuristic(i).key)] = float(m.score[i])
    return out


def test_every_documented_query_runs_as_the_reader(seeded):
    with store.connect(reader_url(seeded)) as conn:
        for name, sql in queries().items():
            sql = sql.replace("'builtin-arith'", f"'{model_name(TINY)}'")
            assert conn.execute(sql).fetchall(), name  # every query has an answer
            conn.rollback()


def test_neuron_evolution(seeded, direct):
    rows = run(seeded, "neuron_evolution")
    assert [r[0] for r in rows] == list(SEED_STEPS)
    for step, effect, rank, label, best in rows:
        lr = direct[step].layers[1]
        want = lr.effect_exact[5, 0]
        assert (effect is None and np.isnan(want)) or effect == pytest.approx(float(want),
                                                                              rel=1e-6)
        assert rank == lr.rank[5, 0]
        sel = (lr.matches.neuron == 5) & (lr.matches.op == 0)
        # the best heuristic is the highest-scoring label, else the highest score among
        # the heuristics the grid can test, else among all
        labelled = sel & lr.matches.implements
        testable = sel & lr.matches.testable
        pick = labelled if labelled.any() else testable if testable.any() else sel
        assert best == pytest.approx(float(lr.matches.score[pick].max()), rel=1e-6)
        labels = {lr.matches.row_heuristic(i).label for i in np.nonzero(pick)[0]
                  if lr.matches.score[i] == lr.matches.score[pick].max()}
        assert label in labels


def test_circuit(seeded, direct):
    rows = run(seeded, "circuit")
    last = direct[SEED_STEPS[-1]]
    want = sorted((layer, int(n)) for layer, lr in last.layers.items()
                  for n in np.nonzero(lr.rank[:, 0] < CIRCUIT_K)[0])
    assert sorted((r[0], r[1]) for r in rows) == want
    assert len(rows) == CIRCUIT_K * len(last.layers)


def test_circuit_query_is_answered_from_the_rank_index(seeded):
    """The circuit compares ranks with an integer (migration 0010) and the documented
    query names the checkpoint by its ids, so the rank index can answer it: with scans
    of whole tables disabled, the plan reads neuron_op through an index whose condition
    holds the rank bound (a double circuit_k made it a filter over the whole partition:
    66-98 ms on a Pythia-1.4B-shaped catalog, 1.5 ms from the index)."""
    sql = queries()["circuit"].replace("'builtin-arith'", f"'{model_name(TINY)}'")
    with store.connect(seeded) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql).fetchall())
    assert re.search(r"Index Cond: .*model_id = .*checkpoint_id = .*rank < ", plan), plan


def test_top_effect(seeded, direct):
    """The twenty neurons of the last checkpoint with the largest |rank_value| for +,
    across layers, in that order, with the values the library computed."""
    rows = run(seeded, "top_effect")
    last = direct[SEED_STEPS[-1]]
    every = sorted(((abs(float(lr.rank_value[n, 0])), layer, n)
                    for layer, lr in last.layers.items()
                    for n in range(lr.rank_value.shape[0])), key=lambda t: -t[0])
    assert [(r[0], r[1]) for r in rows] == [(layer, n) for _, layer, n in every[:20]]
    for r in rows:
        lr = last.layers[r[0]]
        assert r[2] == pytest.approx(float(lr.rank_value[r[1], 0]), rel=1e-5, abs=1e-7)
        assert r[3] == bool(lr.is_exact[r[1], 0])
        assert r[5] == int(lr.rank[r[1], 0])
    assert len({abs(r[2]) for r in rows}) == 20  # no ties: the order is the answer


def test_top_effect_query_reads_the_effect_size_index_in_order(seeded):
    """Named by (model, checkpoint, config), the checkpoint's neurons come from the
    effect-size index of migration 0016 already in order: no sort takes in more than the
    twenty rows of the answer (ordering the checkpoint would take in all of its rows)."""
    import json

    sql = queries()["top_effect"].replace("'builtin-arith'", f"'{model_name(TINY)}'")
    with store.connect(seeded) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).fetchone()[0][0]["Plan"]
        per_op = conn.execute("SELECT count(*) FROM neuron_op WHERE op = '+' GROUP BY "
                              "checkpoint_id LIMIT 1").fetchone()[0]
    assert per_op > 20  # a sort of the checkpoint would be seen

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    def reads_neuron_op(node):
        return any(n.get("Relation Name", "").startswith("neuron_op") for n in nodes(node))

    assert "config_id_abs_idx" in json.dumps(plan), plan  # the index of 0016 (per partition)
    sorts = [n for n in nodes(plan) if n["Node Type"] in ("Sort", "Incremental Sort")
             and reads_neuron_op(n)]
    assert sorts, plan  # the outer ORDER BY of the twenty rows
    for n in sorts:
        assert sum(c["Actual Rows"] for c in n["Plans"]) <= 20, plan


def test_heuristic_neurons(seeded, direct):
    rows = run(seeded, "heuristic_neurons")
    last = direct[SEED_STEPS[-1]]
    want = []
    for layer, lr in last.layers.items():
        m = lr.matches
        for i in np.nonzero((m.op == 0) & m.implements)[0]:
            if m.row_heuristic(i).label == "result in [10, 20)":
                want.append((-float(m.score[i]), layer, int(m.neuron[i])))
    want = sorted(want)[:10]
    assert want, "the seeded catalog has no neuron for this heuristic"
    assert [(r[0], r[1]) for r in rows] == [(w[1], w[2]) for w in want]
    assert [r[2] for r in rows] == pytest.approx([-w[0] for w in want], rel=1e-6)


def _nodes(node: dict, inside: tuple = ()):
    """(node, the node types above it) for every node of an EXPLAIN (FORMAT JSON) plan."""
    yield node, inside
    for child in node.get("Plans", []):
        yield from _nodes(child, inside + (node["Node Type"],))


def test_heuristic_neurons_query_reads_the_answers_labels_only(seeded):
    """The documented query reads one (checkpoint, heuristic, operator) range of the
    labels' index (migration 0015), and joins neuron_op above the LIMIT, so it looks up
    the ten answers, not every label. Before, it fetched every score of the heuristic at
    that checkpoint and every label's neuron: 211 ms against 12 ms on a cold cache at the
    Pythia-1.4B shape (bench/scale_catalog.py --cold)."""
    sql = queries()["heuristic_neurons"].replace("'builtin-arith'", f"'{model_name(TINY)}'")
    with store.connect(seeded) as conn:
        conn.execute("SET enable_seqscan = off")  # the tiny catalog fits in a page
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + sql).fetchone()[0][0]["Plan"]
    scans = [(n, above) for n, above in _nodes(plan) if "Relation Name" in n]
    scores = [(n, above) for n, above in scans if n["Relation Name"].startswith("neuron_score")]
    ops = [(n, above) for n, above in scans if n["Relation Name"].startswith("neuron_op")]
    assert scores and ops, plan
    for n, above in scores:  # each partition: the labels' index, checkpoint and operator
        # (the heuristic joins by nested loop or hash, as the statistics say)
        cond = n.get("Index Cond", "")
        assert "_op_scor" in n.get("Index Name", ""), n  # (model, ck, heuristic, op, score)
        assert "checkpoint_id = $" in cond and "'+'" in cond and "Limit" in above, n
    for n, above in ops:  # neuron_op is joined to the ten rows the LIMIT kept
        assert "Limit" not in above, n


def test_census(seeded, direct):
    rows = run(seeded, "census")
    want = Counter()
    for step, res in direct.items():
        for o, op in enumerate(SEED_CONFIG.operators):
            per_family = defaultdict(set)
            for (layer, neuron, key), _ in held(res, o).items():
                if res.layers[layer].rank[neuron, o] < CIRCUIT_K:
                    per_family[key.split(":")[0]].add((layer, neuron))
            for family, neurons in per_family.items():
                want[(step, op, family)] = len(neurons)
    got = {(r[0], r[1], r[2]): r[3] for r in rows}
    assert got == dict(want) and got


def test_emergence(seeded, direct):
    rows = run(seeded, "emergence")
    holding = {step: held(res, 0) for step, res in direct.items()}
    final = holding[SEED_STEPS[-1]]
    counts = Counter()
    for pair in final:
        emerged = SEED_STEPS[-1]
        for step in reversed(SEED_STEPS[:-1]):
            if pair not in holding[step]:
                break
            emerged = step
        counts[emerged] += 1
    assert dict(rows) == dict(counts) and sum(counts.values()) == len(final)


def test_overlap(seeded, direct):
    rows = run(seeded, "overlap")
    last = direct[SEED_STEPS[-1]]
    final = set()
    for o in range(len(SEED_CONFIG.operators)):
        for (layer, neuron, key) in held(last, o):
            if last.layers[layer].rank[neuron, o] < CIRCUIT_K:
                final.add((o, layer, neuron, key))
    assert [r[0] for r in rows] == list(SEED_STEPS)
    for step, final_pairs, present, share in rows:
        now = {(o,) + k for o in range(4) for k in held(direct[step], o)}
        assert final_pairs == len(final)
        assert present == len(final & now)
        assert float(share) == pytest.approx(len(final & now) / len(final), abs=1e-3)
    assert rows[-1][3] == 1


def test_summary(seeded, direct):
    rows = run(seeded, "summary")
    assert [r[0] for r in rows] == list(SEED_STEPS)
    for step, acc, faith in rows:
        s = direct[step].summary
        assert float(acc) == pytest.approx(s.accuracy["+"])
        assert [k for k, _ in faith] == [k for k, _ in s.faithfulness["+"]]


def test_strict_labels(seeded, direct):
    """The histogram's answer at the last checkpoint equals counting the library's labels
    (scores compared as the REAL column holds them), and the strict rule keeps some but
    not all of them."""
    rows = {r[0]: r[1:] for r in run(seeded, "strict_labels")}
    want: dict[str, list] = defaultdict(lambda: [0, 0, []])
    for lr in direct[SEED_STEPS[-1]].layers.values():
        m = lr.matches
        for i in np.nonzero(m.implements)[0]:
            w = want[m.row_heuristic(i).family]
            w[0] += 1
            w[1] += int(float(np.float32(m.score[i])) >= 0.8 and m.p_value[i] < 1e-6)
            w[2].append(float(m.base_rate[i]))
    assert set(rows) == set(want) and rows
    for family, (labels, strict, base) in rows.items():
        assert (labels, strict) == tuple(want[family][:2]), family
        assert float(base) == pytest.approx(np.mean(want[family][2]), abs=1e-3)
    assert 0 < sum(w[1] for w in want.values()) < sum(w[0] for w in want.values())


def test_queries_answer_for_a_model_without_steps(db, tiny_builtin, direct):
    """A GGUF file or a local directory has one checkpoint, with step NULL: the circuit,
    heuristic, emergence and overlap questions must still answer."""
    import dataclasses

    from jobs.store_results import catalog_checkpoint

    cfg, root = tiny_builtin
    lm = load_model("builtin", SEED_STEPS[-1], builtin_config=cfg, cache_root=root)
    lm.info = dataclasses.replace(lm.info, name="/models/no-steps", source="local",
                                  checkpoint=None, revision=None)
    catalog_checkpoint(db, lm, SEED_CONFIG)
    last = direct[SEED_STEPS[-1]]
    circuit = run(db, "circuit", "/models/no-steps")
    assert sorted((r[0], r[1]) for r in circuit) == sorted(
        (layer, int(n)) for layer, lr in last.layers.items()
        for n in np.nonzero(lr.rank[:, 0] < CIRCUIT_K)[0])
    want = sorted((-float(lr.matches.score[i]), layer, int(lr.matches.neuron[i]))
                  for layer, lr in last.layers.items()
                  for i in np.nonzero((lr.matches.op == 0) & lr.matches.implements)[0]
                  if lr.matches.row_heuristic(i).label == "result in [10, 20)")[:10]
    got = run(db, "heuristic_neurons", "/models/no-steps")
    assert want and [(r[0], r[1]) for r in got] == [(w[1], w[2]) for w in want]
    emergence = run(db, "emergence", "/models/no-steps")
    labelled = held(last, 0)
    assert emergence == [(None, len(labelled))] and labelled
    overlap = run(db, "overlap", "/models/no-steps")
    assert len(overlap) == 1 and overlap[0][0] is None and overlap[0][1] > 0
    assert overlap[0][1] == overlap[0][2]  # the last checkpoint holds all of its own pairs


DERIVED = ("heuristic_census", "heuristic_emergence", "checkpoint_overlap")


def _derived(url) -> dict[str, list]:
    with store.connect(url) as conn:
        return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}").fetchall()))
                for t in DERIVED}


def test_derived_tables_refresh_per_model_and_equal_a_full_rebuild(db, tiny_builtin):
    """Each catalogued checkpoint rebuilds only its model's rows of the census, emergence
    and overlap tables; after two models at two steps each they equal a full rebuild,
    and refreshing one model leaves the other's rows alone."""
    import dataclasses

    from jobs.store_results import catalog_checkpoint

    cfg, root = tiny_builtin
    ids = {}
    for name in (model_name(TINY), "/models/copy"):
        for step in (SEED_STEPS[0], SEED_STEPS[-1]):
            lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
            lm.info = dataclasses.replace(lm.info, name=name)
            ids[name] = catalog_checkpoint(db, lm, SEED_CONFIG).model_id
    per_model = _derived(db)
    assert all(len(rows) > 0 for rows in per_model.values()), per_model
    with store.connect(db, autocommit=True) as conn:
        store.refresh_views(conn)  # every model
    assert _derived(db) == per_model
    a, b = ids.values()
    with store.connect(db, autocommit=True) as conn:
        for t in DERIVED:  # heuristic_emergence is a view over emergence_run
            stored = "emergence_run" if t == "heuristic_emergence" else t
            conn.execute(f"DELETE FROM {stored} WHERE model_id = %s", (b,))
        store.refresh_views(conn, a)  # the other model only: b's rows stay deleted
        left = {t: store.scalar(conn.execute(f"SELECT count(*) FROM {t} WHERE model_id = %s",
                                             (b,))) for t in DERIVED}
        assert left == dict.fromkeys(DERIVED, 0)
        store.refresh_views(conn, b)
    assert _derived(db) == per_model


def test_circuit_persistence_equals_the_shares_computed_from_stored_rankings(seeded):
    """Per checkpoint and operator, the share of the final checkpoint's paper circuit (top
    circuit_k per pruned layer by the curve's ranking) in this checkpoint's circuit."""
    with store.connect(seeded) as conn:
        k = int(conn.execute("SELECT value FROM catalog_setting WHERE key = 'circuit_k'"
                             ).fetchone()[0])
        summaries = conn.execute(
            "SELECT c.step, s.checkpoint_id, s.op, s.pruned, s.ranking FROM circuit_summary s "
            "JOIN checkpoint c ON c.id = s.checkpoint_id WHERE s.protocol = 'paper'"
        ).fetchall()
        circuits = {}
        for step, ck, op, pruned, ranking in summaries:
            rows = conn.execute(
                "SELECT layer, neuron, effect_attr + effect_attr_std, rank FROM neuron_op "
                "WHERE checkpoint_id = %s AND op = %s", (ck, op)).fetchall()
            chosen = set()
            for layer in pruned:
                mine = [r for r in rows if r[0] == layer]
                key = (lambda r: (-r[2], r[1])) if ranking == "attribution" else \
                    (lambda r: (r[3], r[1]))
                chosen |= {(r[0], r[1]) for r in sorted(mine, key=key)[:k]}
            circuits[(step, op)] = chosen
        got = {(step, op): (n_final, n_shared, share) for step, op, n_final, n_shared, share
               in conn.execute("SELECT step, op, n_final, n_shared, share FROM "
                               "circuit_persistence")}
    last = max(step for step, _ in circuits)
    assert {step for step, _ in got} == {step for step, _ in circuits} and len(got) > 3
    for (step, op), mine in circuits.items():
        final = circuits[(last, op)]
        shared = len(mine & final)
        assert got[(step, op)][:2] == (len(final), shared), (step, op)
        assert got[(step, op)][2] == pytest.approx(shared / len(final), rel=1e-6)
    assert all(share == 1 for (step, _), (_, _, share) in got.items() if step == last)
    assert any(share < 1 for (step, _), (_, _, share) in got.items() if step != last)


def test_label_enrichment_equals_the_top_sets_of_the_library_and_the_summary(seeded, direct):
    """The view's top set (the config's top_set_fraction of each layer by rank) and its
    labels equal those of the library's own run, and the summary's per-layer rows agree."""
    import math

    with store.connect(seeded) as conn:
        got = {(step, layer, op): (n_top, k_top, n_layer, k_layer)
               for step, layer, op, n_top, k_top, n_layer, k_layer in conn.execute(
                   "SELECT step, layer, op, n_top, labelled_top, n_layer, labelled_layer "
                   "FROM label_enrichment")}
        summary = {step: rows for step, rows in conn.execute(
            "SELECT c.step, s.enrichment FROM checkpoint_summary s "
            "JOIN checkpoint c ON c.id = s.checkpoint_id")}
    want = {}
    for step, result in direct.items():
        for layer, lr in result.layers.items():
            width = lr.rank.shape[0]
            n_top = max(1, math.ceil(SEED_CONFIG.top_set_fraction * width))
            for o, op in enumerate(SEED_CONFIG.operators):
                labelled = set(lr.matches.neurons_matching(o).tolist())
                top = set(np.nonzero(lr.rank[:, o] < n_top)[0].tolist())
                want[(step, layer, op)] = (n_top, len(top & labelled), width, len(labelled))
    assert got == want and len(got) > 4
    assert any(v[3] for v in want.values())  # some labels to compare
    for step, rows in summary.items():
        for r in rows or []:
            if r["layer"] != "all" and r["family"] == "any":
                n_top, k_top, n_layer, k_layer = got[(step, r["layer"], r["op"])]
                assert (r["n_top"], r["labelled_top"], r["n_layer"], r["labelled_layer"]) == (
                    n_top, k_top, n_layer, k_layer)


def test_stored_spectra_and_period_views_equal_the_library(seeded, direct):
    """Issue 34: each map's packed spectrum columns are the library's own run's
    (catalog.periodic.spectra), period_distribution counts the significant periods per layer,
    operator and axis as numpy does, and neuron_spectrum unpacks the columns as
    ``catalog.periodic.spectra.unpack`` does."""
    from catalog.periodic.spectra import AXES, SPECTRUM_COLS, unpack

    cols = ", ".join(f"n.{c}" for c in SPECTRUM_COLS)
    view_cols = ["op1_period", "op1_share", "op1_fit", "op1_linear", "result_period",
                 "result_share", "kv_period", "kv_share", "helix_r2", "op1_periodic",
                 "result_periodic", "kv_periodic"]
    with store.connect(seeded) as conn:
        stored = {(step, layer, neuron, op): tuple(row) for step, layer, neuron, op, *row in
                  conn.execute(f"SELECT c.step, n.layer, n.neuron, n.op, {cols} "
                               "FROM neuron_op n JOIN checkpoint c ON c.id = n.checkpoint_id")}
        dist = {(step, layer, op, axis, period): (n, n_live) for step, layer, op, axis, period,
                n, n_live in conn.execute(
                    "SELECT step, layer, op, axis, period, n, n_live FROM period_distribution "
                    "WHERE period IS NOT NULL")}
        spectrum = conn.execute(
            f"SELECT step, layer, neuron, op, {', '.join(view_cols)} FROM neuron_spectrum "
            "ORDER BY step, layer, neuron, op").fetchall()
    want_dist: dict = {}
    periodic = 0
    for step, result in direct.items():
        for layer, lr in result.layers.items():
            cols_lr = lr.spectra.cols
            values = unpack(cols_lr)
            for o, op in enumerate(SEED_CONFIG.operators):
                live = ~lr.constant[:, o]
                for n in range(lr.constant.shape[0]):
                    want = tuple(None if (v := int(cols_lr[c][n, o])) < 0 else v
                                 for c in SPECTRUM_COLS)
                    assert stored[(step, layer, n, op)] == want, (step, layer, n, op)
                for axis in AXES:
                    sig = live & values[f"{axis}_periodic"][:, o]
                    periodic += int(sig.sum())
                    period = values[f"{axis}_period"][:, o]
                    for t in np.unique(period[sig]):
                        n_t = int((sig & (period == t)).sum())
                        want_dist[(step, layer, op, axis, int(t))] = (n_t, int(live.sum()))
    assert dist == want_dist
    assert periodic > 0  # some periodic maps to count
    assert len(spectrum) > 100
    for step, layer, neuron, op, *got in spectrum:
        row = stored[(step, layer, neuron, op)]
        one = unpack({c: np.array([-1 if v is None else v]) for c, v in
                      zip(SPECTRUM_COLS, row, strict=True)})
        for c, g in zip(view_cols, got, strict=True):
            w = one[c][0]
            if c.endswith("_periodic"):
                assert g is bool(w), (c, g, w)
            elif c.endswith("_period"):
                assert (g is None) if w < 0 else g == w, (c, g, w)
            else:
                assert (g is None) if np.isnan(w) else g == pytest.approx(w, abs=1e-12), c


def test_final_circuit(seeded):
    """One row per operator and step, the size nearest 2% of the layer; at the last step
    the final circuit is the own one."""
    rows = run(seeded, "final_circuit")
    with store.connect(seeded) as conn:
        d_mlp = conn.execute("SELECT d_mlp FROM model").fetchone()[0]
    for op in SEED_CONFIG.operators:
        mine = [r for r in rows if r[1] == op]
        assert [r[0] for r in mine] == list(SEED_STEPS)
        sizes = {r[2] for r in mine}
        assert len(sizes) == 1 and abs(sizes.pop() - 0.02 * d_mlp) <= 0.02 * d_mlp
        assert mine[-1][3] == mine[-1][4] and {r[8] for r in mine} == {SEED_STEPS[-1]}


def test_heuristic_share(seeded, direct):
    """The labelled count per family equals the library's labels at each step."""
    rows = run(seeded, "heuristic_share")  # TINY's name has no seed: its own group
    for step, result in direct.items():
        for o, op in enumerate(SEED_CONFIG.operators):
            fams: dict[str, set] = {}
            for layer, lr in result.layers.items():
                m = lr.matches
                for i in np.nonzero((m.op == o) & m.implements)[0]:
                    fams.setdefault(m.row_heuristic(i).family, set()).add(
                        (layer, int(m.neuron[i])))
            got = {r[3]: int(r[4].split("/")[0]) for r in rows if (r[1], r[2]) == (step, op)}
            # a family labelled anywhere in the checkpoint has a row, with 0 where none
            assert {f: k for f, k in got.items() if k} == {f: len(v) for f, v in fams.items()}, \
                (step, op)
            neurons = sum(len(lr.max_act) for lr in result.layers.values())
            assert {int(r[4].split("/")[1]) for r in rows if (r[1], r[2]) == (step, op)} == \
                {neurons}
