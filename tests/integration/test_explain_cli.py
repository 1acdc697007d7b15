"""`ncat explain` and the catalog's labels behind it: the labels it reads from a catalogued
checkpoint are the labels the library measured, each label's "holds here" is its
heuristic's own membership test, and the command prints the decomposition as JSON (its
terms adding up) or refuses a bad prompt with exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from catalog.explain.prompt import explain, labels_from_result
from catalog.labels.heuristics import Heuristic
from catalog.run.measurement import measure
from catalog.sources import load_model
from jobs.cli import main
from schema import store
from schema.explain_reads import catalogued_labels

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
    rows, typical = got
    stored: dict = {}
    for layer, neuron, family, target, params in rows:
        stored.setdefault((layer, neuron), set()).add(Heuristic(family, target, tuple(params)))
    assert stored == {k: set(v) for k, v in direct.items()}
    assert len(stored) > 0 and len(typical) == 2 * 64  # every (layer, neuron) of "+"
    # explained with them: each label's verdict is its heuristic's membership test
    labels = {k: sorted(v, key=lambda h: h.key) for k, v in stored.items()}
    e = explain(last.model, last.tokenizer, "7+9=", SEED_CONFIG, labels=labels,
                typical=typical, top=64, seeds=3)
    seen = 0
    for r in e.toward + e.away:
        assert r.typical == pytest.approx(typical[(r.layer, r.neuron)])
        for lab, h in zip(r.labels, labels.get((r.layer, r.neuron), []), strict=True):
            want = bool(h.contains(np.array([7]), np.array([9]), np.array([16]))[0])
            assert (lab.label, lab.holds) == (h.label, want)
            seen += 1
    assert seen > 0
    assert e.knockout is None or len(e.knockout.p_random) == 3


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


@pytest.mark.parametrize("prompt, message", [("what is 2+2", "not an arithmetic prompt"),
                                             ("350+3=", "range \\[0, 300\\)")])
def test_a_bad_prompt_exits_2_with_the_reason(capsys, prompt, message):
    import re

    assert main(["explain", "builtin", prompt, "--quiet"]) == 2
    assert re.search(message, capsys.readouterr().err)
