"""What a worker does for one (job, layer), and the job's final step. No Celery here.

Each layer is computed at most once at a time: the worker holds a PostgreSQL
session-level advisory lock on (job, layer) while it works, which the server releases
when the worker's connection dies, so a redelivered task after a crash can take over
while a duplicate delivery to a live worker is skipped. A layer is written in one
transaction (schema.store.write_layer), so no partial layer is ever visible, and a
layer already stored is not recomputed (unless the job was forced). The worker that
stores a job's last layer claims the job's final step (summary, view refresh) with an
atomic status update.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import psycopg

from schema import store

log = logging.getLogger(__name__)


@dataclass
class JobRow:
    id: int
    model_name: str
    step: int | None
    config_id: int
    layers: list[int]
    device: str
    force: bool
    status: str
    checkpoint_id: int | None


def load_job(conn: psycopg.Connection, job_id: int) -> JobRow | None:
    row = conn.execute("SELECT id, model_name, step, config_id, layers, device, force, status, "
                       "checkpoint_id FROM job WHERE id = %s", (job_id,)).fetchone()
    return JobRow(*row) if row else None


# One model, and the shared preparation of its current (checkpoint, config), per process:
# the next task on the same model reuses them.
_MODEL: dict[tuple, object] = {}
_PREP: dict[tuple, object] = {}
# Effects and matches of the layers this process computed, per job: when one worker did
# every layer, the summary needs no read-back from the database.
_RESULTS: dict[int, dict[int, tuple]] = {}

# Capture every layer's activations in the one grid pass when they fit in this budget.
ACTIVATION_BUDGET_BYTES = int(os.environ.get("NCAT_ACTIVATION_BUDGET", 2 * 1024**3))


def _loaded(job: JobRow):
    from catalog.sources import load_model

    key = (job.model_name, job.step, job.device)
    if key not in _MODEL:
        _MODEL.clear()
        _PREP.clear()
        _MODEL[key] = load_model(job.model_name, job.step, device=job.device)
    return _MODEL[key]


def _config(conn, config_id: int):
    from catalog.config import MeasureConfig

    data = conn.execute("SELECT config FROM measure_config WHERE id = %s",
                        (config_id,)).fetchone()[0]
    return worker_batching(MeasureConfig.from_dict(data))


def worker_batching(config):
    """The config with this worker's batch sizes, where NCAT_BATCH_SIZE (prompts per forward)
    or NCAT_PATCH_CHUNK (neurons per patched forward) are set: a worker on a small GPU
    lowers them. They change no stored number, so the job's config hash stays the same."""
    import dataclasses

    changes = {}
    for field, var in (("batch_size", "NCAT_BATCH_SIZE"), ("patch_chunk", "NCAT_PATCH_CHUNK")):
        value = os.environ.get(var)
        if value is None:
            continue
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{var} must be a positive integer, got {value!r}")
        changes[field] = int(value)
    return dataclasses.replace(config, **changes) if changes else config


def _prepared(conn, job: JobRow, layer: int):
    """(LoadedModel, Prepared, CatalogIds) for the job, cached per process."""
    from catalog.measurement import prepare
    from jobs.store_results import register, write_layouts

    lm = _loaded(job)
    config = _config(conn, job.config_id)
    key = (job.model_name, job.step, config.config_hash())
    if key not in _PREP:
        n_prompts_guess = len(config.operators) * (config.operand_hi - config.operand_lo) ** 2
        all_fit = (n_prompts_guess * lm.model.cfg.n_layers * lm.model.cfg.d_mlp * 4
                   <= ACTIVATION_BUDGET_BYTES)
        prep = prepare(lm.model, lm.tokenizer, config, None if all_fit else [layer])
        ids = register(conn, lm, config)
        write_layouts(conn, prep, ids)
        _PREP.clear()
        _PREP[key] = (prep, ids)
    prep, ids = _PREP[key]
    return lm, prep, ids


def _set_layer(conn, job_id: int, layer: int, status: str, worker: str | None = None,
               error: str | None = None) -> None:
    if status == "running":
        conn.execute("UPDATE job_layer SET status = 'running', worker = %s, started_at = now(), "
                     "attempts = attempts + 1, error = NULL WHERE job_id = %s AND layer = %s",
                     (worker, job_id, layer))
    else:
        conn.execute("UPDATE job_layer SET status = %s, finished_at = now(), error = %s "
                     "WHERE job_id = %s AND layer = %s", (status, error, job_id, layer))


def fail_job(conn, job_id: int, error: str, layer: int | None) -> None:
    """Mark a job failed with the error and the layer it failed on; stored layers stay."""
    conn.execute("UPDATE job SET status = 'failed', error = %s, failed_layer = %s, "
                 "updated_at = now(), finished_at = now() WHERE id = %s",
                 (error[:4000], layer, job_id))


def process_layer(url: str, job_id: int, layer: int, worker: str) -> str:
    """Compute and store one layer of a job; returns what happened (for logs and tests)."""
    with store.connect(url, autocommit=True) as conn:
        job = load_job(conn, job_id)
        if job is None:
            return "unknown job"
        if job.status in ("cancelled", "failed", "done"):
            return f"skipped ({job.status})"
        if not conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (job_id, layer)).fetchone()[0]:
            return "busy"  # a live worker is computing this layer right now
        try:
            return _process_locked(conn, url, job, layer, worker)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (job_id, layer))


