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

# every key of a feature and of an activation in the dashboard batches SAEDashboard
# writes for Neuronpedia (NeuronpediaDashboardFeature / ...Activation.to_dict)
FEATURE_KEYS = {
    "feature_index": int, "neuron_alignment_indices": list, "neuron_alignment_values": list,
    "neuron_alignment_l1": list, "correlated_neurons_indices": list,
    "correlated_neurons_l1": list, "correlated_neurons_pearson": list,
    "correlated_features_indices": list, "correlated_features_l1": list,
    "correlated_features_pearson": list, "neg_str": list, "neg_values": list,
    "pos_str": list, "pos_values": list, "frac_nonzero": float,
    "freq_hist_data_bar_values": list, "freq_hist_data_bar_heights": list,
    "logits_hist_data_bar_heights": list, "logits_hist_data_bar_values": list,
    "n_prompts_total": int, "n_tokens_in_prompt": int, "dataset": str, "activations": list,
    "decoder_weights_dist": list}
ACTIVATION_KEYS = {"bin_min": (int, float), "bin_max": (int, float),
                   "bin_contains": (int, float), "tokens": list, "values": list}


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


def test_the_paper_circuit_as_mib_graphs_one_per_size(seeded, tiny_builtin, name, tmp_path):
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
            "SELECT k, ratio_of_means FROM circuit_point WHERE checkpoint_id = %s AND "
            "config_id = %s AND op = '+' AND protocol = 'paper' AND circuit = 'ranked' AND "
            "metric = 'nl' ORDER BY k", (checkpoint_id, config_id)).fetchall()
        column = "effect_attr + effect_attr_std" if ranking == "attribution" else "-rank"
        order = {layer: [r[0] for r in conn.execute(
            f"SELECT neuron FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s AND "
            f"op = '+' AND layer = %s ORDER BY {column} DESC, neuron",
            (checkpoint_id, config_id, layer))] for layer in pruned}
    assert len(paths) == len(points) > 1
    n_heads = cfg.n_heads
    kept_heads = {f"a{layer}.h{head}" for layer, head in heads}
    for path, (k, faith) in zip(paths, points, strict=True):
        g = mib.read_graph(json.loads(path.read_text()))
        assert g.cfg == {"n_layers": n_layers, "n_heads": n_heads,
                         "parallel_attn_mlp": False, "d_model": cfg.d_model}
        # MIB's node set: input, every head, every MLP, logits
        assert len(json.loads(path.read_text())["nodes"]) == 1 + n_layers * (n_heads + 1) + 1
        mlps = {f"m{layer}" for layer in range(n_layers)}
        assert g.nodes == {"input", "logits"} | kept_heads | mlps
        # an edge is kept exactly where both ends are
        want = {mib.edge_name(*e) for e in mib.edge_list(n_layers, n_heads, False)
                if e[0] in g.nodes and e[1] in g.nodes}
        assert g.edges == want
        assert g.about["k"] == k and g.about["faithfulness"] == pytest.approx(faith)
        # the pruned layers keep their top k neurons by the ranking the curve used
        assert set(g.mlp_neurons) == {f"m{layer}" for layer in pruned if 0 < k < d_mlp}, k
        for layer in pruned:
            if not 0 < k < d_mlp:
                continue
            assert len(g.mlp_neurons[f"m{layer}"]) == k
            assert set(g.mlp_neurons[f"m{layer}"]) == set(order[layer][:k]), (layer, k)
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
        seen, checked = set(), 0
        for path in paths[:-1]:
            batch = json.loads(path.read_text())
            assert set(batch) == {"model_id", "layer", "sae_set", "features"}
            assert path.name == f"batch-{batch['layer']}.json"
            for f in batch["features"]:
                assert {k: type(v) for k, v in f.items()}.keys() == FEATURE_KEYS.keys()
                for key, kind in FEATURE_KEYS.items():
                    assert isinstance(f[key], kind), key
                seen.add((batch["layer"], f["feature_index"]))
                lens = conn.execute(
                    "SELECT top_tokens, bottom_tokens FROM neuron_lens WHERE checkpoint_id = %s "
                    "AND config_id = %s AND layer = %s AND neuron = %s",
                    (checkpoint_id, config_id, batch["layer"], f["feature_index"])).fetchone()
                assert (f["pos_str"], f["neg_str"]) == (lens[0], lens[1])
                assert 0 < len(f["activations"]) <= 4
                values = [a["values"][-1] for a in f["activations"]]
                assert values == sorted(values, reverse=True)
                for a in f["activations"]:
                    assert set(a) == set(ACTIVATION_KEYS)
                    assert len(a["tokens"]) == len(a["values"]) <= f["n_tokens_in_prompt"]
                    assert all(v == 0.0 for v in a["values"][:-1])
                # the top activation is the largest cell of the full grids of the
                # operators it was exported for
                ops = [r[0] for r in conn.execute(
                    "SELECT op FROM neuron_op WHERE checkpoint_id = %s AND config_id = %s "
                    "AND layer = %s AND neuron = %s AND (rank < 5 OR labelled)",
                    (checkpoint_id, config_id, batch["layer"], f["feature_index"]))]
                grids = [reads.read_stored_grid(
                    conn, model_id=model_id, checkpoint_id=checkpoint_id,
                    config_id=config_id, layer=batch["layer"], neuron=f["feature_index"],
                    op=op) for op in ops]
                best = max(np.nanmax(g.values) for g in grids if not g.sketch)
                assert values[0] == pytest.approx(best, abs=1e-5)
                # its prompt is the cell's: "a op b =" in the tiny model's tokens
                text = "".join(f["activations"][0]["tokens"])
                assert text.rstrip().endswith("=") and any(o in text for o in "+-*/")
                checked += 1
    assert seen == want and checked == len(want)
    explained = json.loads(paths[-1].read_text())
    assert len(explained) == labels
    assert all(e["layer"].endswith("-ncat-mlp") and e["description"] for e in explained)


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
