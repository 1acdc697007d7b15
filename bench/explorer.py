"""Explorer render time on a large catalog: the search page and a neuron page, rendered by
Streamlit's AppTest against one model with >= 1M neuron rows (synthetic rows plus grids,
lens and scores for the neuron shown), caches cleared before each render, timed inside the
page's script (render_runs says why; AppTest's whole run is reported beside). The reference,
in the same run, is what an unpaged search page would do: load every row of the
checkpoint into a DataFrame. Each run times the three back to back; the report gives the
median over the runs and the spread (min-max).
Run: .venv/bin/python bench/explorer.py [rows] [--runs N]  (target < 1 s)
"""

import os
import sys
import time
import uuid

import numpy as np

from schema import store
from schema.database import resolve_database_url
from schema.engine import migrate
from schema.quantize import quantize_rows

from _common import ROOT, over_runs, runs_option, save

sys.path.insert(0, str(ROOT / "tests" / "integration"))


def page_script(name):
    import importlib
    import time

    import streamlit as st

    t = time.perf_counter()
    importlib.import_module(f"ui.views.{name}").render()
    st.session_state["_bench_page_s"] = time.perf_counter() - t


def render_runs(name, params=None, repeat=3) -> list[tuple[float, float]]:
    """(the page's own seconds, AppTest's whole run) for each of `repeat` runs of a page,
    caches cleared before each. The page's own time is its script from first line to last:
    the database reads, the plots and the elements, what a running explorer spends on each
    view. AppTest's run adds the harness's own work: it scans every installed package for
    Streamlit components on each run (about 0.65 s here, done once when a server starts)
    and polls for the script's end."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    out = []
    for _ in range(repeat):
        st.cache_data.clear()  # measure the database work, not the cache
        at = AppTest.from_function(page_script, args=(name,), default_timeout=120)
        for k, v in (params or {}).items():
            at.query_params[k] = str(v)
        t = time.perf_counter()
        at.run()
        whole = time.perf_counter() - t
        assert not at.exception, [e.value for e in at.exception]
        out.append((float(at.session_state["_bench_page_s"]), whole))
    return out


def render_times(name, params=None, repeat=3) -> list[float]:
    """The page's own seconds (render_runs) for each of `repeat` runs."""
    return [page for page, _ in render_runs(name, params, repeat)]


