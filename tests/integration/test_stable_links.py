"""Stable explorer links (issue 50): a neuron's or a prompt's link names the model, step,
layer, neuron and config (a prefix of its hash), not database ids, so a link made on one
catalog opens the same neuron on another catalog of the same model, under the config it
was made under however many the catalog comes to hold (issue 81); old id links still open
and are rewritten."""

from urllib.parse import parse_qsl, urlparse

import pytest
from streamlit.testing.v1 import AppTest

from catalog.sources import load_model
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.engine import migrate

from helpers import SEED_CONFIG, SEED_STEPS, drop_database, new_database_url


def page_script(name):
    import importlib

    importlib.import_module(f"ui.views.{name}").render()


def _use(url, monkeypatch):
    """Point the explorer at the catalog ``url`` (its caches emptied)."""
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("NCAT_QUEUE", "explorer-tests-no-worker")
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()


def _page(name, params):
    at = AppTest.from_function(page_script, args=(name,), default_timeout=90)
    for k, v in params.items():
        at.query_params[k] = str(v)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _text(at) -> str:
    return "\n".join([m.value for m in at.markdown] + [m.value for m in at.caption]
                     + [m.value for m in at.warning] + [m.value for m in at.info])


@pytest.fixture(scope="module")
def second_catalog(pg_server, tiny_builtin):
    """The same model catalogued again, its checkpoints in another order: the last step's
    checkpoint gets another id than in the first catalog."""
    cfg, root = tiny_builtin
    url = new_database_url(pg_server)
    migrate(url)
    for step in (SEED_STEPS[-1], SEED_STEPS[1]):
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        catalog_checkpoint(url, lm, SEED_CONFIG)
    yield url
    drop_database(url)


def _ids(url, step):
    with store.connect(url) as conn:
        return conn.execute(
            "SELECT c.model_id, c.id, lr.config_id FROM checkpoint c JOIN layer_result lr ON "
            "lr.checkpoint_id = c.id WHERE c.step = %s LIMIT 1", (step,)).fetchone()


def test_a_link_from_one_catalog_opens_the_same_neuron_in_another(seeded, second_catalog,
                                                                    tiny_builtin, monkeypatch):
    step = SEED_STEPS[-1]
    first, second = _ids(seeded, step), _ids(second_catalog, step)
    assert first[1] != second[1]  # the ids differ: an id link would open another checkpoint
    _use(seeded, monkeypatch)
    search = _page("search", {})
    link = search.dataframe[0].value.open.iloc[0]
    query = dict(parse_qsl(urlparse(link).query))
    assert urlparse(link).path == "/neuron"
    assert set(query) >= {"model", "step", "layer", "neuron"} and "model_id" not in query
    # the config is named even where the catalog holds one: it may come to hold more
    assert query["step"] == str(step) and query["config"] == SEED_CONFIG.config_hash()[:12]

    _use(second_catalog, monkeypatch)
    at = _page("neuron", query)
    layer, neuron = int(query["layer"]), int(query["neuron"])
    assert f"Layer {layer}, neuron {neuron}" in [s.value for s in at.subheader]
    assert f"step {step}" in _text(at)
    facts = at.dataframe[0].value.set_index("fact")
    with store.connect(second_catalog) as conn:
        rank = conn.execute(
            "SELECT rank FROM neuron_op WHERE checkpoint_id = %s AND layer = %s AND "
            "neuron = %s AND op = '+'", (second[1], layer, neuron)).fetchone()[0]
    assert facts.loc["rank in the layer", "+"] == str(rank)
    # the prompt page's links are stable too (it loads the model: the tests' home)
    monkeypatch.setenv("NCAT_HOME", str(tiny_builtin[1].parent))
    prompt = _page("prompt", {"model": query["model"], "step": step, "prompt": "3+4="})
    assert "(from the link)" in _text(prompt)


