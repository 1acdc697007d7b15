"""The explorer's pages run by Streamlit's AppTest against a seeded catalog in PostgreSQL."""

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from schema import store


def page_script(name):
    import importlib

    importlib.import_module(f"ui.views.{name}").render()


def run_page(name, params=None, timeout=60) -> AppTest:
    at = AppTest.from_function(page_script, args=(name,), default_timeout=timeout)
    for k, v in (params or {}).items():
        at.query_params[k] = str(v)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def catalog_env(seeded, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", seeded)
    monkeypatch.setenv("NCAT_QUEUE", "explorer-tests-no-worker")
    from ui import data

    data.database_url.clear()
    data.engine.clear()
    for fn in (data.has_catalog, data.models, data.search, data.checkpoints, data.configs,
               data.circuits):
        fn.clear()
    return seeded


def ids(url):
    with store.connect(url) as conn:
        model_id, config_id = conn.execute("SELECT model_id, config_id FROM neuron_op LIMIT 1"
                                           ).fetchone()
        last = conn.execute("SELECT id FROM checkpoint ORDER BY step DESC LIMIT 1").fetchone()[0]
    return model_id, last, config_id


def text_of(at) -> str:
    return "\n".join([m.value for m in at.markdown] + [m.value for m in at.caption]
                     + [m.value for m in at.info] + [m.value for m in at.title])


def test_overview_lists_models_checkpoints_and_accuracy(catalog_env):
    at = run_page("overview")
    table = at.dataframe[0].value
    # a row per checkpoint, config and operator, the last checkpoints first
    assert table.drop_duplicates("step").step.tolist() == [300, 128, 64]
    with store.connect(catalog_env) as conn:
        acc, n, se = conn.execute(
            "SELECT s.accuracy ->> '+', p.n, p.ratio_of_means_se FROM checkpoint_summary s "
            "JOIN checkpoint c ON c.id = s.checkpoint_id JOIN circuit_point p ON "
            "p.checkpoint_id = c.id AND p.config_id = s.config_id AND p.op = '+' AND "
            "p.circuit = 'ranked' AND p.metric = 'nl' AND p.protocol = 'paper' AND "
            "p.k = (s.faithfulness -> '+' -> (jsonb_array_length(s.faithfulness -> '+') / 2) "
            "->> 0)::int WHERE c.step = 300").fetchone()
    first = table[(table.step == 300) & (table.op == "+")].iloc[0]
    assert first.accuracy == pytest.approx(float(acc))
    assert first["n prompts"] == n  # the faithfulness with the prompts it stands on
    assert first.faithfulness.endswith(f"± {se:.3f}" + (" (few prompts)" if n < 20 else ""))
    assert set(table.config) == {ids(catalog_env)[2]}
    assert "No jobs yet" in text_of(at)
    assert "Loads: not compared with transformers" in text_of(at)  # a built-in model
    # periodic maps through training (issue 34): the chart is drawn from these shares,
    # per step and axis, equal to the bits counted here
    assert any("Periodic maps through training" in c.proto.spec
               for c in at.get("plotly_chart"))
    from ui import data

    model_id = ids(catalog_env)[0]
    shares = data.periodic_through_training.__wrapped__(model_id)
    with store.connect(catalog_env) as conn:
        want = conn.execute(
            "SELECT c.step, count(*) FILTER (WHERE (n.spec_helix & 1) <> 0), count(*) "
            "FROM neuron_op n JOIN checkpoint c ON c.id = n.checkpoint_id "
            "WHERE n.spec_helix IS NOT NULL AND NOT coalesce(n.constant, false) "
            "GROUP BY c.step ORDER BY c.step").fetchall()
    op1 = shares[shares.axis == "op1"].sort_values("step")
    assert list(zip(op1.step, op1.n_periodic, op1.n_live, strict=True)) == \
        [tuple(r) for r in want]
    np.testing.assert_allclose(op1.share, [k / n for _, k, n in want])
    # the report of the chosen checkpoint, built on demand (ncat report's numbers)
    at.button(key=next(b.key for b in at.button if b.key.startswith("repb-"))).click().run()
    assert not at.exception, [e.value for e in at.exception]
    summary = next(e for e in at.expander if e.label == "Summary (Markdown)")
    md = "\n".join(m.value for m in summary.markdown)
    assert "step 300" in md and "91%" in md and f"| + | {float(acc):.3f} |" in md


def test_search_counts_up_to_a_cap_and_pages_that_far(catalog_env, monkeypatch):
    """Past COUNT_CAP matching rows the search says "more than" instead of counting every
    row of the checkpoint, and pages as far as it counted; under it, the count is exact."""
    from ui import data

    with store.connect(catalog_env) as conn:
        total = conn.execute("SELECT count(*) FROM neuron_op n JOIN checkpoint c ON "
                             "c.id = n.checkpoint_id WHERE c.step = 300").fetchone()[0]
    assert total > 150
    monkeypatch.setattr(data, "COUNT_CAP", 120)
    at = run_page("search")
    assert "**More than 120** neuron-operator rows match; page 1 of the first 3" in text_of(at)
    for page in (2, 3):
        at.button(key="s-next").click().run()
        assert f"page {page} of the first 3" in text_of(at)
    # the last page is full (the page query is not capped), and there is no next one
    assert at.button(key="s-next").disabled and len(at.dataframe[0].value) == 50
    monkeypatch.setattr(data, "COUNT_CAP", total)  # just enough: exact
    at = run_page("search")
    assert f"**{total}** neuron-operator rows match" in text_of(at)


INDEX_OF_SORT = {"effect": ("effect_size", "config_id_abs_idx"),
                 "rank": ("rank_order", "config_id_rank_idx", "op_rank_idx"),
                 "score": ("score_order", "best_score_la_idx"),  # 0018: + layer, neuron, op
                 "neuron": ("pkey",)}


@pytest.mark.parametrize("sort", list(INDEX_OF_SORT))
@pytest.mark.parametrize("op", [None, "*"])
def test_every_search_order_reads_an_index_not_a_sort(catalog_env, sort, op):
    """Each order of the search page comes from an index of (model, checkpoint, config,
    that order): by effect size ix_neuron_op_effect_size (0016), by rank and by best score
    ix_neuron_op_rank_order / _score_order (0017, 0018), by neuron the primary key; never from
    sorting every row of the checkpoint (363 ms against 0.2 ms at Pythia-1.4B's width).
    The capped count reads no further than the cap."""
    import json

    from sqlalchemy import text

    from ui import data

    assert set(INDEX_OF_SORT) == set(data.SORTS)
    model_id, checkpoint_id, config_id = ids(catalog_env)
    f = data.Filters(model_id=model_id, checkpoint_id=checkpoint_id, config_id=config_id,
                     op=op, sort=sort)
    count, rows, params = data.search_sql(f, 0, 50, 100)
    with data.engine().connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))  # the test catalog fits in a page
        conn.execute(text("SET enable_bitmapscan = off"))
        plan = json.dumps(conn.execute(text("EXPLAIN (FORMAT JSON) " + rows), params).scalar())
        counted = conn.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + count),
                               params).scalar()[0]["Plan"]
    assert any(name in plan for name in INDEX_OF_SORT[sort]), plan
    assert '"Sort Key"' not in plan or '"Presorted Key"' in plan, plan  # no full sort
    if sort in ("score", "neuron"):
        # ties sorted by nobody: the index holds the page's whole order (0018), so a
        # checkpoint whose best scores are all NULL, one tie, is not sorted either
        assert '"Sort Key"' not in plan, plan
    if op is None:
        assert counted["Plans"][0]["Node Type"] == "Limit"
        assert counted["Plans"][0]["Actual Rows"] == 101  # more match: counting stopped


