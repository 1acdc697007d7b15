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
    assert d["nodes"]["a0.h0"]["score"] == 0.5 and "score" not in d["nodes"]["a0.h1"]
    assert all(v["score"] == (1.0 if v["in_graph"] else 0.0) for v in d["edges"].values())
    assert len(d["edges"]) == len(mib.edge_list(2, 2, parallel=False))


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
