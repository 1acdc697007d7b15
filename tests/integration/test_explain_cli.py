"""`ncat explain` and the catalog's labels behind it: the labels it reads from a catalogued
checkpoint are the labels the library measured, each label's "holds here" is its
heuristic's own membership test, and the command prints the decomposition as JSON (its
terms adding up) or refuses a bad prompt with exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from catalog.config import ScienceConfig
from catalog.explain.holds import Label
from catalog.explain.prompt import build, explain, labels_from_result
from catalog.labels.heuristics import Heuristic
from catalog.run.measurement import measure
from catalog.sources import load_model
from jobs.cli import main
from schema import store
from schema.explanations import catalogued_labels
from schema.store import json_safe

from helpers import SEED_CONFIG, SEED_STEPS


@pytest.fixture(scope="module")
def last(tiny_builtin):
    cfg, root = tiny_builtin
    return load_model("builtin", SEED_STEPS[-1], builtin_config=cfg, cache_root=root)


def test_the_catalogued_labels_are_the_measured_ones(seeded, last):
    direct = labels_from_result(measure(last.model, last.tokenizer, SEED_CONFIG,
                                        progress=False), "+")
    with store.connect(seeded) as conn:
        got = catalogued_labels(conn, model_name=last.info.name, step=last.info.checkpoint,
                                config_hash=SEED_CONFIG.config_hash(), op="+")
        other = catalogued_labels(conn, model_name=last.info.name, step=last.info.checkpoint,
                                  config_hash="0" * 64, op="+")
    assert other is None  # not catalogued under that config: no labels, said so
    assert got is not None
    rows, typical, typical_kv, rank = got
    assert len(rank) == 2 * 64 and min(rank.values()) == 0
    stored: dict = {}
    for layer, neuron, family, target, params, bottom in rows:
        stored.setdefault((layer, neuron), set()).add(
            Label(Heuristic(family, target, tuple(params)), bool(bottom)))
    assert stored == {k: set(v) for k, v in direct.items()}
    assert len(stored) > 0 and len(typical) == 2 * 64  # every (layer, neuron) of "+"
    # the KV map's mean is stored for every neuron that is not constant
    assert len(typical_kv) > 64 and set(typical_kv) <= set(typical)
    # explained with them: a label holds where its heuristic's membership test says the
    # prompt is in its set AND the neuron's value is on the label's side of its mean (the
    # activation for operand labels, the activation times the answer's lens for result
    # labels), computed here by hand
    labels = {k: sorted(v, key=lambda x: x.key) for k, v in stored.items()}
    e = explain(last.model, last.tokenizer, "7+9=", SEED_CONFIG, labels=labels,
                typical=typical, typical_kv=typical_kv, top=64, seeds=3)
    answer = int(build(last.model, last.tokenizer, "7+9=", SEED_CONFIG).answer)
    seen = {True: 0, False: 0}
    for r in e.toward + e.away:
        assert r.typical == pytest.approx(typical[(r.layer, r.neuron)])
        w = last.model.blocks[r.layer].mlp.W_out[r.neuron]
        kv = r.activation * float(w @ last.model.W_U[:, answer])
        for lab, x in zip(r.labels, labels.get((r.layer, r.neuron), []), strict=True):
            member = bool(x.heuristic.contains(np.array([7]), np.array([9]),
                                               np.array([16]))[0])
            value, ref = (kv, typical_kv.get((r.layer, r.neuron))) if x.direct \
                else (r.activation, typical[(r.layer, r.neuron)])
            on_side = ref is None or (value < ref if x.bottom else value > ref)
            assert (lab.label, lab.side, lab.holds) == (x.heuristic.label, x.side,
                                                        member and on_side)
            seen[lab.holds] += 1
    assert seen[True] > 0 and seen[False] > 0
    # a label holds on this prompt, so it has a knockout, with each control drawn 3 times
    ko = e.knockout
    assert ko is not None and ko.neurons
    assert len(ko.p_random) == 3 and len(ko.controls["unlabelled"].p) == 3


@pytest.mark.slow
def test_the_command_prints_the_decomposition_as_json(capsys, seeded):
    from catalog import builtin

    builtin.train(builtin.TrainConfig(), progress=False)  # the default model (cached)
    assert main(["explain", "builtin", "21+17=", "--hi", "100", "--json", "--quiet",
                 "--database-url", seeded]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["result"] == 38 and d["prompt"] == "21+17="
    assert "not catalogued under this config" in d["labels"]
    total = d["neurons_total"] + d["heads_total"] + d["embed"] + d["biases"]
    assert total == pytest.approx(d["target"], rel=1e-5)  # a float32 model
    assert sum(d["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    assert len(d["lens"]) == 2 and d["knockout"] is None
    assert d["toward"] and all(r["contribution"] > 0 for r in d["toward"])


@pytest.mark.slow
def test_several_prompts_share_one_model_load(capsys, monkeypatch, tmp_path, seeded):
    """Prompts as arguments and from a file (comments and blank lines skipped) are
    explained after one model load, one JSON object per line, each equal to the
    explanation of the same prompt asked alone; a bad prompt among them is refused
    before the model loads, named."""
    from catalog import builtin, sources

    builtin.train(builtin.TrainConfig(), progress=False)  # the default model (cached)
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return load_model(*args, **kwargs)

    monkeypatch.setattr(sources, "load_model", counting)
    listed = tmp_path / "prompts.txt"
    listed.write_text("# two more\n3+4=\n\n9*9=\n")
    flags = ["--hi", "100", "--json", "--quiet", "--seeds", "0", "--database-url", seeded]
    assert main(["explain", "builtin", "21+17=", "--prompts-file", str(listed), *flags]) == 0
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [d["prompt"] for d in got] == ["21+17=", "3+4=", "9*9="] and len(calls) == 1
    assert [d["result"] for d in got] == [38, 7, 81]
    assert main(["explain", "builtin", "3+4=", *flags]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["target"] == got[1]["target"] and alone["toward"] == got[1]["toward"]
    calls.clear()
    assert main(["explain", "builtin", "3+4=", "what is 2+2", *flags]) == 2
    assert "'what is 2+2'" in capsys.readouterr().err and not calls
    assert main(["explain", "builtin", "--quiet"]) == 2
    assert "no prompt given" in capsys.readouterr().err


@pytest.mark.parametrize("prompt, message", [("what is 2+2", "not an arithmetic prompt"),
                                             ("350+3=", "range \\[0, 300\\)")])
def test_a_bad_prompt_exits_2_with_the_reason(capsys, prompt, message):
    import re

    assert main(["explain", "builtin", prompt, "--quiet"]) == 2
    assert re.search(message, capsys.readouterr().err)


SEED_FLAGS = ["--hi", "20", "--pairs", "20", "--faithfulness-prompts", "40", "--spectra",
              "true"]


def test_stored_explanations_are_the_printed_ones_across_checkpoints(capsys, monkeypatch,
                                                                     seeded, tiny_builtin):
    """--store writes the explanation the command prints (the view reads it back), a
    prompt explained again replaces its row, and the prompt's rows at two checkpoints come
    back by step with the labels each checkpoint had. (The command's model is the seeded
    catalog's tiny built-in model, which no command-line name selects.)"""
    import catalog.sources
    from schema.explanations import across_checkpoints, stored_explanation

    cfg, root = tiny_builtin
    monkeypatch.setattr(catalog.sources, "load_model", lambda name, step, **kw: load_model(
        "builtin", step, builtin_config=cfg, cache_root=root))
    last = load_model("builtin", SEED_STEPS[-1], builtin_config=cfg, cache_root=root)
    printed = {}
    for step in (SEED_STEPS[0], SEED_STEPS[-1], SEED_STEPS[-1]):
        assert main(["explain", "builtin", "7+9=", "--checkpoint", str(step), "--json",
                     "--quiet", "--store", "--seeds", "3", "--database-url", seeded,
                     *SEED_FLAGS]) == 0
        printed[step] = json.loads(capsys.readouterr().out)
        assert "labels of" in printed[step]["labels"]
        assert "stored as prompt_explanation" in printed[step]["labels"]
    with store.connect(seeded) as conn:
        rows = conn.execute("SELECT step, prompt, result, correct, p_answer, target, "
                            "share_holds, neurons_80, p_knocked FROM prompt_explanations "
                            "WHERE model = %s ORDER BY step",
                            (last.info.name,)).fetchall()
        model_id, config_id, checkpoint_id = conn.execute(
            "SELECT model_id, config_id, checkpoint_id FROM prompt_explanation "
            "ORDER BY checkpoint_id DESC LIMIT 1").fetchone()
        whole = stored_explanation(conn, checkpoint_id=checkpoint_id, config_id=config_id,
                                   prompt="7+9=")
        series = across_checkpoints(conn, model_id=model_id, config_id=config_id,
                                    prompt="7+9=")
    assert [r[0] for r in rows] == [SEED_STEPS[0], SEED_STEPS[-1]]  # replaced, not doubled
    for (step, prompt, result, correct, p, t, share, n80, p_knocked) in rows:
        e = printed[step]
        assert (prompt, result, correct) == ("7+9=", 16, e["correct"])
        assert p == pytest.approx(e["p_answer"]) and t == pytest.approx(e["target"])
        assert share == pytest.approx(e["shares"]["labelled, heuristic holds"])
        assert n80 == e["n_for"]["80%"]
        assert (p_knocked is None) == (e["knockout"] is None)
    assert whole["toward"] == printed[SEED_STEPS[-1]]["toward"]
    assert [s["step"] for s in series] == [SEED_STEPS[0], SEED_STEPS[-1]]
    assert series[-1]["target"] == pytest.approx(printed[SEED_STEPS[-1]]["target"])


def test_the_summary_stores_the_prompts_explained(seeded, last):
    """The seeded run's summary holds the aggregate over its knockout prompts: the labels it
    counts are the catalogued ones, and it equals the aggregate of the same run measured
    again here (the library's summary, no database)."""
    with store.connect(seeded) as conn:
        agg = store.scalar(conn.execute(
            "SELECT s.prompt_explanations FROM checkpoint_summary s JOIN checkpoint c "
            "ON c.id = s.checkpoint_id WHERE c.step = %s", (SEED_STEPS[-1],)))
        rows = catalogued_labels(conn, model_name=last.info.name, step=last.info.checkpoint,
                                 config_hash=SEED_CONFIG.config_hash(), op="+").rows
    plus = agg["+"]
    assert plus["n_prompts"] > 10 and plus["layers"] == [0, 1]
    assert plus["n_labelled"] == len({(layer, neuron) for layer, neuron, *_ in rows})
    assert plus["n_neurons"] == 2 * 64
    k, n = plus["mostly_labelled"]["count"], plus["n_prompts"]
    lo, hi = plus["mostly_labelled"]["ci"]
    assert 0 <= k <= n and lo <= k / n <= hi
    again = measure(last.model, last.tokenizer, SEED_CONFIG, progress=False)
    assert again.summary is not None
    mine = again.summary.prompt_explanations["+"]
    assert (mine["n_prompts"], mine["mostly_labelled"]["count"]) == (n, k)
    for part, v in plus["shares"].items():
        assert mine["shares"][part]["median"] == pytest.approx(v["median"], rel=1e-6)
    assert mine["paired"]["higher_when_holds"] == plus["paired"]["higher_when_holds"]
    # what the label adds and the steering test are stored as the library computes them
    # (the same seeds, the same prompts)
    for ranking, k in plus["knockouts"].items():
        for control, stat in k["label_adds"].items():
            want = mine["knockouts"][ranking]["label_adds"][control]
            assert stat["adds"]["mean"] == pytest.approx(want["adds"]["mean"], abs=1e-6)
            assert stat["verdict"] == want["verdict"]
    assert set(plus["knockouts"]) == {"direct", "total", "paper"}
    assert plus["steering"] == json.loads(json.dumps(json_safe(mine["steering"])))


@pytest.fixture
def tiny_loads(monkeypatch, tiny_builtin):
    """(its catalog name, config, cache root): `ncat explain` loads the seeded catalog's
    tiny built-in model, whatever name it is given (the tiny model's cache is not in the
    home the command reads)."""
    import catalog.sources
    from catalog.builtin import model_name

    cfg, root = tiny_builtin
    monkeypatch.setattr(catalog.sources, "load_model", lambda name, step, **kw: load_model(
        "builtin", step, builtin_config=cfg, cache_root=root))
    return model_name(cfg), cfg, root


def test_without_flags_explain_takes_the_config_the_catalog_holds(capsys, tiny_loads,
                                                                  pg_server, seeded):
    """No measurement flag: the one config the catalog holds for the model (its range,
    not the library's default [0, 300), decides which prompts are accepted) and its
    labels; a second config catalogued: refused with both listed, each by the --config
    that picks it; --config by hash prefix or id; flags over --config override it."""
    from jobs.store_results import catalog_checkpoint

    from helpers import copy_database, drop_database, new_database_url

    name, cfg, root = tiny_loads
    base = ["--json", "--quiet", "--seeds", "0", "--checkpoint", str(SEED_STEPS[-1])]
    assert main(["explain", name, "7+9=", *base, "--database-url", seeded]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["config_hash"] == SEED_CONFIG.config_hash()
    assert "labels of" in d["labels"] and SEED_CONFIG.config_hash()[:12] in d["labels"]
    # the catalog's range [0, 20) holds, before any model loads
    assert main(["explain", name, "25+3=", *base, "--database-url", seeded]) == 2
    assert "[0, 20)" in capsys.readouterr().err
    url = new_database_url(pg_server)
    copy_database(seeded, url)
    try:
        other = ScienceConfig(operand_hi=12, pairs_per_op=6, faithfulness_prompts=30)
        lm = load_model("builtin", SEED_STEPS[-1], builtin_config=cfg, cache_root=root)
        catalog_checkpoint(url, lm, other, layers=[0])
        assert main(["explain", name, "7+9=", *base, "--database-url", url]) == 2
        err = capsys.readouterr().err
        assert "catalogued under 2 configs" in err
        for c in (SEED_CONFIG, other):
            assert f"--config {c.config_hash()[:12]}" in err
        assert main(["explain", name, "7+9=", *base, "--database-url", url,
                     "--config", other.config_hash()[:8]]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["config_hash"] == other.config_hash() and "labels of" in d["labels"]
        with store.connect(url) as conn:
            seed_id = store.scalar(conn.execute(
                "SELECT id FROM measure_config WHERE config_hash = %s",
                (SEED_CONFIG.config_hash(),)))
        assert main(["explain", name, "7+9=", *base, "--database-url", url,
                     "--config", str(seed_id)]) == 0
        assert json.loads(capsys.readouterr().out)["config_hash"] == SEED_CONFIG.config_hash()
        assert main(["explain", name, "7+9=", *base, "--database-url", url,
                     "--config", str(seed_id), "--pairs", "10"]) == 0
        d = json.loads(capsys.readouterr().out)
        import dataclasses

        assert d["config_hash"] == dataclasses.replace(SEED_CONFIG, pairs_per_op=10).config_hash()
        assert "not catalogued under this config" in d["labels"]
        assert main(["explain", name, "7+9=", *base, "--database-url", url,
                     "--config", "ffffffff"]) == 2
        assert "matches none" in capsys.readouterr().err
    finally:
        drop_database(url)


def test_ranks_count_from_one_and_the_stored_rows_of_before_are_shifted(
        capsys, tiny_loads, pg_server, seeded):
    """The printed and stored ranks count the top token as 1 (the answer's rank is the
    number of tokens above it plus one); migration 0039 shifts rows stored under the old
    count (0 = top) and its downgrade shifts them back."""
    import torch

    from catalog.explain.prompt import build
    from schema.engine import alembic_config
    from schema.explanations import stored_explanation

    from helpers import copy_database, drop_database, new_database_url

    name, cfg, root = tiny_loads
    url = new_database_url(pg_server)
    copy_database(seeded, url)
    try:
        assert main(["explain", name, "7+9=", "--json", "--quiet", "--seeds", "0",
                     "--store", "--database-url", url]) == 0
        d = json.loads(capsys.readouterr().out)
        lm = load_model("builtin", None, builtin_config=cfg, cache_root=root)
        p = build(lm.model, lm.tokenizer, "7+9=", SEED_CONFIG)
        with torch.no_grad():
            logits = lm.model(torch.as_tensor(p.tokens, dtype=torch.long)[None])[0, -1]
        assert d["rank_answer"] == int((logits > logits[p.answer]).sum()) + 1 >= 1
        assert min(rank for _, rank, _ in d["lens"]) >= 1
        assert d["written"] == lm.tokenizer.decode([int(logits.argmax())])

        def stored() -> tuple[int, int, list]:
            with store.connect(url) as conn:
                # this test's row: the module's catalog holds others' stored rows too
                row = conn.execute("SELECT rank_answer, checkpoint_id, config_id FROM "
                                   "prompt_explanation ORDER BY written_at DESC "
                                   "LIMIT 1").fetchone()
                e = stored_explanation(conn, checkpoint_id=row[1], config_id=row[2],
                                       prompt="7+9=")
            return row[0], e["rank_answer"], [r for _, r, _ in e["lens"]]

        now = (d["rank_answer"], d["rank_answer"], [r for _, r, _ in d["lens"]])
        assert stored() == now
        from alembic import command

        command.downgrade(alembic_config(url), "0038")
        assert stored() == (now[0] - 1, now[1] - 1, [r - 1 for r in now[2]])
        command.upgrade(alembic_config(url), "head")
        assert stored() == now
    finally:
        drop_database(url)
