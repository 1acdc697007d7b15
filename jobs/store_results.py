"""Join the science and the store: measure a checkpoint and write it, layer by layer.

``catalog`` knows nothing of the database and ``schema`` nothing of catalog's types;
this module converts between them and runs the whole pipeline for one checkpoint
without a queue. The Celery tasks call the same functions.
"""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass

import numpy as np
import psycopg

from catalog.config import CATALOG_VERSION, MeasureConfig
from catalog.measurement import (
    LayerResult,
    Matches,
    Prepared,
    Summary,
    measure_layer,
    prepare,
    summarize,
)
from catalog.sources import LoadedModel
from schema import store


@dataclass
class CatalogIds:
    model_id: int
    checkpoint_id: int
    config_id: int


def register(conn: psycopg.Connection, lm: LoadedModel, config: MeasureConfig) -> CatalogIds:
    """Upsert the model, checkpoint and config rows; returns their ids."""
    info = lm.info.as_dict()
    with conn.transaction():
        model_id = store.upsert_model(conn, info=info)
        checkpoint_id = store.upsert_checkpoint(conn, model_id=model_id, step=info["checkpoint"],
                                                revision=info["revision"],
                                                weights_hash=info["weights_hash"])
        config_id = store.upsert_config(conn, config=config.as_dict(),
                                        config_hash=config.config_hash(),
                                        catalog_version=CATALOG_VERSION)
    return CatalogIds(model_id, checkpoint_id, config_id)


def write_layouts(conn: psycopg.Connection, prep: Prepared, ids: CatalogIds) -> None:
    """Store each operator's valid-cell mask (how grids map back to a, b)."""
    table = prep.table
    with conn.transaction():
        for op in prep.config.operators:
            idx = table.op_index(op)
            valid = np.zeros(table.side * table.side, dtype=bool)
            valid[table.cell_index(idx)] = True
            store.upsert_grid_layout(conn, config_id=ids.config_id,
                                     number_limit=prep.numbers.limit, op=op, lo=table.lo,
                                     side=table.side, valid=valid,
                                     answer_index=answer_positions(prep, idx))


def answer_positions(prep: Prepared, idx: np.ndarray) -> np.ndarray:
    """Position of each prompt's answer token on the lens's number axis (number_ids)."""
    where = {int(t): i for i, t in enumerate(prep.number_ids)}
    return np.array([where[int(t)] for t in prep.table.answer[idx]], dtype=np.int32)


def layer_rows(result: LayerResult, prep: Prepared, tokenizer) -> store.LayerRows:
    """Convert one catalog LayerResult into the store's plain arrays."""
    table, ops = prep.table, list(prep.config.operators)
    nan = np.full_like(result.max_act, np.nan)
    stats = {
        "max_act": result.max_act, "mean_act": result.mean_act, "density": result.density,
        "effect_exact": result.effect_exact if result.effect_exact is not None else nan,
        "effect_exact_std": result.effect_exact_std if result.effect_exact_std is not None
        else nan,
        "effect_attr": result.effect_attr if result.effect_attr is not None else nan,
        "effect_attr_std": result.effect_attr_std if result.effect_attr_std is not None else nan,
        "rank": result.rank,
    }
    accuracy = np.array([table.correct[table.op_index(op)].mean() for op in ops])
    m = result.matches
    heuristics = {h.key: store.HeuristicRow(h.key, h.family, h.target, list(h.params), h.label)
                  for h in m.heuristic}

    def tokens(ids):
        return [tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]

    return store.LayerRows(
        layer=result.layer, ops=ops, stats=stats, op_accuracy=accuracy,
        grids=[result.acts[table.op_index(op)].T for op in ops],
        lens_numbers=result.lens.numbers,
        lens_top_tokens=tokens(result.lens.top_ids), lens_top_values=result.lens.top_values,
        lens_bottom_tokens=tokens(result.lens.bottom_ids),
        lens_bottom_values=result.lens.bottom_values,
        score_neuron=m.neuron, score_op=m.op, score_heuristic=[h.key for h in m.heuristic],
        score=m.score, score_bottom=m.bottom, heuristics=heuristics)


def _clean(x):
    """JSON-safe copy: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, float | np.floating):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


def summary_dict(summary: Summary, matches: dict[int, Matches], config: MeasureConfig) -> dict:
    """The checkpoint_summary row: summary plus heuristic-neuron counts per operator."""
    counts = {}
    for o, op in enumerate(config.operators):
        n = 0
        for m in matches.values():
            sel = (m.op == o) & (m.score >= config.match_threshold)
            n += len(np.unique(m.neuron[sel]))
        counts[op] = n
    return _clean({
        "accuracy": summary.accuracy,
        "faithfulness": {op: [[k, f] for k, f in curve]
                         for op, curve in summary.faithfulness.items()},
        "heuristic_knockouts": summary.heuristic_knockouts,
        "prompt_knockouts": summary.prompt_knockouts,
        "n_heuristic_neurons": counts,
    })


def catalog_checkpoint(
    url: str, lm: LoadedModel, config: MeasureConfig, layers: list[int] | None = None,
    progress: bool = False,
) -> CatalogIds:
    """Measure ``lm`` and write every layer, then the summary, then refresh the views."""
    with store.connect(url) as conn:
        ids = register(conn, lm, config)
        prep = prepare(lm.model, lm.tokenizer, config, layers, progress=progress)
        write_layouts(conn, prep, ids)
        results = {}
        todo = layers if layers is not None else list(range(lm.model.cfg.n_layers))
        for layer in todo:
            t0 = time.perf_counter()
            results[layer] = measure_layer(lm.model, prep, layer)
            store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id,
                              rows=layer_rows(results[layer], prep, lm.tokenizer),
                              worker=socket.gethostname(), seconds=time.perf_counter() - t0)
        if len(results) == lm.model.cfg.n_layers:
            summ = summarize(lm.model, prep, {k: v.effect for k, v in results.items()},
                             {k: v.matches for k, v in results.items()})
            with conn.transaction():
                store.write_summary(conn, checkpoint_id=ids.checkpoint_id,
                                    config_id=ids.config_id,
                                    summary=summary_dict(
                                        summ, {k: v.matches for k, v in results.items()},
                                        config))
                store.refresh_views(conn)
    return ids
