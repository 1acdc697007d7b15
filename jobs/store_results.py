"""Join the science and the store: register a run, convert its results, write them.

``catalog`` knows nothing of the database and ``schema`` nothing of catalog's internals;
this module converts between them (a ``LayerResult`` into the writer's ``LayerRows``,
a ``Summary`` into the summary row, stored layers back into ``LayerDigest``s) and runs
one checkpoint without a queue (``catalog_checkpoint``, used by ``ncat catalog``). The
Celery worker (``jobs.runner``) uses the same functions.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import numpy as np
import psycopg

from catalog.circuits.final import FinalCircuit
from catalog.config import CATALOG_VERSION, ExecutionConfig, ScienceConfig
from catalog.labels.heuristics import Heuristic
from catalog.labels.matches import Matches
from catalog.measuring.effects import rank_key
from catalog.run.checkpoint import CheckpointRun, LayerDigest, LayerResult, Summary
from catalog.sources import LoadedModel
from schema import reads, rows, store, training
from schema.sketch import GridGeometry
from schema.store import json_safe


@dataclass
class CatalogIds:
    model_id: int
    checkpoint_id: int
    config_id: int


def register(conn: psycopg.Connection, lm: LoadedModel, config: ScienceConfig) -> CatalogIds:
    """Upsert the model, checkpoint and config rows; returns their ids."""
    info = lm.info.as_dict()
    with conn.transaction():
        model_id = store.upsert_model(conn, info=info)
        checkpoint_id = store.upsert_checkpoint(conn, model_id=model_id, step=info["checkpoint"],
                                                revision=info["revision"],
                                                weights_hash=info["weights_hash"],
                                                transformers_nats=info["transformers_nats"])
        config_id = store.upsert_config(conn, config=config.as_dict(),
                                        config_hash=config.config_hash(),
                                        catalog_version=CATALOG_VERSION)
    return CatalogIds(model_id, checkpoint_id, config_id)


def write_layouts(conn: psycopg.Connection, run: CheckpointRun, ids: CatalogIds) -> None:
    """Store each operator's valid-cell mask and answer positions (how grids map to a, b)."""
    with conn.transaction():
        for g in run.grid_layouts():
            store.upsert_grid_layout(conn, config_id=ids.config_id,
                                     number_limit=run.numbers.limit, op=g.op, lo=g.lo,
                                     side=g.side, valid=g.valid, answer_index=g.answer_index)


def layer_rows(result: LayerResult, run: CheckpointRun, tokenizer) -> rows.LayerRows:
    """Convert one catalog LayerResult into the store's plain arrays."""
    table, ops = run.table, list(run.config.operators)
    nan = np.full_like(result.max_act, np.nan)

    def measured(x):
        return x if x is not None else nan

    stats = {
        "max_act": result.max_act, "mean_act": result.mean_act,
        "mean_kv": result.mean_kv, "density": result.density,
        "effect_exact": measured(result.effect_exact),
        "effect_exact_std": measured(result.effect_exact_std),
        "effect_attr": measured(result.effect_attr),
        "effect_attr_std": measured(result.effect_attr_std),
        "rank": result.rank,
        "effect_log": result.effect_log, "effect_median": result.effect_median,
        "effect_trimmed": result.effect_trimmed, "moved_share": result.moved_share,
        "rank_value": result.rank_value, "is_exact": result.is_exact,
        "constant": result.constant,
        **(result.spectra.cols if result.spectra is not None else {}),
        **(result.explanations if result.explanations is not None else {}),
    }
    accuracy = np.array([table.correct[table.op_index(op)].mean() for op in ops])

    def tokens(ids):
        return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    return rows.LayerRows(
        layer=result.layer, ops=ops, stats=stats, op_accuracy=accuracy,
        grids=[result.acts[table.op_index(op)].T for op in ops],
        lens_numbers=result.lens.numbers,
        lens_top_tokens=tokens(result.lens.top_ids), lens_top_values=result.lens.top_values,
        lens_bottom_tokens=tokens(result.lens.bottom_ids),
        lens_bottom_values=result.lens.bottom_values,
        matches=result.matches, patching=json_safe(result.patching),
        label_control=result.label_control or None,
        best_label="score" if run.config.label_rule == "paper" else "specific",
        layouts=[GridGeometry(g.side, g.valid) for g in run.grid_layouts()],
        full_top=run.config.full_grid_top())


