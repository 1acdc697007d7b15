"""`ncat counterparts` on a catalog (issue 83): the match of two checkpoints of the tiny
built-in model stored row for row as the library computes it, the view naming both sides,
refusals that store nothing, and the explorer's neuron page listing the counterparts."""

import numpy as np
import pytest
from test_explorer import catalog_env, run_page  # noqa: F401

from schema import store

from helpers import SEED_CONFIG
from tiny_model import TINY


def _name():
    from catalog import builtin

    return builtin.model_name(TINY)


@pytest.fixture
def home(seeded, tiny_builtin, monkeypatch):
    _, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    monkeypatch.setenv("DATABASE_URL", seeded)
    return seeded


def _flags():
    """No measurement flag: the config the catalog holds for the model (SEED_CONFIG)."""
    return ["--quiet"]


def _rows(url):
    """What the table holds: its rows, each as stored."""
    with store.connect(url) as conn:
        return conn.execute("SELECT * FROM neuron_counterpart ORDER BY from_checkpoint_id, "
                            "to_checkpoint_id, layer, neuron").fetchall()


def test_a_stored_match_is_the_librarys_and_the_view_names_both_sides(home, capsys):
    from catalog.counterparts.match import counterparts, profiles
    from catalog.sources import load_model
    from jobs.cli import main

    name = _name()
    assert main(["counterparts", name, "--checkpoint", "300", "--in", f"{name}@128",
                 *_flags()]) == 0
    said = capsys.readouterr().out
    # the slow reference: the library on the same three checkpoints
    lms = {s: load_model(name, s) for s in (300, 128, 0)}
    prof = {s: profiles(lm.model, lm.tokenizer, SEED_CONFIG) for s, lm in lms.items()}
    want = counterparts(prof[300], prof[128], [prof[0]], 0.01)
    with store.connect(home) as conn:
        got = conn.execute(
            "SELECT layer, neuron, best_layer, best_neuron, best_similarity, "
            "one_to_one_layer, one_to_one_neuron, null_threshold, has_counterpart, "
            "same_index, model, step, other_step, null_models FROM neuron_counterparts "
            "ORDER BY layer, neuron").fetchall()
    n = TINY.n_layers * TINY.d_mlp
    assert len(got) == n == want["n"]
    neurons = prof[300].neurons.tolist()
    assert [list(r[:2]) for r in got] == neurons
    best = prof[128].neurons[want["match"].best]
    assert [list(r[2:4]) for r in got] == best.tolist()
    np.testing.assert_allclose([r[4] for r in got], want["match"].best_similarity, atol=1e-5)
    one = prof[128].neurons[want["match"].one_to_one]
    assert [list(r[5:7]) for r in got] == one.tolist()
    assert {round(r[7], 5) for r in got} == {round(want["threshold"], 5)}
    assert [r[8] for r in got] == want["has"].tolist()
    assert sum(r[9] for r in got) == int((best == prof[300].neurons).all(1).sum())
    assert {(r[10], r[11], r[12], r[13]) for r in got} == {(name, 300, 128, f"{name}@0")}
    assert f"{want['count']} of {n} neurons have a counterpart" in said
    # matching the same pair again replaces its rows; one layer again, that layer's only
    before = _rows(home)
    capsys.readouterr()
    assert main(["counterparts", name, "--checkpoint", "300", "--in", f"{name}@128",
                 "--layers", "1", "--json", *_flags()]) == 0
    import json

    figures = json.loads(capsys.readouterr().out)
    assert figures["rows"] == figures["n"] == TINY.d_mlp  # one layer's neurons
    assert figures["from"] == f"{name}@300" and figures["to"] == f"{name}@128"
    after = _rows(home)
    assert len(after) == n
    assert [r for r in after if r[3] == 0] == [r for r in before if r[3] == 0]


@pytest.mark.parametrize("args, says", [
    (["--in", "nosuch-model@3"], "unknown model 'nosuch-model'"),
    (["--in", "@3"], "--in '@3': write MODEL@STEP or MODEL"),
    (["--in", "{name}@128", "--level", "1.5"], "--level must be in (0, 1), got 1.5"),
    (["--in", "{name}@128", "--null", "/no/such/dir"], "does not exist"),
])
def test_bad_input_is_refused_and_nothing_is_stored(home, capsys, args, says):
    """Refused with exit 2 and a message naming what is wrong; what the table held (the
    rows of the test before, in this module's catalog) is untouched."""
    from jobs.cli import main

    name = _name()
    args = [a.replace("{name}", name) for a in args]
    before = _rows(home)
    assert main(["counterparts", name, "--checkpoint", "300", *args, *_flags()]) == 2
    assert says in capsys.readouterr().err
    assert _rows(home) == before


