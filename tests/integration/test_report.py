"""ncat report renders from a seeded catalog, and its numbers equal SQL over the same rows."""

import json
import math
import re

import numpy as np

from catalog.builtin import model_name
from jobs.cli import main
from reports.report import gather, markdown, numbers
from schema import store

from helpers import SEED_STEPS
from tiny_model import TINY


def test_report_numbers_equal_sql(seeded):
    name = model_name(TINY)
    d = gather(seeded, name, None, top_n=5)
    assert d.step == SEED_STEPS[-1]
    with store.connect(seeded) as conn:
        ids = conn.execute("SELECT c.id, c.model_id FROM checkpoint c JOIN model m ON "
                           "m.id = c.model_id WHERE m.name = %s AND c.step = %s",
                           (name, d.step)).fetchone()
        acc = store.scalar(conn.execute("SELECT accuracy FROM checkpoint_summary WHERE "
                                        "checkpoint_id = %s", (ids[0],)))
        assert d.accuracy == acc
        for op in d.config["operators"]:
            rows = conn.execute("SELECT layer, rank_value FROM neuron_op WHERE checkpoint_id "
                                "= %s AND op = %s", (ids[0], op)).fetchall()
            total = sum(abs(v) for _, v in rows)
            for layer in d.layers:
                want = sum(abs(v) for la, v in rows if la == layer) / total
                assert math.isclose(d.layer_share[op][layer], want, rel_tol=1e-6)
            top = conn.execute("SELECT layer, neuron FROM neuron_op WHERE checkpoint_id = %s "
                               "AND op = %s AND rank < 5", (ids[0], op)).fetchall()
            labelled = {(r[0], r[1]) for r in conn.execute(
                "SELECT DISTINCT layer, neuron FROM neuron_score WHERE checkpoint_id = %s AND "
                "op = %s AND implements", (ids[0], op))}
            assert d.top_labelled[op] == (sum((t in labelled) for t in top), len(top))
            n_all = conn.execute("SELECT count(*) FROM neuron_op WHERE checkpoint_id = %s AND "
                                 "op = %s", (ids[0], op)).fetchone()[0]
            assert d.all_labelled[op] == (len(labelled), n_all)
        best = conn.execute("SELECT op, layer, neuron FROM neuron_op WHERE checkpoint_id = %s "
                            "ORDER BY abs(rank_value) DESC LIMIT 1", (ids[0],)).fetchone()
        assert tuple(d.top_neurons[0][:3]) == tuple(best)
    assert len(d.grids) == len(d.top_neurons) == 6
    assert all(g.shape == (20, 20) and np.isfinite(g).any() for g in d.grids)
    md = markdown(d)
    for op, (k, n) in d.top_labelled.items():
        assert f"| {op} | {k}/{n} |" in md
    # the labels section's pooled shares say which layers they stand on
    with store.connect(seeded) as conn:
        stored = [r[0] for r in conn.execute(
            "SELECT DISTINCT layer FROM layer_result WHERE checkpoint_id = %s ORDER BY layer",
            (ids[0],))]
        n_layers = conn.execute("SELECT n_layers FROM model WHERE id = %s",
                                (ids[1],)).fetchone()[0]
    assert d.labels.layers == stored and d.labels.n_layers == n_layers
    if any(r["layer"] == "all" for r in d.labels.enrichment):
        assert f"({len(stored)} of {n_layers} measured)" in md


def test_report_prompts_section_is_the_stored_aggregate(seeded):
    """The prompts-explained rows print the summary's stored counts, intervals and base
    rate, and the prompt knockout its accuracies as counts with Wilson intervals."""
    from catalog.core.stats import wilson

    d = gather(seeded, model_name(TINY), None, top_n=5)
    with store.connect(seeded) as conn:
        stored, knock = conn.execute(
            "SELECT s.prompt_explanations, s.prompt_knockouts FROM checkpoint_summary s "
            "JOIN checkpoint c ON c.id = s.checkpoint_id JOIN model m ON m.id = c.model_id "
            "WHERE m.name = %s AND c.step = %s", (model_name(TINY), d.step)).fetchone()
    assert d.prompt_explanations == stored and set(stored) == set(d.config["operators"])
    md = markdown(d)
    assert "## Prompts explained" in md
    for op, e in stored.items():
        m = e["mostly_labelled"]
        lo, hi = m["ci"]
        assert (f"| {op} | {e['n_prompts']} | {m['count']}/{m['n']} [{lo:.2f}, {hi:.2f}] | "
                f"{100 * e['neuron_base_rate']:.1f}% of {e['n_neurons']} |") in md
        k = knock[op]
        n, acc = k["n_prompts"], k["acc_heuristic_knockout"]
        lo, hi = wilson(round(acc * n), n)
        assert f"{round(acc * n)}/{n} = {acc:.2f} [{lo:.2f}, {hi:.2f}]" in md
    assert numbers(d)["prompt_explanations"] == stored


