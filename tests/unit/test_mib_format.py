"""MIB's circuit graph format (catalog.circuits.mib): the full graph as MIB builds it, a node
circuit written and read back, and files that are not graphs of the model refused."""

import numpy as np
import pytest

from catalog.circuits import mib


def test_the_full_graph_has_mibs_edge_count():
    # GPT-2 small's graph in EAP-IG and MIB: 32,491 edges, 158 nodes
    assert len(mib.edge_list(12, 12, parallel=False)) == 32_491
    assert len(mib.node_names(12, 12)) == 158


def test_edges_follow_the_residual_stream_in_both_layouts():
    seq = {mib.edge_name(*e) for e in mib.edge_list(2, 2, parallel=False)}
    par = {mib.edge_name(*e) for e in mib.edge_list(2, 2, parallel=True)}
    # a sequential block's MLP reads its own layer's heads; a parallel one's does not
    assert "a0.h1->m0" in seq and "a0.h1->m0" not in par
    assert "a0.h1->m1" in par and "m0->a1.h0<k>" in seq and "m0->a1.h0<k>" in par
    # nothing reads a later component, and heads are entered through q, k and v
    assert "m1->a1.h0<q>" not in seq and "input->a0.h0" not in seq
    assert {"input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>"} <= seq
    assert {"input->logits", "m1->logits", "a1.h1->logits"} <= seq
    # counted by hand: into layer l's heads 3 * 2 * (1 + 3l) edges, into its MLP 3 + 3l
    # (sequential) or 1 + 3l (parallel), into the logits 7
    assert len(seq) == (6 * 1 + 3) + (6 * 4 + 6) + 7
    assert len(par) == (6 * 1 + 1) + (6 * 4 + 4) + 7


def test_a_node_circuit_written_and_read_back():
    heads = np.array([[True, False], [False, False]])
    neurons = np.zeros((2, 8), dtype=bool)
    neurons[0] = True  # a layer kept whole
    neurons[1, [2, 5]] = True  # a pruned layer
    d = mib.to_graph(heads, neurons, d_model=16, parallel=False,
                     node_scores={"a0.h0": 0.5, "m1": -0.25}, about={"k": 2})
    g = mib.read_graph(d)
    assert g.nodes == {"input", "a0.h0", "m0", "m1", "logits"}
    assert g.edges == {"input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>",
                       "input->m0", "a0.h0->m0", "input->m1", "a0.h0->m1", "m0->m1",
                       "input->logits", "a0.h0->logits", "m0->logits", "m1->logits"}
    assert g.mlp_neurons == {"m1": [2, 5]} and g.about["k"] == 2
    assert len(d["edges"]) == len(mib.edge_list(2, 2, parallel=False))
    # every node and edge scored on the documented scale: kept nodes in [0.5, 1] by their
    # |effect| over the largest (a0.h0 0.5 is the largest here: 1.0; m1 -0.25: 0.75;
    # none measured: 0.5), dropped ones below 0.5, an edge its weaker end
    nodes = d["nodes"]
    assert nodes["a0.h0"]["score"] == 1.0 and nodes["m1"]["score"] == 0.75
    assert nodes["m0"]["score"] == 0.5 and nodes["a0.h1"]["score"] == 0.0
    assert d["ncat"]["node_effects"] == {"a0.h0": 0.5, "m1": -0.25}
    for name, e in d["edges"].items():
        parent, child = name.split("->")
        assert e["score"] == min(nodes[parent]["score"], nodes[child.split("<")[0]]["score"])


def test_scores_order_every_kept_node_and_edge_above_every_dropped_one():
    """Raw patching effects ranked a dropped head above a kept one (and reached 1e16):
    on the file's scale, sorting by score takes every kept node and edge before any
    dropped one, whatever the effects, and the larger effect first within each group."""
    rng = np.random.default_rng(0)
    heads = rng.random((3, 4)) < 0.5
    neurons = np.zeros((3, 8), dtype=bool)
    neurons[[0, 2]] = True
    effects = {f"a{la}.h{h}": float(rng.normal() * 10 ** rng.integers(0, 17))
               for la in range(3) for h in range(4)}
    effects["m1"] = 3.8e16  # dropped, and the largest
    d = mib.to_graph(heads, neurons, d_model=8, parallel=False, node_scores=effects)
    for what in ("nodes", "edges"):
        ranked = sorted(d[what].values(), key=lambda v: -v["score"])
        n_kept = sum(v["in_graph"] for v in ranked)
        assert all(v["in_graph"] for v in ranked[:n_kept])
        assert not any(v["in_graph"] for v in ranked[n_kept:])
    kept = [n for n, v in d["nodes"].items() if v["in_graph"] and n in effects]
    by_score = sorted(kept, key=lambda n: -d["nodes"][n]["score"])
    assert by_score == sorted(kept, key=lambda n: -abs(effects[n]))


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.pop("edges"), "missing \\['edges'\\]"),
    (lambda d: d["cfg"].pop("n_heads"), "lacks 'n_heads'"),
    (lambda d: d["nodes"].update({"a5.h0": {"in_graph": True}}), "node 'a5.h0'"),
    (lambda d: d["edges"].update({"m1->m0": {"score": 1.0, "in_graph": True}}),
     "edge 'm1->m0'"),
    (lambda d: d["edges"]["input->m0"].update({"in_graph": "yes"}), "boolean in_graph"),
])
def test_a_file_that_is_not_this_models_graph_is_refused(damage, message):
    d = mib.to_graph(np.ones((2, 2), bool), np.ones((2, 4), bool), d_model=8, parallel=False)
    damage(d)
    with pytest.raises(ValueError, match=message):
        mib.read_graph(d)