def test_search_filters_and_pages_server_side(catalog_env):
    at = run_page("search")
    first = at.dataframe[0].value
    assert len(first) == 50  # one page, not the table
    with store.connect(catalog_env) as conn:
        total = conn.execute("SELECT count(*) FROM neuron_op n JOIN checkpoint c ON "
                             "c.id = n.checkpoint_id WHERE c.step = 300").fetchone()[0]
    assert f"**{total}** neuron-operator rows match" in text_of(at)
    eff = first.effect  # the config's ranking statistic, sorted by size
    known = eff.dropna()
    assert len(known) > 0 and known.abs().is_monotonic_decreasing
    assert eff.isna().to_numpy()[len(known):].all()  # NULLS LAST: no value after a NaN
    with store.connect(catalog_env) as conn:
        top = [r[0] for r in conn.execute(
            "SELECT n.rank_value FROM neuron_op n JOIN checkpoint c ON c.id = n.checkpoint_id "
            "WHERE c.step = 300 ORDER BY abs(n.rank_value) DESC NULLS LAST, n.layer, n.neuron, "
            "n.op LIMIT 50").fetchall()]
    np.testing.assert_allclose(eff.to_numpy(dtype=float),
                               np.array([np.nan if v is None else v for v in top], dtype=float),
                               rtol=1e-6)
    # each row's best heuristic with its base rate and p-value (issue 50.5: a broad set
    # ranked like a specific one), the stored ones
    cols = list(first.columns)
    assert cols.index("best_base_rate") == cols.index("best_score") + 1
    with store.connect(catalog_env) as conn:
        for r in first.head(10).itertuples():
            if r.best_heuristic is None:
                assert np.isnan(r.best_base_rate)
                continue
            base, p = conn.execute(
                "SELECT s.base_rate, s.p_value FROM neuron_score s JOIN neuron_op n USING "
                "(model_id, checkpoint_id, config_id, layer, neuron, op) JOIN checkpoint c "
                "ON c.id = n.checkpoint_id WHERE c.step = 300 AND n.layer = %s AND "
                "n.neuron = %s AND n.op = %s AND s.heuristic_id = n.best_heuristic_id",
                (r.layer, r.neuron, r.op)).fetchone()
            assert r.best_base_rate == pytest.approx(base, nan_ok=True)
            assert r.best_p_value == pytest.approx(p, nan_ok=True)
    assert first.best_base_rate.notna().any()
    # stable links: model name, step and config, never the database ids (issue 50; the
    # config always, issue 81)
    assert first.open.str.startswith("/neuron?model=builtin-arith").all()
    assert first.open.str.contains("&step=300&config=[0-9a-f]{12}&layer=", regex=True).all()
    # filter: operator +, heuristic label, min score
    at.selectbox(key="s-op").select("+").run()
    at.text_input(key="s-label").input("result in [10, 20)").run()
    at.number_input(key="s-score").set_value(0.5).run()
    rows = at.dataframe[0].value if at.dataframe else None
    with store.connect(catalog_env) as conn:
        want = conn.execute(
            "SELECT count(DISTINCT (s.layer, s.neuron)) FROM neuron_score s JOIN heuristic h ON "
            "h.id = s.heuristic_id JOIN checkpoint c ON c.id = s.checkpoint_id WHERE c.step = 300 "
            "AND s.op = '+' AND h.label ILIKE '%result in [10, 20)%' AND s.score >= 0.5"
        ).fetchone()[0]
    assert f"**{want}** neuron-operator rows match" in text_of(at)
    if want:
        assert (rows.op == "+").all() and len(rows) == min(want, 50)
    at.selectbox(key="s-op").select("any").run()
    at.text_input(key="s-label").input("").run()
    at.number_input(key="s-score").set_value(0.0).run()
    at.button(key="s-next").click().run()
    second = at.dataframe[0].value
    seen = set(zip(first.layer, first.neuron, first.op, strict=True))
    assert "page 2 of" in text_of(at)
    assert not seen & set(zip(second.layer, second.neuron, second.op, strict=True))


