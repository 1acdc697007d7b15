"""``ncat export``: a catalogued checkpoint in the formats the field reads.

- ``mib``: the checkpoint's paper circuit for one operator as MIB circuit-track graph files
  (catalog.circuits.mib), one per circuit size the catalog measured (or one chosen), each
  with the faithfulness the catalog measured for it.
- ``neuronpedia``: the checkpoint's labelled and top-ranked neurons as Neuronpedia upload
  batches (one ``batch-<layer>.json`` per layer, the dashboard batch format SAEDashboard
  writes for Neuronpedia: per neuron its logit-lens tokens, its top activations over the
  whole grid as prompts with per-token values, every neuron with at least one), and
  ``explanations.json`` with the heuristic labels in Neuronpedia's explanation record,
  with their scores and p-values. Both are read back by the field's own classes in the
  tests (SAEDashboard's NeuronpediaDashboardBatch, the neuronpedia client's Explanation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from catalog.circuits import mib
from catalog.config import ScienceConfig
from catalog.labels.heuristics import Heuristic
from jobs.store_results import CatalogIds, stored_circuit
from schema import export_reads as exports
from schema import reads, store, training

OP_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
SOURCE_SET = "ncat-mlp"  # the source set's name on Neuronpedia: "<layer>-ncat-mlp"


class ExportError(ValueError):
    """What the catalog lacks for the export asked for."""


def slug(name: str) -> str:
    """A model name as a file and Neuronpedia id (lower case, letters, digits, - and .)."""
    return re.sub(r"[^a-z0-9.]+", "-", Path(name).name.lower()).strip("-") or "model"


def _load(at: exports.Located, cache_root=None, config: ScienceConfig | None = None):
    from catalog.sources import load_model

    return load_model(at.model, at.step, cache_root=cache_root, progress=False,
                      **({} if config is None else {"dtype": config.torch_dtype()}))


def _mib_area(curve: list[dict]) -> dict | None:
    """The curve's CPR and CMD over its MIB levels, as MIB computes them (None: under two
    levels measured)."""
    levels = [c for c in curve if c["mib_level"] and c["faithfulness"] is not None]
    if len(levels) < 2:
        return None
    from catalog.circuits.faithfulness import areas

    cpr, cmd = areas(np.array([c["fraction"] for c in levels]),
                     np.array([c["faithfulness"] for c in levels]))
    return {"cpr": float(cpr), "cmd": float(cmd), "levels": len(levels),
            "statistic": "normalised logit, ratio of means; trapezoids over the "
                         "fraction of the model kept, as MIB's CPR and CMD"}


def _mib_graphs(curve: list[dict], circuit, k: int | None) -> dict[tuple, tuple]:
    """MIB's graph -> (the first size's circuit, the curve points of its sizes): sizes
    that differ only in the neurons a pruned layer keeps are one graph to MIB (``k``:
    that size only)."""
    groups: dict[tuple, tuple] = {}
    for c in curve:
        if k is not None and c["k"] != k:
            continue
        kept = circuit.ranked(c["k"])
        key = (kept.heads.tobytes(), tuple(bool(x) for x in kept.neurons.any(axis=1)))
        groups.setdefault(key, (kept, []))[1].append(c)
    return groups


def export_mib(url: str, model: str, out: Path, *, step: int | None = None,
               config_id: int | None = None, op: str = "+", k: int | None = None,
               protocol: str = "paper", cache_root=None) -> list[Path]:
    """Write the checkpoint's ``protocol`` circuit for ``op`` as MIB graph files, one per
    distinct graph MIB can express among the circuit sizes measured (or for ``k`` only);
    returns their paths. The model is loaded for its architecture (heads per layer,
    parallel attention and MLP)."""
    with store.connect(url) as conn:
        at, plans = _circuit_plans(conn, model, step, config_id, op, protocol)
        points = exports.circuit_points(conn, at, op, protocol)
        measured = [int(p[0]) for p in points]
        if k is not None and k not in measured:
            raise ExportError(f"no circuit of k = {k} was measured; the sizes are {measured}")
        n_layers, d_model, d_mlp = exports.model_shape(conn, at)
        lm = _load(at, cache_root)
        n_heads, parallel = lm.model.cfg.n_heads, bool(lm.model.cfg.parallel_attn_mlp)
        config = ScienceConfig.from_dict(at.config)
        circuit = stored_circuit(conn, CatalogIds(at.model_id, at.checkpoint_id, at.config_id),
                                 config, (n_layers, n_heads, d_mlp), {op: plans[op]},
                                 at.step).plans[op]
        scores = _node_scores(conn, at, op)
    # one file per distinct MIB graph: MIB's nodes are heads and whole MLPs, so sizes
    # that differ only in the MLP neurons a pruned layer keeps are one graph to MIB (the
    # ten files of the demo's `+` were one graph); each file names the sizes it stands
    # for, the whole measured curve, and its area the way MIB computes it
    curve = [{"k": int(size), "fraction": fraction, "faithfulness": faith,
              "faithfulness_se": faith_se, "n_prompts": n, "mib_level": bool(level)}
             for size, fraction, faith, faith_se, n, level in points]
    about = {"model": model, "step": at.step, "config_id": at.config_id, "operator": op,
             "protocol": protocol, "curve": curve, "area": _mib_area(curve)}
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kept, members in _mib_graphs(curve, circuit, k).values():
        first, last = members[0]["k"], members[-1]["k"]
        graph = mib.to_graph(kept.heads, kept.neurons, d_model=d_model, parallel=parallel,
                             node_scores=scores, about=_about_graph(about, members))
        sizes = f"k{first}" if first == last else f"k{first}-{last}"
        path = out / (f"{slug(model)}_{'final' if at.step is None else at.step}_"
                      f"{OP_NAMES.get(op, 'op')}_{protocol}_{sizes}.json")
        path.write_text(json.dumps(graph))
        written.append(path)
    return written


def _circuit_plans(conn, model: str, step: int | None, config_id: int | None, op: str,
                   protocol: str) -> tuple:
    """(where the checkpoint is, its ``protocol`` circuits' plans by operator); an
    ``ExportError`` naming what it has where it has none for ``op``."""
    at = exports.locate(conn, model, step, config_id, error=ExportError)
    plans = training.circuit_plans(conn, checkpoint_id=at.checkpoint_id,
                                   config_id=at.config_id, protocol=protocol)
    if op not in plans:
        where = "its final weights" if at.step is None else f"step {at.step}"
        raise ExportError(
            f"{model} at {where} (config {at.config_id}) has no {protocol!r} circuit for "
            f"{op!r} (circuits come with a checkpoint's summary); it has them for "
            f"{sorted(plans) or 'none'}")
    return at, plans


def _node_scores(conn, at, op: str) -> dict[str, float]:
    """MIB node name -> the stored component effect of ``op`` (heads and whole MLPs)."""
    return {(f"m{layer}" if head < 0 else f"a{layer}.h{head}"): float(v)
            for layer, head, v in exports.component_effects(conn, at, op) if v is not None}


def _about_graph(about: dict, members: list[dict]) -> dict:
    """A graph file's own record: the run's (``about``: model, step, config, operator,
    protocol, curve, area), the sizes it stands for and its first size's point."""
    first = members[0]
    return {**{key: about[key] for key in ("model", "step", "config_id", "operator",
                                           "protocol")},
            "k": first["k"], "ks": [c["k"] for c in members], "fraction": first["fraction"],
            "faithfulness": first["faithfulness"], "faithfulness_se": first["faithfulness_se"],
            "n_prompts": first["n_prompts"],
            "faithfulness_statistic": "normalised logit, ratio of means (docs/method.md "
                                      "section 6)",
            "curve": about["curve"], "area": about["area"]}


def _grid_activations(lm, config: ScienceConfig, layers: list[int]):
    """(the config's prompt table, layer -> (prompt, d_mlp) last-position activations):
    one pass of the whole grid, so that every exported neuron has its own top prompts
    (a stored sketch keeps block means only: 92% of the demo's exported neurons had no
    example when they were read from the stored grids)."""
    from catalog.core.tokens import detect_number_tokens
    from catalog.measuring.grids import run_grid
    from catalog.measuring.prompts import prompts_for

    numbers = detect_number_tokens(lm.tokenizer, prepend_bos=lm.model.cfg.default_prepend_bos)
    table = prompts_for(lm.tokenizer, numbers, config)
    return table, run_grid(lm.model, table, sorted(layers))


def _activations(lm, table, acts: np.ndarray, neuron: int, ops: list[str],
                 examples: int) -> tuple[list[dict], int]:
    """A neuron's ``examples`` largest activations over the prompts of ``ops``, in the
    record SAEDashboard writes for Neuronpedia's top-activations bin (per-token values,
    the measured last position and 0 before it), and how many prompts there were."""
    rows = np.nonzero(np.isin(table.op, [table.operators.index(o) for o in ops]))[0]
    values = acts[rows, neuron]
    order = rows[np.argsort(-values, kind="stable")[:examples]]
    top = float(acts[order[0], neuron]) if len(order) else 0.0
    out = []
    for i in order:
        tokens = [lm.tokenizer.decode([int(t)]) for t in table.tokens[i]]
        out.append({"bin_min": -1, "bin_max": round(top, 6), "bin_contains": -1,
                    "tokens": tokens,
                    "values": [0.0] * (len(tokens) - 1) + [round(float(acts[i, neuron]), 6)],
                    "qualifying_token_index": len(tokens) - 1})
    return out, len(rows)


def export_neuronpedia(url: str, model: str, out: Path, *, step: int | None = None,
                       config_id: int | None = None, top: int = 20, examples: int = 20,
                       cache_root=None) -> list[Path]:
    """Write Neuronpedia upload batches of the checkpoint's neurons that carry a label or
    rank in the top ``top`` of their layer for some operator, each with its ``examples``
    largest activations; returns the paths written."""
    with store.connect(url) as conn:
        at = exports.locate(conn, model, step, config_id, error=ExportError)
        config = ScienceConfig.from_dict(at.config)
        rows = exports.export_neurons(conn, at, top)
        if not rows:
            raise ExportError(f"{model} (config {at.config_id}) has no labelled or ranked "
                              "neurons to export")
        by_neuron: dict[tuple[int, int], list[tuple]] = {}
        for r in rows:
            by_neuron.setdefault((r[0], r[1]), []).append(r)
        lm = _load(at, cache_root, config)
        table, grid = _grid_activations(lm, config, sorted({la for la, _ in by_neuron}))
        n_tokens = max(len(t) for t in table.tokens)
        layers: dict[int, list[dict]] = {}
        for (layer, neuron), ops in sorted(by_neuron.items()):
            lens = exports.lens(conn, at, layer, neuron)
            best = min(ops, key=lambda r: r[3])  # the operator where it ranks highest
            activations, n_prompts = _activations(lm, table, grid[layer], neuron,
                                                  [r[2] for r in ops], examples)
            layers.setdefault(layer, []).append({
                "feature_index": neuron,
                "neuron_alignment_indices": [neuron], "neuron_alignment_values": [1.0],
                "neuron_alignment_l1": [1.0],
                "correlated_neurons_indices": [], "correlated_neurons_l1": [],
                "correlated_neurons_pearson": [], "correlated_features_indices": [],
                "correlated_features_l1": [], "correlated_features_pearson": [],
                "neg_str": list(lens[2]) if lens else [],
                "neg_values": [float(x) for x in lens[3]] if lens else [],
                "pos_str": list(lens[0]) if lens else [],
                "pos_values": [float(x) for x in lens[1]] if lens else [],
                "frac_nonzero": float(best[5]),
                "freq_hist_data_bar_values": [], "freq_hist_data_bar_heights": [],
                "logits_hist_data_bar_heights": [], "logits_hist_data_bar_values": [],
                "n_prompts_total": n_prompts,
                "n_tokens_in_prompt": n_tokens,
                "dataset": (f"ncat arithmetic prompts, operands in [{config.operand_lo}, "
                            f"{config.operand_hi}), operators {''.join(r[2] for r in ops)}, "
                            f"config {at.config_id}"),
                "decoder_weights_dist": [],
                "activations": activations,
                "vector": [],
            })
        explanations = [
            # Neuronpedia's explanation record: the source as "layer" (its database column)
            # and "source" (its client's Explanation)
            {"modelId": slug(model), "layer": f"{layer}-{SOURCE_SET}",
             "source": f"{layer}-{SOURCE_SET}", "index": neuron,
             "description": f"{op}: {label}", "explanationModelName": "ncat heuristic labels",
             "typeName": "ncat-heuristic", "score": float(score),
             "base_rate": None if base is None else float(base),
             "p_value": None if p is None else float(p)}
            for layer, neuron, op, score, _, family, target, params, base, p
            in reads.stored_labels(conn, ids=CatalogIds(at.model_id, at.checkpoint_id,
                                                        at.config_id))
            for label in [Heuristic(family, target, tuple(params)).label]]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for layer, features in sorted(layers.items()):
        path = out / f"batch-{layer}.json"
        path.write_text(json.dumps({"model_id": slug(model), "layer": layer,
                                    "sae_set": SOURCE_SET, "sae_id_suffix": None,
                                    "features": features}))
        written.append(path)
    path = out / "explanations.json"
    path.write_text(json.dumps(explanations))
    return written + [path]
