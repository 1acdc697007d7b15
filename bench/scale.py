"""Query latency on a large catalog: synthetic neuron rows for one model, then the analyst
queries that touch one neuron, one circuit, one heuristic. Compared, in the same run,
with the same queries on the same rows in a plain (unpartitioned, unindexed) copy.

Run: .venv/bin/python bench/scale.py [rows]   (default 10,000,000 neuron_op rows); each
query runs 5 times both ways, reported as the median and the spread (min-max).
"""

import sys
import time
import uuid

from schema import store
from schema.database import resolve_database_url
from schema.engine import migrate

from _common import over_runs, save

QUERIES = {
    "one neuron across training": (
        "SELECT step, effect_exact, rank, best_heuristic FROM neuron_evolution "
        "WHERE model = 'big' AND layer = 17 AND neuron = 4242 AND op = '+' ORDER BY step"),
    "circuit at one checkpoint": (
        "SELECT layer, neuron, effect_exact FROM neuron_op WHERE model_id = 1 "
        "AND checkpoint_id = 5 AND op = '+' AND rank < 20 ORDER BY layer, rank"),
    "top neurons of one checkpoint by effect size (docs/queries.md top_effect)": (
        "SELECT layer, neuron, rank_value FROM neuron_op WHERE model_id = 1 "
        "AND checkpoint_id = 7 AND config_id = 1 AND op = '*' "
        "ORDER BY abs(rank_value) DESC NULLS LAST LIMIT 50"),
    # no index holds effect_exact since migration 0017: the documented order is rank_value
    "top neurons of one checkpoint by effect_exact (not indexed)": (
        "SELECT layer, neuron, effect_exact FROM neuron_op WHERE model_id = 1 "
        "AND checkpoint_id = 7 AND op = '*' ORDER BY effect_exact DESC LIMIT 50"),
}


def timed_query(conn, sql, repeat=5):
    """Seconds of each of `repeat` runs of a query."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        times.append(time.perf_counter() - t)
    return times


def main(rows: int = 10_000_000):
    n_ck, n_ops, n_layers = 10, 4, 32
    d_mlp = rows // (n_ck * n_ops * n_layers)
    server = resolve_database_url()
    name = f"ncat_scale_{uuid.uuid4().hex[:8]}"
    url = server.rsplit("/", 1)[0] + "/" + name
    migrate(url)
    t0 = time.perf_counter()
    with store.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO model (id, name, source, n_layers, d_model, d_mlp, d_vocab, "
                     "act_fn, gated_mlp, number_limit, digit_level) VALUES "
                     f"(1, 'big', 'hub', {n_layers}, 4096, {d_mlp}, 50000, 'gelu', false, 520, "
                     "false)")
        conn.execute("INSERT INTO checkpoint (id, model_id, step, weights_hash) "
                     f"SELECT i, 1, i * 1000, md5(i::text) FROM generate_series(1, {n_ck}) i")
        conn.execute(
            "INSERT INTO neuron_op (model_id, checkpoint_id, config_id, layer, neuron, op, "
            "max_act, mean_act, density, effect_exact, rank, op_accuracy, rank_value) "
            "SELECT 1, ck, 1, l, n, (ARRAY['+','-','*','/'])[o], random(), random(), random(), "
            f"random(), (n * 7919 + ck * 31 + o) % {d_mlp}, 0.5, random() - 0.5 "
            f"FROM generate_series(1, {n_ck}) ck, generate_series(1, {n_ops}) o, "
            f"generate_series(0, {n_layers - 1}) l, generate_series(0, {d_mlp - 1}) n")
        conn.execute("ANALYZE neuron_op")
        load_s = time.perf_counter() - t0
        count = conn.execute("SELECT count(*) FROM neuron_op").fetchone()[0]
        conn.execute("CREATE TABLE plain_op AS SELECT * FROM neuron_op")
        conn.execute("ANALYZE plain_op")
        results = {}
        for label, sql in QUERIES.items():
            fast = timed_query(conn, sql)
            plain_sql = sql.replace("neuron_evolution", "plain_evolution").replace(
                "FROM neuron_op", "FROM plain_op")
            if "plain_evolution" in plain_sql:
                conn.execute("CREATE OR REPLACE VIEW plain_evolution AS SELECT m.name AS model, "
                             "c.step, n.*, NULL::text AS best_heuristic FROM plain_op n "
                             "JOIN checkpoint c ON c.id = n.checkpoint_id "
                             "JOIN model m ON m.id = n.model_id")
            slow = timed_query(conn, plain_sql)
            results[label] = over_runs(
                [{"catalog_ms": f * 1000, "unindexed_ms": s * 1000, "ratio": s / f}
                 for f, s in zip(fast, slow, strict=True)],
                ("catalog_ms", "unindexed_ms", "ratio"), digits=1)
    with store.connect(server.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    save("scale", {"neuron_op_rows": count, "load_s": round(load_s, 1), "queries": results})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000)