def test_search_filters_periodic_maps_by_axis_and_period(catalog_env):
    """Issue 34's period filter: the rows whose packed spectrum has the axis's bit, and
    with a period, whose packed period is it (counted here from the table directly). The
    tiny model has next to no periodic maps (catalog 0.9.0: none at its last step, a few
    at step 64, about the null's 1%): the search looks at the first step with some."""
    with store.connect(catalog_env) as conn:
        step = conn.execute("SELECT min(c.step) FROM neuron_op n JOIN checkpoint c "
                            "ON c.id = n.checkpoint_id WHERE (n.spec_helix & 15) <> 0"
                            ).fetchone()[0]
    assert step is not None
    at = run_page("search")
    at.sidebar.selectbox(key="search-step").select(step).run()

    def count(where: str) -> int:
        with store.connect(catalog_env) as conn:
            return conn.execute(
                "SELECT count(*) FROM neuron_op n JOIN checkpoint c ON c.id = n.checkpoint_id "
                f"WHERE c.step = {step} AND {where}").fetchone()[0]
    any_axis = count("(n.spec_helix & 15) <> 0")
    assert any_axis > 0
    at.selectbox(key="s-periodic").select("any").run()
    assert f"**{any_axis}** neuron-operator rows match" in text_of(at)
    with store.connect(catalog_env) as conn:
        axis, period = conn.execute(  # the commonest (axis, period) of that step
            "SELECT a.axis, a.spec / 300 FROM neuron_op n JOIN checkpoint c ON "
            "c.id = n.checkpoint_id CROSS JOIN LATERAL (VALUES ('op1', 1, n.op1_spec), "
            "('op2', 2, n.op2_spec), ('result', 4, n.result_spec), ('kv', 8, n.kv_spec)) "
            "AS a(axis, bit, spec) "
            f"WHERE c.step = {step} AND (n.spec_helix & a.bit) <> 0 "
            "GROUP BY 1, 2 ORDER BY count(*) DESC, 1, 2 LIMIT 1").fetchone()
    bit = {"op1": 1, "op2": 2, "result": 4, "kv": 8}[axis]
    want = count(f"(n.spec_helix & {bit}) <> 0 AND n.{axis}_spec / 300 = {period}")
    at.selectbox(key="s-periodic").select(axis).run()
    at.number_input(key="s-period").set_value(period).run()
    assert 0 < want < any_axis + 1
    assert f"**{want}** neuron-operator rows match" in text_of(at)
    rows = at.dataframe[0].value
    assert len(rows) == min(want, 50)