def _process_locked(conn, url: str, job: JobRow, layer: int, worker: str) -> str:
    from catalog.measurement import measure_layer
    from jobs.store_results import layer_rows

    done = conn.execute("SELECT status FROM job_layer WHERE job_id = %s AND layer = %s",
                        (job.id, layer)).fetchone()
    if done and done[0] == "done":
        return "already done"
    conn.execute("UPDATE job SET status = 'running', updated_at = now() "
                 "WHERE id = %s AND status = 'queued'", (job.id,))
    _set_layer(conn, job.id, layer, "running", worker)
    t0 = time.perf_counter()
    try:
        lm, prep, ids = _prepared(conn, job, layer)
        conn.execute("UPDATE job SET checkpoint_id = %s WHERE id = %s",
                     (ids.checkpoint_id, job.id))
        stored = store.stored_layers(conn, checkpoint_id=ids.checkpoint_id,
                                     config_id=ids.config_id)
        if job.force or layer not in stored:
            result = measure_layer(lm.model, prep, layer)
            if sum(a.nbytes for a in prep.acts.values()) > ACTIVATION_BUDGET_BYTES:
                prep.acts.pop(layer)  # over the budget: keep no layer's grid once it is done
            if job.id not in _RESULTS:
                _RESULTS.clear()
            _RESULTS.setdefault(job.id, {})[layer] = (result.effect, result.matches)
            store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id,
                              rows=layer_rows(result, prep, lm.tokenizer), worker=worker,
                              seconds=time.perf_counter() - t0)
            outcome = "computed"
        else:
            outcome = "already stored"
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        log.exception("job %s layer %s failed", job.id, layer)
        _set_layer(conn, job.id, layer, "failed", error=message)
        fail_job(conn, job.id, message, layer)
        return "failed"
    _set_layer(conn, job.id, layer, "done")
    conn.execute("UPDATE job SET updated_at = now() WHERE id = %s", (job.id,))
    finalize_if_complete(conn, job.id)
    return outcome


def finalize_if_complete(conn, job_id: int) -> bool:
    """If every layer of the job is stored, claim and run its final step once."""
    claimed = conn.execute(
        "UPDATE job SET status = 'summarizing', updated_at = now() WHERE id = %s "
        "AND status = 'running' AND NOT EXISTS (SELECT 1 FROM job_layer "
        "WHERE job_id = %s AND status <> 'done') RETURNING id", (job_id, job_id)).fetchone()
    if not claimed:
        return False
    job = load_job(conn, job_id)
    try:
        _summarize(conn, job)
    except Exception as exc:
        log.exception("job %s summary failed", job_id)
        fail_job(conn, job_id, f"summary: {type(exc).__name__}: {exc}", None)
        return False
    conn.execute("UPDATE job SET status = 'done', updated_at = now(), finished_at = now() "
                 "WHERE id = %s", (job_id,))
    return True


def _summarize(conn, job: JobRow) -> None:
    """Checkpoint summary from the stored layers (any worker may have written them)."""
    from catalog.measurement import summarize
    from jobs.store_results import summary_dict

    lm, prep, ids = _prepared(conn, job, job.layers[0])
    n_layers = lm.model.cfg.n_layers
    if sorted(job.layers) == list(range(n_layers)):
        here = _RESULTS.get(job.id, {})
        if sorted(here) == list(range(n_layers)):
            effects = {layer: here[layer][0] for layer in here}
            matches = {layer: here[layer][1] for layer in here}
        else:
            effects, matches = stored_effects_and_matches(conn, ids, prep.config, n_layers,
                                                          lm.model.cfg.d_mlp)
        summary = summarize(lm.model, prep, effects, matches)
        with conn.transaction():
            store.write_summary(conn, checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                summary=summary_dict(summary, matches, prep.config))
    store.refresh_views(conn)


def stored_effects_and_matches(conn, ids, config, n_layers: int, d_mlp: int):
    """Effects (d_mlp, n_ops) and the Matches the summary uses (score >= the config's
    match threshold; the summary looks at no other), read back from the store."""
    from catalog.heuristics import Heuristic
    from catalog.measurement import Matches

    ops = list(config.operators)
    column = "effect_exact" if "exact" in config.patching else "effect_attr"
    effects = {layer: np.full((d_mlp, len(ops)), np.nan, dtype=np.float32)
               for layer in range(n_layers)}
    for layer, neuron, op, value in conn.execute(
            f"SELECT layer, neuron, op, {column} FROM neuron_op WHERE model_id = %s "
            "AND checkpoint_id = %s AND config_id = %s",
            (ids.model_id, ids.checkpoint_id, ids.config_id)).fetchall():
        effects[layer][neuron, ops.index(op)] = np.nan if value is None else value
    rows = {layer: [] for layer in range(n_layers)}
    for layer, neuron, op, score, bottom, family, target, params in conn.execute(
            "SELECT s.layer, s.neuron, s.op, s.score, s.bottom, h.family, h.target, h.params "
            "FROM neuron_score s JOIN heuristic h ON h.id = s.heuristic_id "
            "WHERE s.model_id = %s AND s.checkpoint_id = %s AND s.config_id = %s "
            "AND s.score >= %s ORDER BY s.layer, s.neuron, s.op, h.key",
            (ids.model_id, ids.checkpoint_id, ids.config_id,
             float(np.float32(config.match_threshold)))).fetchall():
        rows[layer].append((neuron, ops.index(op), Heuristic(family, target, tuple(params)),
                            score, bottom))
    matches = {layer: Matches(
        neuron=np.array([r[0] for r in rs], dtype=np.int32),
        op=np.array([r[1] for r in rs], dtype=np.int8),
        heuristic=[r[2] for r in rs],
        score=np.array([r[3] for r in rs], dtype=np.float32),
        bottom=np.array([r[4] for r in rs], dtype=bool)) for layer, rs in rows.items()}
    return effects, matches
