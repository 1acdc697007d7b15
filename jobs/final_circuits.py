"""The final circuit across training, whatever order the checkpoints were catalogued in.

A checkpoint summarized after its model's final checkpoint measures the final circuit in
its own summary (``store_results.final_circuit``). One summarized before it cannot: the
final circuit did not exist yet. ``fill`` measures those afterwards, one checkpoint at a
time (load, prepare, the final circuit's curves only; catalog.circuits.final), and also
replaces curves measured against an earlier "final" checkpoint when a later one has been
catalogued since. ``ncat final-circuit`` runs it; a worker runs it after the summary of
a model's final checkpoint; ``ncat catalog`` orders checkpoints latest first, so it
rarely needs to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg

from catalog.config import ExecutionConfig, ScienceConfig
from jobs import store_results
from schema import training
from schema.store import json_safe

log = logging.getLogger(__name__)


def fill(conn: psycopg.Connection, *, model_id: int, config_id: int,
         execution: ExecutionConfig | None = None, cache_root=None,
         on_checkpoint: Callable[[int | None, float], None] | None = None) -> list[int | None]:
    """Measure the final circuit at every earlier checkpoint of the model that lacks it
    under the config; returns their steps. ``on_checkpoint(step, seconds)`` is told as each
    is stored (its own transaction: a stopped fill keeps what it finished)."""
    import time

    from catalog.run.checkpoint import CheckpointRun
    from catalog.sources import load_model

    src = training.final_source(conn, model_id=model_id, config_id=config_id)
    if src is None:
        return []
    todo = training.lacking_final(conn, model_id=model_id, config_id=config_id,
                                  final_checkpoint_id=src.checkpoint_id)
    if not todo:
        return []
    name, config_dict = training.model_and_config(conn, model_id=model_id, config_id=config_id)
    config = ScienceConfig.from_dict(config_dict)
    execution = execution or ExecutionConfig()
    done = []
    for checkpoint_id, step in todo:
        t = time.perf_counter()
        lm = load_model(name, step, device=execution.device, dtype=config.torch_dtype(),
                        cache_root=cache_root, progress=False)
        ids = store_results.CatalogIds(model_id, checkpoint_id, config_id)
        final = store_results.final_circuit(conn, ids, config, lm.model, step)
        if final is None:
            continue
        run = CheckpointRun(lm.model, lm.tokenizer, config, execution).prepare()
        curves = run.final_curves(final[0])
        with conn.transaction():
            training.write_final_curves(
                conn, checkpoint_id=checkpoint_id, config_id=config_id,
                final_checkpoint_id=final[1],
                curves=[json_safe(c.as_dict()) for c in curves])
        done.append(step)
        if on_checkpoint is not None:
            on_checkpoint(step, time.perf_counter() - t)
        del lm, run
    return done