def test_neuron_page_shows_grids_lens_matches_and_evolution(catalog_env):
    model_id, ck, config_id = ids(catalog_env)
    at = run_page("neuron", dict(model_id=model_id, checkpoint_id=ck, config_id=config_id,
                                 layer=1, neuron=5))
    charts = at.get("plotly_chart")
    titles = [c.proto.spec for c in charts]
    assert sum('"K map' in t for t in titles) == 4
    assert any('"KV map' in t for t in titles)
    assert any("Patching effect" in t for t in titles) and any("Best heuristic" in t
                                                                for t in titles)
    assert any("logit-lens value" in t for t in titles)
    facts = at.dataframe[0].value  # a row per fact, a column per operator in their order
    assert list(facts.columns) == ["fact", "+", "-", "*", "/", "what it means"]
    with store.connect(catalog_env) as conn:
        rank = conn.execute("SELECT rank FROM neuron_op WHERE checkpoint_id = %s AND layer = 1 "
                            "AND neuron = 5 AND op = '+'", (ck,)).fetchone()[0]
    assert facts.set_index("fact").loc["rank in the layer", "+"] == str(rank)
    with store.connect(catalog_env) as conn:
        n = conn.execute("SELECT count(*) FROM neuron_score WHERE checkpoint_id = %s AND "
                         "layer = 1 AND neuron = 5", (ck,)).fetchone()[0]
        best = conn.execute("SELECT h.label FROM neuron_score s JOIN heuristic h ON "
                            "h.id = s.heuristic_id WHERE checkpoint_id = %s AND layer = 1 AND "
                            "neuron = 5 ORDER BY implements DESC, score DESC, h.label "
                            "LIMIT 1", (ck,)).fetchone()
    tables = [d.value for d in at.dataframe]
    match_table = next(t for t in tables if "label" in t.columns)
    assert len(match_table) == min(n, 200) and match_table.label.iloc[0] == best[0]
    # the periodic structure (issue 34): a row per operator and axis, as the view has it
    spectrum = next(t for t in tables if "axis" in t.columns)
    with store.connect(catalog_env) as conn:
        want = conn.execute(
            "SELECT op, op1_period, op1_periodic, result_period, helix_r2 FROM neuron_spectrum "
            "WHERE checkpoint_id = %s AND layer = 1 AND neuron = 5", (ck,)).fetchall()
    assert want
    got = spectrum.set_index(["operator", "axis"])
    for op, period, periodic, result_period, helix in want:
        assert got.loc[(op, "op1"), "period"] == period
        assert bool(got.loc[(op, "op1"), "periodic"]) == periodic
        assert got.loc[(op, "result"), "period"] == result_period
        assert got.loc[(op, "result"), "helix R^2"] == pytest.approx(helix)
    # grids carry NaN where a cell is invalid (blank in the heatmap): '-' needs b <= a
    from ui import data

    grid = data.grid(model_id, ck, config_id, 1, 5, op="-")
    assert np.isnan(grid[2, 3]) and not np.isnan(grid[3, 2])


