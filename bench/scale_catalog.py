"""The analysts' queries on a large synthetic catalog with scores and grids.

A Pythia-1.4B-shaped model (24 layers x 8,192 neurons, 4 operators: 786,432 neuron-op
rows per checkpoint) over as many checkpoints as the requested neuron_op rows need,
built with set-based SQL: neuron_op rows, SCORES_PER_ROW score rows each (the default
of one per family for three families), one grid row each (a 819-byte sketch, the mean
measured by bench/grid_tiers.py; the top 20 per layer and operator get a 36.6 KB full
grid), layer_result rows, and a small second model. Reports the load time, table and
index sizes, every query of docs/queries.md (best of 3, asked about the big model), and
the derived tables' refresh: the small model's (what a job on it costs) against the
whole catalog's.

Run: .venv/bin/python bench/scale_catalog.py [neuron_op rows]   (default 3,145,728 =
4 checkpoints; the issue's 100M is 127 checkpoints and about 150 GB with grids)
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path

from _common import save

N_LAYERS, D_MLP, OPS = 24, 8192, ("+", "-", "*", "/")
SCORES_PER_ROW = 3
N_HEURISTICS = 1000
SKETCH_BYTES, FULL_BYTES, FULL_TOP = 819, 36_593, 20
DOC = Path(__file__).resolve().parents[1] / "docs" / "queries.md"


def _queries() -> dict[str, str]:
    found = dict(re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", DOC.read_text(),
                            flags=re.S))
    return {k: v.replace("'builtin-arith'", "'big'").replace("layer = 1 AND neuron = 5",
                                                             "layer = 17 AND neuron = 4242")
            for k, v in found.items()}


def _best(conn, sql: str, repeat: int = 3) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        t = time.perf_counter()
        n = len(conn.execute(sql).fetchall())
        best = min(best, time.perf_counter() - t)
    return best, n


def _load_model(conn, model_id: int, name: str, n_ck: int, n_layers: int, d_mlp: int,
                first_ck: int) -> None:
    conn.execute("INSERT INTO model (id, name, source, n_layers, d_model, d_mlp, d_vocab, "
                 "act_fn, gated_mlp, number_limit, digit_level) VALUES "
                 f"({model_id}, '{name}', 'hub', {n_layers}, 2048, {d_mlp}, 50304, 'gelu', "
                 "false, 520, false)")
    conn.execute("INSERT INTO checkpoint (id, model_id, step, weights_hash) "
                 f"SELECT i, {model_id}, (i - {first_ck}) * 1000, md5(i::text) "
                 f"FROM generate_series({first_ck}, {first_ck + n_ck - 1}) i")
    conn.execute("INSERT INTO layer_result (checkpoint_id, config_id, layer, n_neurons, "
                 f"n_scores) SELECT ck, 1, l, {d_mlp}, 0 FROM generate_series({first_ck}, "
                 f"{first_ck + n_ck - 1}) ck, generate_series(0, {n_layers - 1}) l")
    conn.execute(
        "INSERT INTO neuron_op (model_id, checkpoint_id, config_id, layer, neuron, op, "
        "max_act, mean_act, density, effect_exact, rank, op_accuracy, rank_value, "
        "is_exact, constant, labelled) "
        f"SELECT {model_id}, ck, 1, l, n, (ARRAY['+','-','*','/'])[o], random(), random(), "
        f"random(), random(), (n * 7919 + ck * 31 + o) % {d_mlp}, 0.5, random(), true, "
        "false, random() < 0.3 "
        f"FROM generate_series({first_ck}, {first_ck + n_ck - 1}) ck, "
        f"generate_series(1, 4) o, generate_series(0, {n_layers - 1}) l, "
        f"generate_series(0, {d_mlp - 1}) n")
    conn.execute(
        "INSERT INTO neuron_score (model_id, checkpoint_id, config_id, layer, neuron, op, "
        "heuristic_id, score, bottom, base_rate, p_value, implements) "
        "SELECT n.model_id, n.checkpoint_id, 1, n.layer, n.neuron, n.op, "
        f"((n.neuron * 31 + n.layer * 7 + k * {N_HEURISTICS // SCORES_PER_ROW}) "
        f"% {N_HEURISTICS}) + 1, s, false, 0.1, 1e-4 * (1 - s), s > 0.75 "
        f"FROM neuron_op n, generate_series(0, {SCORES_PER_ROW - 1}) k, "
        "LATERAL (SELECT 0.3 + 0.7 * random() + 0 * n.neuron AS s) r "
        f"WHERE n.model_id = {model_id}")
    # grids: one random sketch blob per row (random bytes do not compress, like codes),
    # a full grid for the top ranks
    conn.execute(
        "INSERT INTO neuron_grid (model_id, checkpoint_id, config_id, layer, neuron, op, q, "
        "scale, vmin, codec, sketch) "
        "SELECT n.model_id, n.checkpoint_id, 1, n.layer, n.neuron, n.op, "
        f"CASE WHEN n.rank < {FULL_TOP} THEN substring(f.b from 1 for {FULL_BYTES}) "
        f"ELSE substring(f.b from 1 + (n.neuron % 64) for {SKETCH_BYTES}) END, "
        "0.01, 0, 1, n.rank >= {FULL_TOP} "
        "FROM neuron_op n, blob f WHERE n.model_id = {model_id}".replace(
            "{FULL_TOP}", str(FULL_TOP)).replace("{model_id}", str(model_id)))


def main(rows: int = 3 * 1024 * 1024) -> None:
    from schema import store
    from schema.engine import migrate
    from schema.settings import resolve_database_url

    per_ck = N_LAYERS * D_MLP * len(OPS)
    n_ck = max(1, rows // per_ck)
    from jobs.plan import scratch_url

    server = resolve_database_url()
    name = f"ncat_scale2_{uuid.uuid4().hex[:8]}"
    url = scratch_url(server, name)
    migrate(url)
    out: dict = {"model": f"Pythia-1.4B shape ({N_LAYERS} x {D_MLP}), {n_ck} checkpoints"}
    try:
        with store.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO measure_config (id, config_hash, config, operators, "
                         "operand_lo, operand_hi, template, pairs_per_op, seed, "
                         "heuristic_variant, catalog_version) VALUES (1, 'x', '{}', '+-*/', "
                         "0, 300, '{a}{op}{b}=', 100, 0, 'paper', '0.4.0')")
            conn.execute("INSERT INTO heuristic (id, key, family, target, params, label) "
                         "SELECT i, 'h' || i, (ARRAY['range','modulo','value'])[1 + i % 3], "
                         "'result', to_jsonb(ARRAY[i]), CASE WHEN i = 1 THEN 'result in [10, 20)' "
                         f"ELSE 'h' || i END FROM generate_series(1, {N_HEURISTICS}) i")
            # random bytes, long enough for a full grid (md5 of random(), hex-decoded)
            conn.execute("CREATE TEMP TABLE blob AS SELECT decode(string_agg(md5(random()::"
                         f"text), ''), 'hex') AS b FROM generate_series(1, "
                         f"{FULL_BYTES // 16 + 8})")
            t = time.perf_counter()
            _load_model(conn, 1, "big", n_ck, N_LAYERS, D_MLP, 1)
            _load_model(conn, 2, "small", 2, 6, 512, n_ck + 1)
            conn.execute("ANALYZE")
            out["load_s"] = round(time.perf_counter() - t, 1)
            out["rows"] = {t: store.scalar(conn.execute(f"SELECT count(*) FROM {t}"))
                           for t in ("neuron_op", "neuron_score", "neuron_grid")}
            out["bytes"] = {t: store.table_bytes(conn, t)
                            for t in ("neuron_op", "neuron_score", "neuron_grid")}
            timings = {}
            for label, t_sql in (("refresh: the small model (a job's final step)", 2),
                                 ("refresh: the big model", 1),
                                 ("refresh: every model", None)):
                t = time.perf_counter()
                conn.execute("SELECT refresh_catalog_views(%s)", (t_sql,))
                timings[label] = round(time.perf_counter() - t, 2)
            out["refresh_s"] = timings
            conn.execute("ANALYZE")
            out["queries_ms"] = {}
            for label, sql in _queries().items():
                s, n = _best(conn, sql)
                out["queries_ms"][label] = {"ms": round(s * 1000, 1), "rows": n}
                print(label, out["queries_ms"][label], flush=True)
    finally:
        if os.environ.get("NCAT_SCALE_KEEP"):  # to look at query plans afterwards
            print(f"kept: {url}", flush=True)
        else:
            store.drop_database(url)
    save("scale_catalog", out)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3 * 1024 * 1024)