def main(rows: int = 1_000_000, runs: int = 5):
    n_ck, n_layers, ops, side = 10, 16, ["+", "-", "*", "/"], 100
    d_mlp = rows // (n_ck * n_layers * len(ops))
    server = resolve_database_url()
    name = f"ncat_uibench_{uuid.uuid4().hex[:8]}"
    url = server.rsplit("/", 1)[0] + "/" + name
    migrate(url)
    with store.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO model (id, name, source, n_layers, d_model, d_mlp, d_vocab, "
                     "act_fn, gated_mlp, number_limit, digit_level) VALUES (1, 'big', 'hub', "
                     f"{n_layers}, 1024, {d_mlp}, 50000, 'gelu', false, 999, false)")
        conn.execute("INSERT INTO checkpoint (id, model_id, step, weights_hash) SELECT i, 1, "
                     f"i * 1000, md5(i::text) FROM generate_series(1, {n_ck}) i")
        conn.execute("INSERT INTO measure_config (id, config_hash, config, operators, "
                     "operand_lo, operand_hi, template, pairs_per_op, seed, heuristic_variant, "
                     "catalog_version) VALUES (1, 'h', '{}', '+-*/', 0, 100, '{a}{op}{b}=', 100, "
                     "0, 'paper', 'bench')")
        conn.execute("INSERT INTO heuristic (id, key, family, target, params, label) "
                     "SELECT i, 'range:result:' || i, 'range', 'result', '[]', "
                     "'result in [' || i || ', ' || (i + 10) || ')' FROM generate_series(1, 50) i")
        conn.execute(
            "INSERT INTO neuron_op (model_id, checkpoint_id, config_id, layer, neuron, op, "
            "max_act, mean_act, density, effect_exact, rank, op_accuracy, best_heuristic_id, "
            "best_score) SELECT 1, ck, 1, l, n, (ARRAY['+','-','*','/'])[o], random(), random(), "
            f"random(), random(), (n * 7919 + ck) % {d_mlp}, 0.9, 1 + n % 50, random() "
            f"FROM generate_series(1, {n_ck}) ck, generate_series(1, 4) o, "
            f"generate_series(0, {n_layers - 1}) l, generate_series(0, {d_mlp - 1}) n")
        conn.execute(
            "INSERT INTO neuron_score (model_id, checkpoint_id, config_id, layer, neuron, op, "
            "heuristic_id, score, bottom) SELECT 1, ck, 1, l, n, '+', 1 + (n + h) % 50, "
            f"random(), false FROM generate_series(1, {n_ck}) ck, generate_series(0, "
            f"{n_layers - 1}) l, generate_series(0, {d_mlp - 1}) n, generate_series(0, 2) h")
        valid = np.ones(side * side, dtype=bool)
        for op in ops:
            store.upsert_grid_layout(conn, config_id=1, number_limit=999, op=op, lo=0,
                                     side=side, valid=valid,
                                     answer_index=np.zeros(side * side, dtype=np.int32))
        q, scale, vmin = quantize_rows(np.random.default_rng(0).standard_normal(
            (1, side * side)).astype(np.float32))
        with conn.cursor() as cur, cur.copy(
                "COPY neuron_grid (model_id, checkpoint_id, config_id, layer, neuron, op, q, "
                "scale, vmin) FROM STDIN") as cp:
            for ck in range(1, n_ck + 1):
                for op in ops:
                    cp.write_row((1, ck, 1, 3, 7, op, q[0].tobytes(), float(scale[0]),
                                  float(vmin[0])))
        conn.execute("INSERT INTO neuron_lens SELECT 1, ck, 1, 3, 7, array_fill(0.1::real, "
                     "ARRAY[1000]), ARRAY['a'], ARRAY[1::real], ARRAY['b'], ARRAY[-1::real] "
                     f"FROM generate_series(1, {n_ck}) ck")
        conn.execute("INSERT INTO layer_result (checkpoint_id, config_id, layer, n_neurons, "
                     f"n_scores) SELECT ck, 1, l, {d_mlp}, 0 FROM generate_series(1, {n_ck}) ck, "
                     f"generate_series(0, {n_layers - 1}) l")
        store.refresh_views(conn)
        count = conn.execute("SELECT count(*) FROM neuron_op").fetchone()[0]
    os.environ["DATABASE_URL"] = url
    neuron = dict(model_id=1, checkpoint_id=n_ck, config_id=1, layer=3, neuron=7)
    from schema.explorer_reads import frame
    from ui import data

    per_run = []
    for _ in range(runs):  # each run: the unpaged load, then the two pages, caches cleared
        t = time.perf_counter()
        with data.engine().connect() as conn:  # the naive page: every row at once
            unpaged = frame(conn, "SELECT n.*, h.label FROM neuron_op n LEFT JOIN heuristic "
                            "h ON h.id = n.best_heuristic_id WHERE n.model_id = 1 AND "
                            f"n.checkpoint_id = {n_ck} ORDER BY n.effect_exact DESC")
        unpaged_s = time.perf_counter() - t
        ((search_s, search_all),) = render_runs("search", repeat=1)
        ((neuron_s, neuron_all),) = render_runs("neuron", neuron, repeat=1)
        per_run.append({"search_s": search_s, "neuron_page_s": neuron_s,
                        "unpaged_load_s": unpaged_s, "search_vs_unpaged": unpaged_s / search_s,
                        "search_apptest_s": search_all, "neuron_page_apptest_s": neuron_all})
    result = {"neuron_op_rows": count, "unpaged_rows": len(unpaged), "runs": runs,
              **over_runs(per_run, tuple(per_run[0]))}
    with store.connect(server.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    save("explorer", result)


if __name__ == "__main__":
    runs = runs_option()
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000, runs)
