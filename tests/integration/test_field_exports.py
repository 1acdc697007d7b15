"""``ncat export --format mib|neuronpedia`` (issue 50): a catalogued checkpoint in the
formats of MIB's circuit track and of Neuronpedia's uploads, read back under their
schemas and checked against the store."""

import json

import numpy as np
import pytest

from catalog.builtin import model_name
from catalog.circuits import mib
from jobs.cli import main
from jobs.field_exports import ExportError, export_mib, export_neuronpedia
from schema import reads, store

from helpers import SEED_STEPS


@pytest.fixture(scope="module")
def name(tiny_builtin):
    return model_name(tiny_builtin[0])


def _ids(url, name, step):
    with store.connect(url) as conn:
        return conn.execute(
            "SELECT m.id, c.id, lr.config_id, m.n_layers, m.d_mlp FROM model m "
            "JOIN checkpoint c ON c.model_id = m.id JOIN layer_result lr "
            "ON lr.checkpoint_id = c.id WHERE m.name = %s AND c.step = %s LIMIT 1",
            (name, step)).fetchone()


def test_the_paper_circuit_as_mib_graphs_one_per_distinct_graph(seeded, tiny_builtin, name,
                                                                 tmp_path):
    """One file per graph MIB can tell apart (sizes that differ only in the MLP neurons a
    pruned layer keeps are one graph to MIB), each naming the sizes it stands for; every
    file carries the whole measured curve and the area MIB computes from it; kept nodes
    and edges score above dropped ones."""
    from catalog.circuits.faithfulness import areas

    cfg, root = tiny_builtin
    step = SEED_STEPS[-1]
    model_id, checkpoint_id, config_id, n_layers, d_mlp = _ids(seeded, name, step)
    paths = export_mib(seeded, name, tmp_path, op="+", cache_root=root)
    with store.connect(seeded) as conn:
        heads, pruned, ranking = conn.execute(
            "SELECT heads, pruned, ranking FROM circuit_summary WHERE checkpoint_id = %s "
            "AND config_id = %s AND op = '+' AND protocol = 'paper'",
            (checkpoint_id, config_id)).fetchone()
        points = conn.execute(
            "SELECT k, ratio_of_means, fraction, mib FROM circuit_point WHERE "
            "checkpoint_id = %s AND config_id = %s AND op = '+' AND protocol = 'paper' AND "
            "circuit = 'ranked' AND metric = 'nl' ORDER BY k",
            (checkpoint_id, config_id)).fetchall()
        column = "effect_attr + effect_attr_std" if ranking == "attribution" else "-rank"
        order = {layer: [r[0] for r in conn.execute(
            f"SELECT neuron FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s AND "
            f"op = '+' AND layer = %s ORDER BY {column} DESC, neuron",
            (checkpoint_id, config_id, layer))] for layer in pruned}
    n_heads = cfg.n_heads
    kept_heads = {f"a{layer}.h{head}" for layer, head in heads}
    faith = {k: f for k, f, _, _ in points}
    levels = [(x, f) for _, f, x, level in points if level and f is not None]
    want_area = areas(np.array([x for x, _ in levels]), np.array([f for _, f in levels]))
    graphs, listed = set(), []
    for path in paths:
        d = json.loads(path.read_text())
        g = mib.read_graph(d)
        assert g.cfg == {"n_layers": n_layers, "n_heads": n_heads,
                         "parallel_attn_mlp": False, "d_model": cfg.d_model}
        assert len(d["nodes"]) == 1 + n_layers * (n_heads + 1) + 1
        key = (frozenset(g.nodes), frozenset(g.edges))
        assert key not in graphs  # no two files hold one graph
        graphs.add(key)
        ks = g.about["ks"]
        listed += ks
        assert g.about["k"] == ks[0] and g.about["faithfulness"] == pytest.approx(faith[ks[0]])
        assert path.name.endswith(f"_k{ks[0]}.json" if len(ks) == 1
                                  else f"_k{ks[0]}-{ks[-1]}.json")
        # the node set: every MLP with a neuron kept, the plan's heads
        mlps = {f"m{layer}" for layer in range(n_layers)}
        assert g.nodes == {"input", "logits"} | kept_heads | mlps
        want = {mib.edge_name(*e) for e in mib.edge_list(n_layers, n_heads, False)
                if e[0] in g.nodes and e[1] in g.nodes}
        assert g.edges == want
        # the first size's kept neurons, by the ranking the curve used
        k = ks[0]
        for layer in pruned:
            if 0 < k < d_mlp:
                assert set(g.mlp_neurons[f"m{layer}"]) == set(order[layer][:k]), (layer, k)
        # scores: every kept node and edge above every dropped one
        for what in ("nodes", "edges"):
            inside = [v["score"] for v in d[what].values() if v["in_graph"]]
            outside = [v["score"] for v in d[what].values() if not v["in_graph"]]
            assert not outside or min(inside) > max(outside)
        # the curve and its area, as MIB computes it from the curve's MIB levels
        assert [c["k"] for c in g.about["curve"]] == [p[0] for p in points]
        assert g.about["area"]["cpr"] == pytest.approx(float(want_area[0]))
        assert g.about["area"]["cmd"] == pytest.approx(float(want_area[1]))
    assert sorted(listed) == [p[0] for p in points]  # every size in exactly one file
    assert len(paths) == len(graphs) >= 1
    # one size only
    one = export_mib(seeded, name, tmp_path / "one", op="+", k=points[0][0], cache_root=root)
    assert len(one) == 1 and one[0].name.endswith(f"_k{points[0][0]}.json")