def summary_dict(summary: Summary) -> dict:
    """The checkpoint_summary row of a Summary."""
    return json_safe({
        "accuracy": summary.accuracy,
        "faithfulness": {op: [[k, f] for k, f in curve]
                         for op, curve in summary.faithfulness.items()},
        "heuristic_knockouts": summary.heuristic_knockouts,
        "prompt_knockouts": summary.prompt_knockouts,
        "n_heuristic_neurons": summary.n_heuristic_neurons,
        "layers": summary.layers, "n_correct": summary.n_correct, "n_pairs": summary.n_pairs,
        "n_excluded": summary.n_excluded,
        "residual_lens": summary.residual_lens,
        "enrichment": summary.enrichment, "aliases": summary.aliases,
        "prompt_explanations": summary.prompt_explanations,
        "components": component_rows(summary),
        "curves": [c.as_dict() for c in summary.curves],
        "final_curves": [c.as_dict() for c in summary.final_curves],
    })


COMPONENT_STATS = ("effect_exact", "effect_exact_std", "effect_attr", "effect_attr_std",
                   "effect_log", "effect_median", "effect_trimmed", "moved_share",
                   "rank_value")


def component_rows(summary: Summary) -> list[dict]:
    """component_effect rows of a Summary: one per operator, layer, head (-1: the whole
    MLP layer) and prompt position."""
    from catalog.config.vocab import ROLES

    rows = []
    for op, ce in summary.components.items():
        n_layers, n_comp, _ = ce.rank_value.shape
        for layer in range(n_layers):
            for c in range(n_comp):
                for r, role in enumerate(ROLES):
                    rows.append({"op": op, "layer": layer,
                                 "head": -1 if c == n_comp - 1 else c, "position": role,
                                 "n_pairs": ce.n_pairs, "is_exact": bool(ce.is_exact[layer, c, r]),
                                 **{name: float(getattr(ce, name)[layer, c, r])
                                    for name in COMPONENT_STATS}})
    return rows


def store_layer(conn: psycopg.Connection, run: CheckpointRun, ids: CatalogIds, layer: int,
                tokenizer, worker: str) -> LayerResult:
    """Measure one layer and write it in one transaction; returns the result."""
    t0 = time.perf_counter()
    result = run.run_layer(layer)
    store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                      config_id=ids.config_id, rows=layer_rows(result, run, tokenizer),
                      worker=worker, seconds=time.perf_counter() - t0)
    return result


def catalog_checkpoint(
    url: str, lm: LoadedModel, config: ScienceConfig, layers: list[int] | None = None,
    progress: bool = False, execution: ExecutionConfig | None = None,
    resume: bool = False, on_resume=None,
) -> CatalogIds:
    """Measure ``lm`` and write every layer, then the summary, then refresh the views.

    With ``resume``, layers already stored for this checkpoint and config (an earlier
    run that was interrupted) are not computed again: the summary reads what it needs of
    them back from the store. ``on_resume(layers)`` is told which were skipped.
    """
    run = CheckpointRun(lm.model, lm.tokenizer, config, execution or ExecutionConfig(), layers)
    # autocommit: each layer's transaction commits when it is written, so a run stopped
    # part-way keeps its finished layers (and ``resume`` finds them)
    with store.connect(url, autocommit=True) as conn:
        run.prepare(progress=progress)  # first: a config the model cannot run writes nothing
        ids = register(conn, lm, config)
        write_layouts(conn, run, ids)
        done = sorted(set(reads.stored_layers(conn, checkpoint_id=ids.checkpoint_id,
                                              config_id=ids.config_id)) & set(run.layers)) \
            if resume else []
        digests = stored_digests(conn, ids, config, done, lm.model.cfg.d_mlp) if done else {}
        if done and on_resume is not None:
            on_resume(done)
        host = socket.gethostname()
        final = final_circuit(conn, ids, config, lm.model, lm.info.checkpoint)
        out = run.run_all(done=digests, progress=progress, measure=lambda layer: store_layer(
            conn, run, ids, layer, lm.tokenizer, host),
                          final=final[0] if final else None)
        if out.summary is not None:
            with conn.transaction():
                write_summary(conn, ids, out.summary, final[1] if final else None)
                store.refresh_views(conn, ids.model_id, ids.checkpoint_id, ids.config_id)
    return ids