def test_neuron_page_without_parameters_says_what_to_do(catalog_env):
    at = run_page("neuron")
    assert "Open a neuron from the search page" in text_of(at)


def _model_name(url) -> str:
    with store.connect(url) as conn:
        return conn.execute("SELECT name FROM model").fetchone()[0]


@pytest.mark.parametrize("page, where", [("heuristics", "every checkpoint"),
                                         ("circuits", "step 300"), ("search", "step 300")])
def test_every_page_names_the_model_checkpoint_and_config_it_shows(catalog_env, page, where):
    """Issue 32: the sidebar's choices are named on the page itself."""
    _, _, config_id = ids(catalog_env)
    at = run_page(page)
    captions = [c.value for c in at.caption]
    want = f"{_model_name(catalog_env)} · {where} · measurement config #{config_id}:"
    assert any(c.startswith(want) for c in captions), captions


def test_heuristics_page(catalog_env):
    import json

    from reports.plots import family_colors

    at = run_page("heuristics")
    charts = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("Circuit neurons implementing" in c for c in charts)
    assert any("already present" in c for c in charts)
    # one colour per family in both bar charts (range and value had swapped colours)
    seen: dict[str, set] = {}
    for spec in charts:
        for trace in json.loads(spec)["data"]:
            if trace.get("type") == "bar" and trace.get("name") in family_colors():
                seen.setdefault(trace["name"], set()).add(trace["marker"]["color"])
    assert len(seen) >= 2, seen
    assert all(colors == {family_colors()[f]} for f, colors in seen.items()), seen
    overlap = at.dataframe[0].value
    assert overlap.step.tolist() == [64, 128, 300] and overlap.share.iloc[-1] == 1


def test_circuits_page_shows_component_effects_and_the_stored_curves(catalog_env):
    at = run_page("circuits")
    charts = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("Whole-MLP effect at the last position" in c for c in charts)
    assert any("each head's effect at the last position" in c for c in charts)
    assert any("protocol paper: faithfulness (nl)" in c for c in charts)
    model_id, checkpoint_id, config_id = ids(catalog_env)

    def stored(metric):
        with store.connect(catalog_env) as conn:
            return conn.execute(
                "SELECT circuit, k, ratio_of_means FROM circuit_point WHERE model_id = %s "
                "AND checkpoint_id = %s AND config_id = %s AND op = '+' AND metric = %s "
                "AND protocol = 'paper' ORDER BY array_position(ARRAY['ranked', 'random', "
                "'reversed']::text[], circuit::text), k",
                (model_id, checkpoint_id, config_id, metric)).fetchall()

    for metric in ("nl", "logprob"):
        if metric != "nl":
            at.selectbox(key="circuits-metric").set_value(metric).run()
        points = at.dataframe[0].value  # the paper protocol's points (one protocol)
        want = stored(metric)
        assert len(points) == len(want) == 3 * 7
        assert list(zip(points.circuit, points.k, strict=True)) == [(c, k) for c, k, _ in want]
        np.testing.assert_allclose(points["ratio of means"], [v for *_, v in want], rtol=1e-6)
    assert "first heuristics layer 1 (rule)" in text_of(at)


@pytest.mark.parametrize("sql, message", [
    ("INSERT INTO catalog_setting VALUES ('x', 1)", "read-only"),
    ("UPDATE catalog_setting SET value = 0", "read-only"),
    ("DELETE FROM heuristic", "read-only"),
    ("DROP TABLE heuristic", "read-only"),
    ("SELECT 1; DROP TABLE heuristic", "One statement at a time"),
    ("WITH x AS (DELETE FROM heuristic RETURNING id) SELECT * FROM x", "writes are refused"),
])
def test_sql_console_refuses_writes(catalog_env, sql, message):
    with store.connect(catalog_env) as conn:
        before = conn.execute("SELECT count(*) FROM heuristic").fetchone()[0]
    at = run_page("sql_console")
    at.text_area[0].input(sql).run()
    at.button[0].click().run()
    assert at.error and message in at.error[0].value
    with store.connect(catalog_env) as conn:
        assert conn.execute("SELECT count(*) FROM heuristic").fetchone()[0] == before
        assert conn.execute("SELECT count(*) FROM catalog_setting").fetchone()[0] == 2