def test_an_old_id_link_opens_and_is_rewritten(seeded, monkeypatch):
    _use(seeded, monkeypatch)
    model_id, checkpoint_id, config_id = _ids(seeded, SEED_STEPS[0])
    at = _page("neuron", {"model_id": model_id, "checkpoint_id": checkpoint_id,
                          "config_id": config_id, "layer": 1, "neuron": 3})
    assert "Layer 1, neuron 3" in [s.value for s in at.subheader]
    # the address bar now holds the stable form
    params = {k: at.query_params[k] for k in at.query_params}
    assert not {"model_id", "checkpoint_id", "config_id"} & set(params), params
    assert (params["model"], params["step"], params["layer"], params["neuron"]) == (
        _name(seeded), str(SEED_STEPS[0]), "1", "3")


def _name(url):
    with store.connect(url) as conn:
        return conn.execute("SELECT name FROM model").fetchone()[0]


def test_a_link_to_a_checkpoint_this_catalog_lacks_says_so(second_catalog, monkeypatch):
    _use(second_catalog, monkeypatch)
    name = _name(second_catalog)
    at = _page("neuron", {"model": name, "step": SEED_STEPS[0], "layer": 1, "neuron": 3})
    assert f"this catalog has no {name} at step {SEED_STEPS[0]}" in _text(at)
    at = _page("neuron", {"model": name, "step": "last", "layer": 1, "neuron": 3})
    assert "step 'last' is neither a number nor 'final'" in _text(at)


@pytest.mark.parametrize("page", ["circuits", "search"])
def test_a_checkpoint_link_opens_its_page_at_that_checkpoint(seeded, monkeypatch, page):
    """Pages about a checkpoint take the same stable names (?model=..&step=..): the
    sidebar starts at the linked checkpoint, not the last one."""
    _use(seeded, monkeypatch)
    name = _name(seeded)
    at = _page(page, {"model": name, "step": SEED_STEPS[0]})
    steps = [sb.value for sb in at.sidebar.selectbox if sb.label == "Checkpoint step"]
    assert steps == [SEED_STEPS[0]], steps
    assert f"{name} · step {SEED_STEPS[0]}" in _text(at)
    # without a link: the last checkpoint
    at = _page(page, {})
    assert [sb.value for sb in at.sidebar.selectbox
            if sb.label == "Checkpoint step"] == [SEED_STEPS[-1]]


def test_a_link_keeps_its_config_when_the_catalog_gains_another(seeded, pg_server,
                                                                tiny_builtin, monkeypatch):
    """A second config catalogued after a link was made (the notebook's, after the demo's):
    the link with its config opens that config; a link with none (made before links named
    it) opens the first catalogued config, says so, and the address then names it; a link
    naming the second config opens the second."""
    from catalog.config import ScienceConfig

    from helpers import copy_database

    url = new_database_url(pg_server)
    copy_database(seeded, url)
    try:
        migrate(url)
        step = SEED_STEPS[-1]
        first = _ids(url, step)
        cfg, root = tiny_builtin
        other = ScienceConfig(operand_hi=12, pairs_per_op=6, faithfulness_prompts=30)
        ids = catalog_checkpoint(url, load_model("builtin", step, builtin_config=cfg,
                                                 cache_root=root), other)
        assert ids.config_id != first[2]
        _use(url, monkeypatch)
        name = _name(url)
        where = {"model": name, "step": step, "layer": 1, "neuron": 3}
        for config, want in ((SEED_CONFIG.config_hash()[:12], first[2]),
                             (other.config_hash()[:12], ids.config_id)):
            at = _page("neuron", {**where, "config": config})
            assert f"measurement config #{want}:" in _text(at)
            assert "names no measurement config" not in _text(at)
        at = _page("neuron", where)  # an old link: no config
        text = _text(at)
        assert f"measurement config #{first[2]}:" in text
        assert "names no measurement config" in text and "holds 2" in text
        assert at.query_params["config"] == SEED_CONFIG.config_hash()[:12]
    finally:
        drop_database(url)