def test_the_neuron_page_lists_its_counterparts_linked(home, catalog_env):  # noqa: F811
    from jobs.cli import main

    name = _name()
    assert main(["counterparts", name, "--checkpoint", "300", "--in", f"{name}@64",
                 *_flags()]) == 0
    with store.connect(home) as conn:
        model_id, ck, config_id, layer, neuron, bl, bn, sim = conn.execute(
            "SELECT v.model_id, v.from_checkpoint_id, v.config_id, v.layer, v.neuron, "
            "v.best_layer, v.best_neuron, v.best_similarity FROM neuron_counterparts v "
            "JOIN neuron_op o ON o.checkpoint_id = v.from_checkpoint_id AND "
            "o.layer = v.layer AND o.neuron = v.neuron ORDER BY v.layer, v.neuron "
            "LIMIT 1").fetchone()
    at = run_page("neuron", dict(model_id=model_id, checkpoint_id=ck, config_id=config_id,
                                 layer=layer, neuron=neuron))
    assert any("Counterparts in other checkpoints" in m.value for m in at.markdown)
    table = next(d.value for d in at.dataframe if "best match" in d.value.columns)
    row = table.iloc[0]
    assert row.checkpoint == f"{name} step 64"
    assert row.neuron == f"L{bl} N{bn}" and row.similarity == pytest.approx(sim, abs=1e-6)
    assert row["best match"].startswith("/neuron?") and "step=64" in row["best match"] \
        and f"layer={bl}" in row["best match"] and f"neuron={bn}" in row["best match"]


def test_the_report_section_counts_what_the_table_holds(home, tmp_path):
    """`ncat report`'s counterparts section (issue 83): per checkpoint matched, the neurons
    with a counterpart, one-to-one partners beyond the null and same indices; per family
    the labelled neurons, those with a counterpart, those whose counterpart carries the
    family, and the family's share of the other checkpoint's neurons; each equal to a count
    in Python over the stored rows and labels. A checkpoint never matched from says so."""
    from jobs.cli import main
    from reports.counterparts import markdown
    from schema.report_reads import gather_report

    name = _name()
    assert main(["counterparts", name, "--checkpoint", "300", "--in", f"{name}@128",
                 *_flags()]) == 0
    with store.connect(home) as conn:
        pairs = conn.execute(
            "SELECT other_step, layer, neuron, best_layer, best_neuron, has_counterpart, "
            "same_index, one_to_one_similarity, null_threshold FROM neuron_counterparts "
            "WHERE model = %s AND step = 300", (name,)).fetchall()
        carried: dict = {}
        for step, layer, neuron, family in conn.execute(
                "SELECT DISTINCT c.step, s.layer, s.neuron, h.family FROM neuron_score s "
                "JOIN heuristic h ON h.id = s.heuristic_id JOIN checkpoint c ON "
                "c.id = s.checkpoint_id WHERE s.implements"):
            carried.setdefault((step, layer, neuron), set()).add(family)
        size = dict(conn.execute(
            "SELECT c.step, count(DISTINCT (n.layer, n.neuron)) FROM neuron_op n "
            "JOIN checkpoint c ON c.id = n.checkpoint_id GROUP BY c.step").fetchall())
    got = {r["step"]: r for r in gather_report(home, name, 300).counterparts}
    assert set(got) == {p[0] for p in pairs} and 128 in got
    labelled_seen = 0
    for step, r in got.items():
        mine = [p for p in pairs if p[0] == step]
        assert r["n"] == len(mine) and r["model"] == name
        assert r["has"] == sum(p[5] for p in mine)
        assert r["same_index"] == sum(p[6] for p in mine)
        assert r["one_to_one"] == sum(p[7] is not None and p[7] > p[8] for p in mine)
        families = {f for p in mine for f in carried.get((300, p[1], p[2]), ())}
        assert set(r["families"]) == families
        for f in families:
            own = [p for p in mine if f in carried.get((300, p[1], p[2]), ())]
            with_cp = [p for p in own if p[5]]
            same = [p for p in with_cp if f in carried.get((step, p[3], p[4]), ())]
            carriers = sum(f in v for k, v in carried.items() if k[0] == step)
            assert r["families"][f] == {"labelled": len(own),
                                        "with_counterpart": len(with_cp),
                                        "same_family": len(same),
                                        "base_rate": pytest.approx(carriers / size[step])}
            labelled_seen += len(own)
    assert labelled_seen > 0  # the families' counts were compared on labelled neurons
    text = "\n".join(markdown(list(got.values())))
    r = got[128]
    assert f"| {name}@128 | [0, 1] | {r['n']} | {r['has']}/{r['n']} = " in text
    assert "No counterparts stored" in "\n".join(markdown(
        gather_report(home, name, 128).counterparts))
    # the whole report, as `ncat report` writes it: the section in both files, the numbers
    # in the page's data
    import html
    import json
    import re

    from reports.report import render

    page, md = render(gather_report(home, name, 300), tmp_path)
    assert "## Counterparts in other runs and checkpoints" in md.read_text()
    data = json.loads(html.unescape(re.search(
        r"id='report-data'>(.*?)</script>", page.read_text(), re.S).group(1)))
    assert {c["step"]: c["has"] for c in data["counterparts"]} == {
        s: r["has"] for s, r in got.items()}