def test_mib_exports_refuse_what_the_catalog_lacks(seeded, tiny_builtin, name, tmp_path):
    root = tiny_builtin[1]
    with pytest.raises(ExportError, match="no circuit of k = 99999"):
        export_mib(seeded, name, tmp_path, k=99999, cache_root=root)
    with pytest.raises(ExportError, match="is not in the catalog"):
        export_mib(seeded, "no-such-model", tmp_path, cache_root=root)
    with pytest.raises(ExportError, match="no measured layers at step 7"):
        export_mib(seeded, name, tmp_path, step=7, cache_root=root)
    assert not any(tmp_path.iterdir())  # nothing written on a refusal


def test_the_neurons_as_neuronpedia_batches(seeded, tiny_builtin, name, tmp_path):
    """The batches and explanations as the field's own code reads them: each batch file
    equals what SAEDashboard's NeuronpediaDashboardBatch writes back after reading it
    (every key it writes present, nothing else, qualifying_token_index and sae_id_suffix
    included), every exported neuron has activation examples, the largest of them is the
    neuron's largest activation over the grid of its operators (equal to its stored full
    grid where it has one), and every explanation is a record the neuronpedia client's
    Explanation reads."""
    from neuronpedia.np_explanation import Explanation
    from sae_dashboard.neuronpedia.neuronpedia_dashboard import NeuronpediaDashboardBatch

    root = tiny_builtin[1]
    step = SEED_STEPS[-1]
    model_id, checkpoint_id, config_id, n_layers, d_mlp = _ids(seeded, name, step)
    paths = export_neuronpedia(seeded, name, tmp_path, top=5, examples=4, cache_root=root)
    assert paths[-1].name == "explanations.json"
    with store.connect(seeded) as conn:
        want = {(r[0], r[1]) for r in conn.execute(
            "SELECT layer, neuron FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s "
            "AND (rank < 5 OR labelled)", (checkpoint_id, config_id))}
        labels = conn.execute(
            "SELECT count(*) FROM neuron_score WHERE checkpoint_id = %s AND config_id = %s "
            "AND implements", (checkpoint_id, config_id)).fetchone()[0]
        seen, full = set(), 0
        for path in paths[:-1]:
            batch = json.loads(path.read_text())
            assert NeuronpediaDashboardBatch(**batch).to_dict() == batch
            assert path.name == f"batch-{batch['layer']}.json"
            for f in batch["features"]:
                seen.add((batch["layer"], f["feature_index"]))
                lens = conn.execute(
                    "SELECT top_tokens, bottom_tokens FROM neuron_lens WHERE checkpoint_id = %s "
                    "AND config_id = %s AND layer = %s AND neuron = %s",
                    (checkpoint_id, config_id, batch["layer"], f["feature_index"])).fetchone()
                assert (f["pos_str"], f["neg_str"]) == (lens[0], lens[1])
                assert 0 < len(f["activations"]) <= 4  # every neuron has examples
                values = [a["values"][-1] for a in f["activations"]]
                assert values == sorted(values, reverse=True)
                for a in f["activations"]:
                    assert len(a["tokens"]) == len(a["values"]) <= f["n_tokens_in_prompt"]
                    assert all(v == 0.0 for v in a["values"][:-1])
                    assert a["qualifying_token_index"] == len(a["tokens"]) - 1
                    assert a["bin_max"] == values[0]
                # the top activation is the largest cell of the grids of the operators it
                # was exported for: the stored grids where they are full
                ops = [r[0] for r in conn.execute(
                    "SELECT op FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s "
                    "AND layer = %s AND neuron = %s AND (rank < 5 OR labelled)",
                    (checkpoint_id, config_id, batch["layer"], f["feature_index"]))]
                grids = [reads.read_stored_grid(
                    conn, model_id=model_id, checkpoint_id=checkpoint_id,
                    config_id=config_id, layer=batch["layer"], neuron=f["feature_index"],
                    op=op) for op in ops]
                if all(not g.sketch for g in grids):
                    best = max(np.nanmax(g.values) for g in grids)
                    assert values[0] == pytest.approx(best, abs=1e-5)
                    full += 1
                else:  # a sketch's block means never exceed the block's largest cell
                    assert values[0] >= max(np.nanmax(g.values) for g in grids) - 1e-5
                # its prompt is the cell's: "a op b =" in the tiny model's tokens
                text = "".join(f["activations"][0]["tokens"])
                assert text.rstrip().endswith("=") and any(o in text for o in "+-*/")
    assert seen == want and full > 0
    explained = json.loads(paths[-1].read_text())
    assert len(explained) == labels
    for e in explained:
        got = Explanation.from_np_db_json(e)
        assert got.source == e["layer"] and got.source.endswith("-ncat-mlp")
        assert got.text == e["description"] and got.method == "ncat-heuristic"


def test_the_command_writes_both_formats(seeded, tiny_builtin, name, tmp_path, monkeypatch,
                                         capsys):
    monkeypatch.setenv("NCAT_HOME", str(tiny_builtin[1].parent))
    assert main(["export", name, "--format", "mib", "--out", str(tmp_path / "mib"),
                 "--database-url", seeded]) == 0
    assert "mib file(s) written" in capsys.readouterr().out
    assert main(["export", name, "--format", "neuronpedia", "--out", str(tmp_path / "np"),
                 "--checkpoint", str(SEED_STEPS[0]), "--database-url", seeded]) == 0
    assert (tmp_path / "np" / "explanations.json").exists()
    assert main(["export", name, "--format", "mib", "--out", str(tmp_path / "x"),
                 "--k", "99999", "--database-url", seeded]) == 2
    assert "no circuit of k = 99999" in capsys.readouterr().err
