"""A circuit as a graph file of MIB's circuit track (Mueller et al. 2025).

MIB scores circuits given as a JSON graph over a transformer's components: ``cfg``
(``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``), ``nodes`` (``input``,
``a{layer}.h{head}``, ``m{layer}``, ``logits``; each with ``in_graph`` and, optionally,
``score``) and ``edges`` (``parent->child``, with ``<q>``, ``<k>`` or ``<v>`` after an
attention head child; each with ``score`` and ``in_graph``). The edges are every
residual-stream path the architecture has: into a head's query, key and value from the
input and every earlier component, into an MLP from the input, every earlier component and
(sequential blocks) the same layer's heads, into the logits from everything.

The catalog's circuits are node circuits (the paper's protocol: the kept heads, every MLP
layer before the first heuristics layer whole, the top ``k`` neurons of each later one,
everything else mean-ablated), so a node is in the graph when the circuit keeps it (an MLP
with at least one neuron), and an edge when both its ends are. MIB's own neuron masks are
over each component's ``d_model`` output, not over MLP neurons, so the MLP neurons kept are
written beside the graph under the key ``ncat`` (MIB's loader reads only ``cfg``, ``nodes``
and ``edges``). ``read_graph`` reads a file back under the same schema, refusing names
the model does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QKV = "qkv"


def _head(layer: int, head: int) -> str:
    return f"a{layer}.h{head}"


def node_names(n_layers: int, n_heads: int) -> list[str]:
    """Every node, in the forward order MIB numbers them."""
    names = ["input"]
    for layer in range(n_layers):
        names += [_head(layer, h) for h in range(n_heads)] + [f"m{layer}"]
    return names + ["logits"]


def edge_list(n_layers: int, n_heads: int, parallel: bool) -> list[tuple[str, str, str | None]]:
    """(parent, child, q/k/v or None) of every edge of the full graph, in MIB's order."""
    edges: list[tuple[str, str, str | None]] = []
    upstream = ["input"]
    for layer in range(n_layers):
        heads = [_head(layer, h) for h in range(n_heads)]
        for parent in upstream:
            for child in heads:
                edges += [(parent, child, letter) for letter in QKV]
        if not parallel:
            upstream = upstream + heads
        edges += [(parent, f"m{layer}", None) for parent in upstream]
        if parallel:
            upstream = upstream + heads
        upstream = upstream + [f"m{layer}"]
    edges += [(parent, "logits", None) for parent in upstream]
    return edges


def edge_name(parent: str, child: str, qkv: str | None) -> str:
    return f"{parent}->{child}" if qkv is None else f"{parent}->{child}<{qkv}>"


# node and edge scores: a kept node scores in [KEPT, 1], a dropped one in [0, KEPT), each
# by its size of effect within its group; an edge scores its weaker end's score
KEPT = 0.5


def scaled_scores(kept: dict[str, bool], effects: dict[str, float] | None) -> dict[str, float]:
    """Every node's score on the documented scale: ``KEPT + (1 - KEPT) * e`` for a kept node
    and ``KEPT * e * (1 - 1e-9)`` for a dropped one, ``e`` its |effect| over the largest
    |effect| of the graph (0 where none was measured; ``input`` and ``logits`` score 1).
    Sorting by score puts every kept node above every dropped one, and within each group
    the larger effect first (raw patching effects ranked a dropped head above a kept one
    and reached 1e16)."""
    mags = {n: abs(float(v)) for n, v in (effects or {}).items() if np.isfinite(v)}
    top = max(mags.values(), default=0.0)
    out = {}
    for name, k in kept.items():
        e = mags.get(name, 0.0) / top if top > 0 else 0.0
        out[name] = 1.0 if name in ("input", "logits") else (
            KEPT + (1.0 - KEPT) * e if k else KEPT * e * (1.0 - 1e-9))
    return out