def write_summary(conn: psycopg.Connection, ids: CatalogIds, summary: Summary,
                  final_checkpoint_id: int | None) -> None:
    """The summary row, its circuits and (measured against ``final_checkpoint_id``) the
    final circuit's curves; the caller holds the transaction."""
    row = summary_dict(summary)
    store.write_summary(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                        summary=row)
    if final_checkpoint_id is not None:
        training.write_final_curves(conn, checkpoint_id=ids.checkpoint_id,
                                    config_id=ids.config_id,
                                    final_checkpoint_id=final_checkpoint_id,
                                    curves=row["final_curves"])


def final_circuit(conn: psycopg.Connection, ids: CatalogIds, config: ScienceConfig, model,
                  step: int | None) -> tuple[FinalCircuit, int] | None:
    """The final checkpoint's paper circuit (catalog.circuits.final) rebuilt from the store
    for a checkpoint before it, and the final checkpoint's id; None when this checkpoint
    is the final one, comes after it, or no checkpoint of the model has a stored circuit
    under the config. Its ranking is what the final checkpoint's curve ranked by
    (circuit_summary.ranking): the attribution score (mean + std) or the catalog's rank."""
    src = training.final_source(conn, model_id=ids.model_id, config_id=ids.config_id)
    if src is None or src.checkpoint_id == ids.checkpoint_id or \
            (step is not None and src.step is not None and src.step <= step):
        return None
    shape = (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_mlp)
    return stored_circuit(conn, CatalogIds(ids.model_id, src.checkpoint_id, ids.config_id),
                          config, shape, src.plans, src.step), src.checkpoint_id


def stored_circuit(conn: psycopg.Connection, ids: CatalogIds, config: ScienceConfig,
                   shape: tuple[int, int, int], plans: dict[str, dict],
                   step: int | None) -> FinalCircuit:
    """The circuits stored for ``ids`` rebuilt as plans (catalog.circuits.final):
    ``plans`` are its circuit_summary rows (schema.training.circuit_plans), ``shape`` =
    (n_layers, n_heads, d_mlp). Each pruned layer is ranked by what its curve ranked by
    (circuit_summary.ranking): the attribution score (mean + std) or the catalog's rank."""
    n_layers, _, d_mlp = shape
    layers = sorted({int(x) for p in plans.values() for x in p["pruned"]})
    digests = stored_digests(conn, ids, config, layers, d_mlp)
    rows = {}
    for o, op in enumerate(config.operators):
        if op not in plans:
            continue
        score = np.full((n_layers, d_mlp), -np.inf)
        for layer in layers:
            d = digests[layer]
            by = d.attribution if plans[op]["ranking"] == "attribution" and \
                d.attribution is not None else d.effect
            score[layer] = np.nan_to_num(by[:, o], nan=-np.inf)
        rows[op] = {**plans[op], "score": score}
    return FinalCircuit.from_stored(step, shape, rows)


def stored_digests(conn: psycopg.Connection, ids: CatalogIds, config: ScienceConfig,
                   layers: list[int], d_mlp: int) -> dict[int, LayerDigest]:
    """What the summary needs of stored ``layers``, read back from the store: rank keys
    (d_mlp, n_ops; largest first), the labels (Matches) and the attribution scores (mean
    + std; None without attribution)."""
    ops = list(config.operators)

    def column(name: str) -> dict[int, np.ndarray]:
        out = {layer: np.full((d_mlp, len(ops)), np.nan, dtype=np.float32) for layer in layers}
        for layer, neuron, op, value in reads.layer_effects(conn, ids=ids, column=name):
            if layer in out:
                out[layer][neuron, ops.index(op)] = np.nan if value is None else value
        return out

    values = column("rank_value")
    attribution: dict[int, np.ndarray | None] = {layer: None for layer in layers}
    if "attribution" in config.patching:
        mean, std = column("effect_attr"), column("effect_attr_std")
        attribution = {layer: mean[layer] + std[layer] for layer in layers}
    records: dict[int, list] = {layer: [] for layer in layers}
    for (layer, neuron, op, score, bottom, family, target, params, base,
         p) in reads.stored_labels(conn, ids=ids):
        if layer in records:
            records[layer].append((neuron, ops.index(op),
                                   Heuristic(family, target, tuple(params)),
                                   score, bottom, base, p, True))
    mean_act, mean_kv = column("mean_act"), column("mean_kv")
    return {layer: LayerDigest(rank_key(values[layer], config.rank_sign),
                               Matches.from_records(records[layer]), attribution[layer],
                               mean_act[layer], mean_kv[layer])
            for layer in layers}