def test_sql_console_runs_a_query_with_a_row_cap(catalog_env, monkeypatch):
    from ui import data

    monkeypatch.setattr(data, "SQL_ROW_CAP", 7)
    at = run_page("sql_console")
    at.text_area[0].input("SELECT step FROM checkpoint ORDER BY step").run()
    at.button[0].click().run()
    assert at.dataframe[0].value.step.tolist() == [64, 128, 300]
    at.text_area[0].input("SELECT id FROM heuristic ORDER BY id").run()
    at.button[0].click().run()
    assert len(at.dataframe[0].value) == 7 and "first 7 rows" in at.warning[0].value


def test_jobs_page_shows_validation_errors(catalog_env):
    at = run_page("jobs_page")
    at.text_input[0].input("no-such-model")  # inside the form: sent with the submit
    at.button[0].click().run()
    assert at.error and "unknown model 'no-such-model'" in at.error[0].value
    with store.connect(catalog_env) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone()[0] == 0


def test_empty_catalog_says_how_to_start(db, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", db)
    from ui import data

    data.database_url.clear()
    data.engine.clear()
    data.has_catalog.clear()
    data.models.clear()
    for page in ("overview", "search", "heuristics"):
        at = run_page(page)
        assert "bash scripts/demo.sh" in text_of(at), page


PAGES = ("overview", "search", "neuron", "prompt", "heuristics", "circuits", "training",
         "sql_console", "jobs_page")


@pytest.mark.parametrize("url, says", [
    ("postgresql://postgres@127.0.0.1:1/ncat", "no PostgreSQL answers at"),
    ("postgresql://no_such_role@localhost:5432/postgres",
     'refused the login: role "no_such_role" does not exist'),
], ids=["down", "login refused"])
def test_every_page_says_the_catalog_cannot_be_reached_and_why(url, says, monkeypatch):
    """Issue 80.7: with the database down, the Jobs page showed a raw SQLAlchemy
    traceback and the Search page said "The catalog is empty". Every page now says the
    catalog cannot be reached, with the reason and no password, and nothing else."""
    monkeypatch.setenv("DATABASE_URL", url)
    from ui import data

    def forget() -> None:  # the explorer's cached URL, engine and answers
        for fn in (data.database_url, data.engine):
            fn.clear()
        for fn in (data.unreachable, data.has_catalog, data.models):
            fn.clear()

    forget()
    try:
        for page in PAGES:
            at = run_page(page)
            errors = [e.value for e in at.error]
            assert len(errors) == 1 and errors[0].startswith(
                "The catalog cannot be reached: ") and says in errors[0], (page, errors)
            assert "catalog is empty" not in text_of(at), page
            assert not at.dataframe, page
    finally:  # the next test's pages must not meet this URL (cached for the process)
        forget()


def test_engine_is_cached_and_job_progress_is_fresh(catalog_env):
    from ui import data

    from helpers import wait_until

    assert data.engine() is data.engine()
    data.jobs.clear()
    assert data.jobs().empty
    with store.connect(catalog_env) as conn:
        conn.execute("INSERT INTO job (job_key, model_name, step, config_id, layers, device, "
                     "force, status) SELECT 'k', 'm', 1, id, '{0}', 'cpu', false, 'queued' "
                     "FROM measure_config LIMIT 1")
        conn.commit()
    assert data.jobs().empty  # cached: the insert is not seen yet
    # fresh again once the cache's two seconds have passed: polled, not slept on
    wait_until(lambda: data.jobs().status.tolist() == ["queued"], timeout=30,
               what="the jobs query to see the new job")
    with store.connect(catalog_env) as conn:
        conn.execute("DELETE FROM job")
        conn.commit()


def test_pages_work_for_a_model_without_steps(db, tiny_builtin, monkeypatch):
    """A GGUF file or a local directory has one checkpoint with step NULL."""
    import dataclasses

    from catalog.sources import load_model
    from jobs.store_results import catalog_checkpoint
    from ui import data

    from helpers import SEED_CONFIG

    cfg, root = tiny_builtin
    lm = load_model("builtin", 300, builtin_config=cfg, cache_root=root)
    lm.info = dataclasses.replace(lm.info, name="/models/no-steps", source="local",
                                  checkpoint=None, revision=None)
    catalog_checkpoint(db, lm, SEED_CONFIG)
    monkeypatch.setenv("DATABASE_URL", db)
    data.database_url.clear()
    data.engine.clear()
    for fn in (data.has_catalog, data.models, data.search, data.checkpoints, data.configs,
               data.circuits):
        fn.clear()
    at = run_page("search")
    assert len(at.dataframe[0].value) == 50
    at = run_page("heuristics")
    assert "(no steps)" in [o for sb in at.sidebar.selectbox for o in sb.options]
    overview = run_page("overview")
    assert overview.dataframe[0].value.step.isna().all()


def test_sql_console_cuts_long_arrays_for_display_and_keeps_them_whole_for_the_csv(
        catalog_env):
    """A cell of 20,000 values cannot be read in a grid, and drawing ten sessions of them
    held the browser and the explorer's event loop: cells show the first 50 values and
    the count; short arrays and scalars are untouched."""
    import pandas as pd

    from ui.views.sql_console import PREVIEW, preview

    df = pd.DataFrame({"g": [1, 2], "xs": [list(range(20_000)), [0.5, 1.5]],
                       "short": [[1, 2], [3]]})
    shown, cut = preview(df)
    assert cut == ["xs"] and PREVIEW == 50
    assert shown["xs"][0] == "[" + ", ".join(map(str, range(50))) + ", ...] (20,000 values)"
    assert shown["xs"][1] == "[0.5, 1.5]"
    assert shown["short"].tolist() == [[1, 2], [3]] and shown["g"].tolist() == [1, 2]
    assert len(df["xs"][0]) == 20_000  # the frame the CSV is written from is unchanged
    at = run_page("sql_console")
    at.text_area[0].input("SELECT g, array_fill(0.5::float8, array[60]) AS xs "
                          "FROM generate_series(1, 2) g").run()
    at.button[0].click().run()
    assert at.dataframe[0].value["xs"].tolist()[0].endswith("...] (60 values)")
    assert "shown cut (xs)" in at.caption[-1].value


def test_the_prompt_page_prints_the_library_explanation(catalog_env, tiny_builtin,
                                                        monkeypatch):
    """The Prompt page, from a link: its answer, verdict and shares are explain()'s with
    the catalog's labels; each catalogued checkpoint gets a row across training."""
    from catalog.explain.holds import catalog_context
    from catalog.explain.prompt import explain, labels_from_rows
    from catalog.sources import load_model
    from schema.explanations import labels_at

    from helpers import SEED_CONFIG, SEED_STEPS

    cfg, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    model_id, checkpoint_id, config_id = ids(catalog_env)
    with store.connect(catalog_env) as conn:
        got = labels_at(conn, checkpoint_id=checkpoint_id, config_id=config_id, op="+")
    labels = labels_from_rows(got.rows)
    lm = load_model("builtin", SEED_STEPS[-1], builtin_config=cfg, cache_root=root)
    for prompt in ("13+6=", "9+9="):
        want = explain(lm.model, lm.tokenizer, prompt, SEED_CONFIG, labels=labels,
                       seeds=0, **catalog_context(got, lm.model, SEED_CONFIG))
        at = run_page("prompt", {"model_id": model_id, "checkpoint_id": checkpoint_id,
                                 "config_id": config_id, "prompt": prompt}, timeout=120)
        text = text_of(at)
        verdict = "Correct: greedy decoding writes" if want.correct else \
            "Wrong: greedy decoding does not write"
        assert verdict in text, text
        assert at.metric[0].value == str(want.result)
        assert at.metric[2].value == f"{want.shares['labelled, heuristic holds']:.0%} of T"
        across = at.dataframe[-1].value
        assert across.step.tolist() == list(SEED_STEPS)
        assert across.p_answer.iloc[-1] == pytest.approx(want.p_answer, rel=1e-5)
        assert bool(across.correct.iloc[-1]) == want.correct
