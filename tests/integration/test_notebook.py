"""docs/notebook.ipynb, executed as a user would (a Jupyter kernel, nbclient) on the tiny
built-in model: every cell runs, the catalog holds what it stored, and the figure of a
neuron's evolution shows the stored effects."""

import base64
import json
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from catalog.builtin import model_name
from schema import store

from helpers import drop_database, new_database_url

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebook.ipynb"
STEPS = (64, 300)


@pytest.fixture
def notebook_db(pg_server):
    url = new_database_url(pg_server)
    yield url
    drop_database(url)


def _values(v):
    """A figure's array: a list, or plotly's typed array ({"dtype", "bdata": base64})."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def _plotly(cell) -> dict | None:
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "application/vnd.plotly.v1+json" in data:
            return data["application/vnd.plotly.v1+json"]
    return None


def test_the_notebook_runs_and_shows_what_the_catalog_holds(notebook_db, tiny_builtin,
                                                            monkeypatch):
    cfg, root = tiny_builtin
    name = model_name(cfg)
    for key, value in {"NCAT_NOTEBOOK_MODEL": name, "NCAT_HOME": str(root.parent),
                       "NCAT_NOTEBOOK_STEPS": ",".join(map(str, STEPS)),
                       "NCAT_NOTEBOOK_HI": "20", "DATABASE_URL": notebook_db}.items():
        monkeypatch.setenv(key, value)
    # the catalog holds the model under another config already (as after the demo): the
    # notebook reads its own config's rows, each neuron and step once
    from catalog import ScienceConfig, load_model
    from jobs.store_results import catalog_checkpoint
    from schema.engine import migrate

    migrate(notebook_db)
    other = ScienceConfig(operators=("+",), operand_hi=12, pairs_per_op=6,
                          faithfulness_prompts=30)
    for step in STEPS:
        catalog_checkpoint(notebook_db, load_model("builtin", step, builtin_config=cfg,
                                                   cache_root=root), other)
    mine = ScienceConfig(operators=("+", "-"), operand_hi=20, pairs_per_op=50)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parents[1])}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    with store.connect(notebook_db) as conn:
        config_id = store.scalar(conn.execute(
            "SELECT id FROM measure_config WHERE config_hash = %s", (mine.config_hash(),)))
        rows = dict(conn.execute(
            "SELECT c.step, count(*) FROM neuron_op n JOIN checkpoint c ON c.id = "
            "n.checkpoint_id WHERE n.config_id = %s GROUP BY c.step", (config_id,)).fetchall())
    assert rows == {s: cfg.n_layers * cfg.d_mlp * 2 for s in STEPS}  # + and -
    # the evolution figure: the stored effect of the neuron it names, at every step
    figure = _plotly(nb.cells[-1])
    assert figure is not None
    title = figure["layout"]["title"]["text"]
    layer, neuron = (int(w) for w in title.replace(",", "").split()[1:4:2])
    with store.connect(notebook_db) as conn:
        want = conn.execute(
            "SELECT c.step, n.effect_exact FROM neuron_op n JOIN checkpoint c ON c.id = "
            "n.checkpoint_id WHERE n.layer = %s AND n.neuron = %s AND n.op = '+' "
            "AND n.config_id = %s ORDER BY c.step", (layer, neuron, config_id)).fetchall()
        top = conn.execute(
            "SELECT n.layer, n.neuron FROM neuron_op n JOIN checkpoint c ON c.id = "
            "n.checkpoint_id WHERE c.step = %s AND n.op = '+' AND n.rank = 0 "
            "AND n.config_id = %s ORDER BY n.layer DESC LIMIT 1",
            (STEPS[-1], config_id)).fetchone()
    assert (layer, neuron) == tuple(top)  # the last layer's top neuron on +
    trace = figure["data"][0]
    assert list(_values(trace["x"])) == [s for s, _ in want] == list(STEPS)  # once each
    assert list(_values(trace["y"])) == pytest.approx([v for _, v in want], rel=1e-6)
    # the heat map of its activations is drawn from its stored grid
    heat = _plotly(nb.cells[-2])
    assert heat is not None and heat["data"][0]["type"] == "heatmap"
    json.dumps(heat)  # a figure the page can carry