def to_graph(heads: np.ndarray, neurons: np.ndarray, *, d_model: int, parallel: bool,
             node_scores: dict[str, float] | None = None, about: dict | None = None) -> dict:
    """The MIB graph of a node circuit: ``heads`` (n_layers, n_heads) and ``neurons``
    (n_layers, d_mlp) kept (bool). ``node_scores``: each node's patching effect (raw; the
    file holds them on the scale of ``scaled_scores``, every node and edge scored, so that
    MIB's top-n selection by score takes the kept ones first); ``about``: what the circuit
    is (written under ``ncat``)."""
    heads = np.asarray(heads, dtype=bool)
    neurons = np.asarray(neurons, dtype=bool)
    n_layers, n_heads = heads.shape
    if neurons.shape[0] != n_layers:
        raise ValueError(f"the neuron mask has {neurons.shape[0]} layers, the heads "
                         f"{n_layers}")
    kept = {"input": True, "logits": True}
    for layer in range(n_layers):
        for h in range(n_heads):
            kept[_head(layer, h)] = bool(heads[layer, h])
        kept[f"m{layer}"] = bool(neurons[layer].any())
    score = scaled_scores(kept, node_scores)
    nodes: dict[str, dict[str, bool | float]] = {
        name: {"in_graph": kept[name], "score": score[name]}
        for name in node_names(n_layers, n_heads)}
    edges = {}
    for parent, child, qkv in edge_list(n_layers, n_heads, parallel):
        both = kept[parent] and kept[child]
        edges[edge_name(parent, child, qkv)] = {"score": min(score[parent], score[child]),
                                                "in_graph": both}
    mlp = {f"m{layer}": np.flatnonzero(neurons[layer]).tolist() for layer in range(n_layers)
           if neurons[layer].any() and not neurons[layer].all()}
    return {"cfg": {"n_layers": int(n_layers), "n_heads": int(n_heads),
                    "parallel_attn_mlp": bool(parallel), "d_model": int(d_model)},
            "nodes": nodes, "edges": edges,
            "ncat": {**(about or {}), "d_mlp": int(neurons.shape[1]),
                     "mlp_neurons": mlp,
                     "mlp_neurons_note": "MLP nodes listed here keep only these neurons "
                                         "(indices of the MLP's hidden layer); the other "
                                         "MLP nodes in the graph are kept whole",
                     "score_scale": f"kept nodes score in [{KEPT}, 1], dropped ones in "
                                    f"[0, {KEPT}), each by its |patching effect| over the "
                                    "graph's largest; an edge scores its weaker end",
                     # the raw effects the scores come from (MIB's node records hold
                     # in_graph and score only)
                     "node_effects": {n: float(v) for n, v in (node_scores or {}).items()
                                      if n in nodes and np.isfinite(v)}}}


@dataclass
class ReadGraph:
    """What a graph file keeps."""

    cfg: dict
    nodes: set[str]  # in the graph
    edges: set[str]  # in the graph
    mlp_neurons: dict[str, list[int]]
    about: dict


def read_graph(d: dict) -> ReadGraph:
    """A graph file read under MIB's schema: ``cfg``, ``nodes`` and ``edges`` required,
    every node and edge one the model's full graph has (ValueError naming the first that
    is not), and the catalog's MLP neurons if present."""
    cfg = _check_keys(d)
    _check_members(d, int(cfg["n_layers"]), int(cfg["n_heads"]),
                   bool(cfg["parallel_attn_mlp"]))
    extra = d.get("ncat", {})
    return ReadGraph(cfg, _kept(d["nodes"]), _kept(d["edges"]),
                     {k: list(v) for k, v in extra.get("mlp_neurons", {}).items()},
                     {k: v for k, v in extra.items() if k != "mlp_neurons"})


def _kept(members: dict) -> set[str]:
    """The names of the nodes (or edges) in the graph."""
    return {name for name, v in members.items() if v["in_graph"]}


def _check_keys(d: dict) -> dict:
    """The graph's ``cfg``, once ``cfg``, ``nodes`` and ``edges`` and the cfg's keys are
    there (ValueError naming what is missing)."""
    missing = [k for k in ("cfg", "nodes", "edges") if k not in d]
    if missing:
        raise ValueError(f"not a MIB circuit graph: missing {missing}")
    lacking = [k for k in ("n_layers", "n_heads", "parallel_attn_mlp", "d_model")
               if k not in d["cfg"]]
    if lacking:
        raise ValueError(f"the graph's cfg lacks {lacking[0]!r}")
    return d["cfg"]


def _check_members(d: dict, n_layers: int, n_heads: int, parallel: bool) -> None:
    """Every node and edge of graph ``d`` is one of the model's full graph, with a boolean
    ``in_graph`` (and an edge a number ``score``); ValueError naming the first that is not."""
    known_nodes = set(node_names(n_layers, n_heads))
    known_edges = {edge_name(*e) for e in edge_list(n_layers, n_heads, parallel)}
    for name, node in d["nodes"].items():
        if name not in known_nodes:
            raise ValueError(f"node {name!r} is not in a {n_layers}-layer, {n_heads}-head "
                             "model's graph")
        if not isinstance(node.get("in_graph"), bool):
            raise ValueError(f"node {name!r} has no boolean in_graph")
    for name, edge in d["edges"].items():
        if name not in known_edges:
            raise ValueError(f"edge {name!r} is not in this model's graph")
        if not isinstance(edge.get("in_graph"), bool) or not isinstance(
                edge.get("score"), int | float):
            raise ValueError(f"edge {name!r} needs a boolean in_graph and a number score")
