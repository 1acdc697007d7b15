"""The analysts' queries and the explorer on a large synthetic catalog with scores and grids.

A Pythia-1.4B-shaped model (24 layers x 8,192 neurons, 4 operators: 786,432 neuron-op
rows per checkpoint) over as many checkpoints as the requested neuron_op rows need,
built with set-based SQL: neuron_op rows, SCORES_PER_ROW score rows each (the default
of one per family for three families; a pair's score persists across checkpoints, so
labels form runs), one grid row each (a sketch of SKETCH_BYTES, the mean measured by
bench/grid_tiers.py; the top FULL_TOP per layer and operator get a full grid of
FULL_BYTES), layer_result rows, and a small second model. Reports the load time, table
and index sizes (and bytes per neuron_op row, extrapolated to 100M rows), every query of
docs/queries.md (median and spread of 5 runs, asked about the big model), the search
page's query in each of its sort orders, the explorer's search, neuron and overview
pages (Streamlit's AppTest, caches cleared), and the derived tables' upkeep: folding in
one checkpoint as a job's final step does (a step between others, and a new last step)
against rebuilding the model and the whole catalog.

Run: .venv/bin/python bench/scale_catalog.py [neuron_op rows]   (default 3,145,728 =
4 checkpoints; the issue's 100M is 127 checkpoints, about 185 GB with grids and scores).
NCAT_SCALE_KEEP=1 keeps the catalog; `bench/scale_catalog.py --kept URL` migrates a kept
catalog to the newest schema and measures the reads again (scale_catalog_reads.json);
`--kept URL --cold` measures each query and page from a cold start instead (median and
spread of 3): the server restarted and the page cache dropped before each run (root;
scale_catalog_cold.json).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from _common import median_spread, save

N_LAYERS, D_MLP, OPS = 24, 8192, ("+", "-", "*", "/")
SCORES_PER_ROW = 3
N_HEURISTICS = 1000
SKETCH_BYTES, FULL_BYTES, FULL_TOP = 691, 30_974, 20
DOC = Path(__file__).resolve().parents[1] / "docs" / "queries.md"


def _queries() -> dict[str, str]:
    found = dict(re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", DOC.read_text(),
                            flags=re.S))
    return {k: v.replace("'builtin-arith'", "'big'").replace("layer = 1 AND neuron = 5",
                                                             "layer = 17 AND neuron = 4242")
            for k, v in found.items()}


def _search_queries(shown: dict) -> dict[str, tuple[str, dict]]:
    """The explorer's search page query (its first page, no filter) in each of its sort
    orders, for the checkpoint the bench shows: (SQL for psycopg, parameters)."""
    from ui import data

    out = {}
    for sort in data.SORTS:
        f = data.Filters(model_id=shown["model_id"], checkpoint_id=shown["checkpoint_id"],
                         config_id=shown["config_id"], sort=sort)
        _, rows, params = data.search_sql(f, 0, 50, data.COUNT_CAP)
        out[f"search page query, by {sort}"] = (re.sub(r"(?<!:):(\w+)", r"%(\1)s", rows),
                                                params)
    return out


def _timed(conn, sql: str, repeat: int = 5, params: dict | None = None) -> dict:
    """Median and spread (min-max) of `repeat` runs in milliseconds, and the row count."""
    times, n = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        n = len(conn.execute(sql, params).fetchall())
        times.append((time.perf_counter() - t) * 1000)
    ms, spread = median_spread(times)
    return {"ms": ms, "spread_ms": spread, "rows": n}


def _add_model(conn, model_id: int, name: str, n_layers: int, d_mlp: int) -> None:
    conn.execute("INSERT INTO model (id, name, source, n_layers, d_model, d_mlp, d_vocab, "
                 "act_fn, gated_mlp, number_limit, digit_level) VALUES "
                 f"({model_id}, '{name}', 'hub', {n_layers}, 2048, {d_mlp}, 50304, 'gelu', "
                 "false, 520, false)")


def _load_checkpoints(conn, model_id: int, steps: dict[int, int], n_layers: int,
                      d_mlp: int) -> None:
    """Checkpoint rows (id -> step) and all their measurement rows, set-based."""
    ids = ", ".join(str(i) for i in steps)
    conn.execute("INSERT INTO checkpoint (id, model_id, step, weights_hash) "
                 f"SELECT i, {model_id}, s, md5(i::text) FROM unnest(%s::int[], %s::bigint[]) "
                 "AS t(i, s)", (list(steps), list(steps.values())))
    conn.execute("INSERT INTO layer_result (checkpoint_id, config_id, layer, n_neurons, "
                 f"n_scores) SELECT ck, 1, l, {d_mlp}, 0 FROM unnest(ARRAY[{ids}]) ck, "
                 f"generate_series(0, {n_layers - 1}) l")
    conn.execute(
        "INSERT INTO neuron_op (model_id, checkpoint_id, config_id, layer, neuron, op, "
        "max_act, mean_act, density, effect_exact, rank, op_accuracy, rank_value, "
        "is_exact, constant, labelled) "
        f"SELECT {model_id}, ck, 1, l, n, (ARRAY['+','-','*','/'])[o], random(), random(), "
        f"random(), random(), (n * 7919 + ck * 31 + o) % {d_mlp}, 0.5, random(), true, "
        "false, random() < 0.3 "
        f"FROM unnest(ARRAY[{ids}]) ck, generate_series(1, 4) o, "
        f"generate_series(0, {n_layers - 1}) l, generate_series(0, {d_mlp - 1}) n")
    # a label at one checkpoint is mostly a label at the next: scores drawn per (neuron,
    # heuristic) with a little per-checkpoint noise, so emergence runs span checkpoints
    conn.execute(
        "INSERT INTO neuron_score (model_id, checkpoint_id, config_id, layer, neuron, op, "
        "heuristic_id, score, bottom, base_rate, p_value, implements) "
        "SELECT n.model_id, n.checkpoint_id, 1, n.layer, n.neuron, n.op, "
        f"((n.neuron * 31 + n.layer * 7 + k * {N_HEURISTICS // SCORES_PER_ROW}) "
        f"% {N_HEURISTICS}) + 1, s, false, 0.1, 1e-4 * (1 - s), s > 0.75 "
        f"FROM neuron_op n, generate_series(0, {SCORES_PER_ROW - 1}) k, "
        "LATERAL (SELECT least(1, 0.3 + 0.6 * ((hashint4(n.neuron * 3 + k + n.layer * 100003)"
        " & 1023) / 1023.0) + 0.1 * random()) AS s) r "
        f"WHERE n.model_id = {model_id} AND n.checkpoint_id IN ({ids})")
    # grids: one random sketch blob per row (random bytes do not compress, like codes),
    # a full grid for the top ranks
    conn.execute(
        "INSERT INTO neuron_grid (model_id, checkpoint_id, config_id, layer, neuron, op, q, "
        "scale, vmin, codec, sketch) "
        "SELECT n.model_id, n.checkpoint_id, 1, n.layer, n.neuron, n.op, "
        f"CASE WHEN n.rank < {FULL_TOP} THEN substring(f.b from 1 for {FULL_BYTES}) "
        f"ELSE substring(f.b from 1 + (n.neuron % 64) for {SKETCH_BYTES}) END, "
        f"0.01, 0, 1, n.rank >= {FULL_TOP} "
        f"FROM neuron_op n, blob f WHERE n.model_id = {model_id} AND n.checkpoint_id IN "
        f"({ids})")


def _shown_neuron(conn, model_id: int) -> dict:
    """Real, decodable grids, lens and layouts for the neuron the explorer bench opens (the
    synthetic blobs of the other rows are never decoded)."""
    import numpy as np

    from schema import store
    from schema.quantize import quantize_rows
    from schema.sketch import GridGeometry, encode_full, encode_sketches

    side = 300
    a, b = np.divmod(np.arange(side * side), side)
    masks = {"+": a + b <= 520, "-": b <= a, "*": a * b <= 520, "/": b >= 1}
    rng = np.random.default_rng(0)
    layer, neuron = 17, 4242
    for o, (op, valid) in enumerate(masks.items()):
        store.upsert_grid_layout(conn, config_id=1, number_limit=520, op=op, lo=0, side=side,
                                 valid=valid, answer_index=np.zeros(int(valid.sum()),
                                                                    dtype=np.int32))
        geometry = GridGeometry(side, valid)
        values = rng.standard_normal((1, geometry.n_cells)).astype(np.float32)
        q, scale, vmin = quantize_rows(values)
        full = o % 2 == 0  # two operators full, two sketched
        data, codec = (encode_full(q, geometry)[0] if full
                       else (encode_sketches(values, scale, vmin, geometry)[0], 1))
        conn.execute("UPDATE neuron_grid SET q = %s, codec = %s, sketch = %s, scale = %s, "
                     "vmin = %s WHERE model_id = %s AND layer = %s AND neuron = %s AND op = %s",
                     (data, codec, not full, float(scale[0]), float(vmin[0]), model_id, layer,
                      neuron, op))
    conn.execute("INSERT INTO neuron_lens SELECT %s, c.id, 1, %s, %s, "
                 "array_fill(0.1::real, ARRAY[521]), ARRAY['a'], ARRAY[1::real], ARRAY['b'], "
                 "ARRAY[-1::real] FROM checkpoint c WHERE c.model_id = %s",
                 (model_id, layer, neuron, model_id))
    last = store.scalar(conn.execute("SELECT id FROM checkpoint WHERE model_id = %s "
                                     "ORDER BY step DESC LIMIT 1", (model_id,)))
    return dict(model_id=model_id, checkpoint_id=last, config_id=1, layer=layer,
                neuron=neuron)


def _timed_fold(conn, model_id: int, checkpoint_id: int) -> dict:
    """Seconds to fold one checkpoint in, as a job's final step does (statistics, then
    refresh_checkpoint_views), and what the function reported."""
    from schema import store

    t = time.perf_counter()
    conn.execute("ANALYZE neuron_op, neuron_score, neuron_lens, heuristic, checkpoint, "
                 "layer_result")
    analyze = time.perf_counter() - t
    t = time.perf_counter()
    outcome = store.scalar(conn.execute("SELECT refresh_checkpoint_views(%s, %s, 1)",
                                        (model_id, checkpoint_id)))
    return {"analyze_s": round(analyze, 2), "fold_s": round(time.perf_counter() - t, 2),
            "outcome": outcome}


def _reads(url: str, shown: dict) -> dict:
    """The analysts' queries (median and spread of 5 runs, in a session opened after the
    migrations, so the database's defaults apply) and the explorer's pages (5 runs,
    caches cleared)."""
    from schema import store

    out: dict = {"queries_ms": {}}
    with store.connect(url, autocommit=True) as conn:
        for label, sql in _queries().items():
            out["queries_ms"][label] = _timed(conn, sql)
            print(label, out["queries_ms"][label], flush=True)
        out["search_ms"] = {label: _timed(conn, sql, params=params)
                            for label, (sql, params) in _search_queries(shown).items()}
        print(out["search_ms"], flush=True)
    os.environ["DATABASE_URL"] = url
    from explorer import render_times

    out["explorer_s"] = {}
    for label, page, params in _pages(shown):
        s, spread = median_spread(render_times(page, params, repeat=5), digits=3)
        out["explorer_s"][label] = {"s": s, "spread_s": spread}
    print(out["explorer_s"], flush=True)
    return out


def _make_cold(url: str) -> None:
    """Restart PostgreSQL and drop the operating system's page cache: the next query
    reads from disk, with an empty buffer pool and a new backend's empty catalog caches.
    Takes root (to write /proc/sys/vm/drop_caches) and a command that restarts the
    server: NCAT_PG_RESTART, else Debian's `pg_ctlcluster <major> main restart`."""
    import subprocess

    from schema import store

    command = os.environ.get("NCAT_PG_RESTART")
    if not command:
        with store.connect(url, autocommit=True) as conn:
            major = int(store.scalar(conn.execute("SHOW server_version_num"))) // 10000
        command = f"pg_ctlcluster {major} main restart"
    subprocess.run(command, shell=True, check=True)
    subprocess.run("sync", check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise SystemExit(f"cold reads need root to drop the page cache: {e}") from e
    for _ in range(100):  # the server accepts connections again
        try:
            with store.connect(url, autocommit=True):
                return
        except Exception:  # noqa: BLE001 (starting up)
            time.sleep(0.2)
    raise SystemExit(f"PostgreSQL did not come back after `{command}`")


def cold_reads(url: str, shown: dict, repeat: int = 3) -> dict:
    """Each documented query and each explorer page from a cold start (_make_cold before
    each of `repeat` runs; median and spread): the query in a new session, a page in a
    new process (its connection pool starts empty, its modules imported), then the same
    again warm for comparison."""
    from schema import store

    out: dict = {"repeat": repeat, "queries_ms": {}, "explorer_s": {}}
    asked = {**{label: (sql, None) for label, sql in _queries().items()},
             **_search_queries(shown)}
    for label, (sql, params) in asked.items():
        cold, warm = [], []
        for _ in range(repeat):
            _make_cold(url)
            with store.connect(url, autocommit=True) as conn:
                cold.append(_timed(conn, sql, repeat=1, params=params)["ms"])
                warm.append(_timed(conn, sql, repeat=1, params=params)["ms"])
        out["queries_ms"][label] = _cold_and_warm(cold, warm, "ms", 1)
        print(label, out["queries_ms"][label], flush=True)
    for label, page, params in _pages(shown):
        runs = [_cold_page(url, page, params) for _ in range(repeat)]
        out["explorer_s"][label] = _cold_and_warm([r[0] for r in runs], [r[1] for r in runs],
                                                  "s", 3)
        print(label, out["explorer_s"][label], flush=True)
    return out


def _pages(shown: dict) -> tuple:
    """(label, page, query parameters) of the explorer pages the bench renders."""
    return (("search page", "search", None), ("neuron page", "neuron", shown),
            ("overview page", "overview", None))


def _cold_and_warm(cold: list[float], warm: list[float], unit: str, digits: int) -> dict:
    (c, c_spread), (w, w_spread) = median_spread(cold, digits), median_spread(warm, digits)
    return {f"cold_{unit}": c, f"cold_spread_{unit}": c_spread,
            f"then_warm_{unit}": w, f"then_warm_spread_{unit}": w_spread}


def _cold_page(url: str, page: str, params: dict | None) -> tuple[float, float]:
    """(cold, then warm) seconds of one page rendered in a new process after _make_cold.
    The page's modules are imported first: a running explorer has them loaded, and the
    cold start measured is the database's."""
    import subprocess

    _make_cold(url)
    bench = Path(__file__).resolve().parent
    code = (f"import sys, json; sys.path.insert(0, {str(bench)!r}); "
            f"import ui.views.{page}, plotly.express, plotly.graph_objects; "
            "from explorer import render_times; "
            f"print(json.dumps(render_times({page!r}, {params!r}, repeat=2)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "DATABASE_URL": url}, check=True)
    cold, warm = json.loads(done.stdout.strip().splitlines()[-1])
    return cold, warm


def reads_of_kept(url: str, cold: bool = False) -> None:
    """Migrate a catalog kept by an earlier run (NCAT_SCALE_KEEP=1) to the newest schema
    and measure its reads again; saved as scale_catalog_reads."""
    from schema import store
    from schema.engine import migrate

    migrate(url)
    with store.connect(url, autocommit=True) as conn:
        last = store.scalar(conn.execute("SELECT id FROM checkpoint WHERE model_id = 1 "
                                         "ORDER BY step DESC LIMIT 1"))
        n_ck = store.scalar(conn.execute("SELECT count(*) FROM checkpoint WHERE model_id = 1"))
    shown = dict(model_id=1, checkpoint_id=last, config_id=1, layer=17, neuron=4242)
    out = {"model": f"Pythia-1.4B shape ({N_LAYERS} x {D_MLP}), {n_ck} checkpoints (kept)"}
    if cold:
        with store.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # as autovacuum leaves a catalog at rest
            out["database_gb"] = round(store.scalar(conn.execute(
                "SELECT pg_database_size(current_database())")) / 1e9, 1)
        out["cold"] = cold_reads(url, shown)
        save("scale_catalog_cold", out)
        return
    out.update(_reads(url, shown))
    save("scale_catalog_reads", out)


def main(rows: int = 4 * 786_432) -> None:
    from schema import reads, store
    from schema.database import resolve_database_url
    from schema.engine import migrate, scratch_url

    per_ck = N_LAYERS * D_MLP * len(OPS)
    n_ck = max(3, rows // per_ck)
    server = resolve_database_url()
    name = f"ncat_scale2_{uuid.uuid4().hex[:8]}"
    url = scratch_url(server, name)
    migrate(url)
    out: dict = {"model": f"Pythia-1.4B shape ({N_LAYERS} x {D_MLP}), {n_ck} checkpoints"}
    tables = ("neuron_op", "neuron_score", "neuron_grid")
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
            _add_model(conn, 1, "big", N_LAYERS, D_MLP)
            # every checkpoint but two: steps 0, 1000, 2000, ...
            for i in range(1, n_ck - 1):  # one checkpoint per statement: bounded memory
                _load_checkpoints(conn, 1, {i: (i - 1) * 1000}, N_LAYERS, D_MLP)
                print(f"loaded checkpoint {i} of {n_ck}", flush=True)
            _add_model(conn, 2, "small", 6, 512)
            _load_checkpoints(conn, 2, {n_ck + 1: 0, n_ck + 2: 1000}, 6, 512)
            conn.execute("ANALYZE")
            out["load_s"] = round(time.perf_counter() - t, 1)
            timings: dict = {}
            for label, model in (("rebuild: the small model", 2),
                                 (f"rebuild: the big model ({n_ck - 2} checkpoints)", 1)):
                t = time.perf_counter()
                conn.execute("SELECT refresh_catalog_views(%s)", (model,))
                timings[label] = round(time.perf_counter() - t, 2)
            # a job's final step, the way jobs run it now: fold in one new checkpoint
            _load_checkpoints(conn, 1, {n_ck - 1: 500}, N_LAYERS, D_MLP)
            timings["fold: a checkpoint between others (step 500)"] = _timed_fold(
                conn, 1, n_ck - 1)
            _load_checkpoints(conn, 1, {n_ck: (n_ck - 2) * 1000}, N_LAYERS, D_MLP)
            timings[f"fold: a new last checkpoint (step {(n_ck - 2) * 1000})"] = _timed_fold(
                conn, 1, n_ck)
            t = time.perf_counter()
            conn.execute("SELECT refresh_catalog_views()")
            timings[f"rebuild: every model ({n_ck} + 2 checkpoints; each job before 0009)"] = \
                round(time.perf_counter() - t, 2)
            out["refresh"] = timings
            print(timings, flush=True)
            shown = _shown_neuron(conn, 1)
            conn.execute("ANALYZE")
            out["rows"] = {t: store.scalar(conn.execute(f"SELECT count(*) FROM {t}"))
                           for t in tables}
            out["bytes"] = {t: reads.table_bytes(conn, t) for t in tables}
            n_op = out["rows"]["neuron_op"]
            per_row = {t: round(out["bytes"][t] / n_op) for t in tables}
            out["bytes_per_neuron_op_row"] = per_row
            out["extrapolated_gb_at_100M_neuron_op_rows"] = {
                t: round(b * 100e6 / 1e9, 1) for t, b in per_row.items()}
        out.update(_reads(url, shown))
    finally:
        if os.environ.get("NCAT_SCALE_KEEP"):  # to look at query plans afterwards
            print(f"kept: {url}", flush=True)
        else:
            store.drop_database(url)
    save("scale_catalog", out)


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--kept":
        reads_of_kept(sys.argv[2], cold=sys.argv[3:] == ["--cold"])
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 4 * 786_432)