def test_report_periodic_section_equals_the_stored_bits(seeded):
    """Issue 34: the report's periodic maps per layer and axis are the rows of neuron_op
    whose packed spectrum has that axis's bit, of its live rows with spectra (counted
    here from the table, not through the views the report reads), and the section shows
    each count."""
    name = model_name(TINY)
    # the tiny model has next to no periodic maps (catalog 0.9.0: none at its last step,
    # three at step 64, about what the null's 1% gives): the first step with some
    with store.connect(seeded) as conn:
        step = conn.execute(
            "SELECT min(c.step) FROM neuron_op n JOIN checkpoint c ON c.id = n.checkpoint_id "
            "JOIN model m ON m.id = c.model_id WHERE m.name = %s AND (n.spec_helix & 15) <> 0",
            (name,)).fetchone()[0]
    assert step is not None
    d = gather(seeded, name, step, top_n=5)
    with store.connect(seeded) as conn:
        ck = conn.execute("SELECT c.id FROM checkpoint c JOIN model m ON m.id = c.model_id "
                          "WHERE m.name = %s AND c.step = %s", (name, d.step)).fetchone()[0]
        want = {}
        for i, axis in enumerate(("op1", "op2", "result", "kv")):
            for layer, k, n in conn.execute(
                    f"SELECT layer, count(*) FILTER (WHERE (spec_helix & {1 << i}) <> 0), "
                    "count(*) FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s "
                    "AND spec_helix IS NOT NULL AND NOT coalesce(constant, false) "
                    "GROUP BY layer", (ck, d.config_id)):
                want[(layer, axis)] = [k, n]
    assert d.periodic.counts == want and sum(k for k, _ in want.values()) > 0
    md = markdown(d)
    assert "## Periodic structure" in md
    for k, n in want.values():
        assert f"{k}/{n}" in md
    assert numbers(d)["periodic"]["counts"] == {f"{la}/{x}": v
                                                for (la, x), v in sorted(want.items())}


def test_ncat_report_writes_html_and_markdown(seeded, tmp_path, capsys):
    name = model_name(TINY)
    assert main(["report", name, "--checkpoint", str(SEED_STEPS[0]), "--out", str(tmp_path),
                 "--database-url", seeded]) == 0
    page = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    # self-contained: plotly.js inline (megabytes), no script loaded from elsewhere
    assert len(page) > 1_000_000 and not re.search(r"<script[^>]+src=", page)
    ops = md.split("operators ", 1)[1].split(",", 1)[0]  # "+-*/"
    # the layer shares, the MLP bars, per operator a head heatmap and one curve (one
    # protocol), six K maps; training: per operator the final circuit across steps, and the
    # shares per family
    assert page.count("Plotly.newPlot") == 2 + 2 * len(ops) + 6 + len(ops) + 1, ops
    n_ops = len(ops)
    # a page, not Markdown in a <pre>: its tables are HTML tables
    assert "<pre" not in page and page.count("<table>") >= 2 + 3 * n_ops
    assert "<h3><code>+</code>, protocol paper</h3>" in page
    data = json.loads(re.search(r"id='report-data'>(.*?)</script>", page, re.S).group(1)
                      .replace("&quot;", '"').replace("&#x27;", "'"))
    assert data["step"] == SEED_STEPS[0] and data["model"] == name
    assert f"step {SEED_STEPS[0]}" in md and "91%" in md
    # the load's check against transformers: none for the built-in model, the stored
    # difference where there is one (a hub model's row; set here, then put back)
    assert "not compared with transformers" in md
    from schema import store

    with store.connect(seeded, autocommit=True) as conn:
        conn.execute("UPDATE checkpoint SET transformers_nats = 0.00123 WHERE step = %s",
                     (SEED_STEPS[0],))
        try:
            assert main(["report", name, "--checkpoint", str(SEED_STEPS[0]), "--out",
                         str(tmp_path / "checked"), "--database-url", seeded]) == 0
        finally:
            conn.execute("UPDATE checkpoint SET transformers_nats = NULL")
    assert "within 0.0012 nats of transformers'" in (tmp_path / "checked" / "report.md"
                                                     ).read_text()
    assert main(["report", "no-such-model", "--out", str(tmp_path),
                 "--database-url", seeded]) == 2
    assert "not in the catalog" in capsys.readouterr().err


def test_report_circuits_equal_sql(seeded):
    """The circuits section: every point of every stored curve, as SQL reads it, with the
    protocol's construction and baselines; component effects per layer."""
    name = model_name(TINY)
    d = gather(seeded, name, None, top_n=5)
    c = d.circuits
    assert [s["protocol"] for s in c.summaries] == ["paper"] * len(d.config["operators"])
    md = markdown(d)
    with store.connect(seeded) as conn:
        rows = conn.execute(
            "SELECT op, k, mean_ratio, mean_ratio_se, ratio_of_means, ratio_of_means_se "
            "FROM circuit_curve WHERE model = %s AND step = %s AND circuit = 'ranked' "
            "AND metric = 'nl' AND protocol = 'paper' ORDER BY op, k",
            (name, d.step)).fetchall()
        assert len(rows) == len(d.config["operators"]) * 7  # the MIB levels of 64 neurons
        for op, k, mr, mr_se, rom, rom_se in rows:
            def pm(v, se):  # the report's rule: n/a for an undefined value, no ± without SE
                return ("n/a" if v is None else f"{v:.2f}") + \
                    ("" if se is None else f" ± {se:.2f}")
            assert f"| {k} | {k / 64:.2%} | {pm(mr, mr_se)} | {pm(rom, rom_se)} |" in md, (op, k)
            assert rom is not None, (op, k)  # the headline is defined on the tiny model
        mlp = dict(conn.execute(
            "SELECT layer, effect_log FROM component_effects WHERE model = %s AND step = %s "
            "AND op = '+' AND component = 'MLP' AND position = 'last'", (name, d.step)))
    got, heads = c.effects("+")
    np.testing.assert_allclose(got, [mlp[la] for la in range(len(got))], rtol=1e-6)
    assert heads.shape == (2, 2) and np.isfinite(heads).all()
    for s in c.summaries:  # MLP 0 is never pruned; the rule picks layer 1 of 2
        assert s["whole"] == [0] and s["pruned"] == [1] and s["late_from"] == 1
        assert f"### `{s['op']}`, protocol paper" in md
