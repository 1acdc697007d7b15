"""Every query on the ``job`` and ``job_layer`` tables, and the job status vocabulary.

A job is (model, checkpoint, config, layers); its layers move queued -> running ->
done (or failed / cancelled), and the job moves queued -> running -> summarizing ->
done, or failed / cancelled. ``jobs.enqueue``, ``jobs.runner`` and the explorer all
go through these functions, so a status string is written in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

import psycopg

from schema.store import scalar


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUMMARIZING = "summarizing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = (Status.QUEUED, Status.RUNNING, Status.SUMMARIZING)
ERROR_CHARS = 4000  # a stored error is cut to this many characters
FINISHED = (Status.DONE, Status.FAILED, Status.CANCELLED)



def at_checkpoint(model: str, step) -> str:
    """How commands and the explorer name a checkpoint: "MODEL step N", or "MODEL (final
    weights)" for a model without training steps (a hub model, a GGUF file)."""
    if step is None or step != step:  # None, or NaN from a pandas column
        return f"{model} (final weights)"
    return f"{model} step {int(step)}"

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
    grid_neurons: list[int] | None = None  # a full-grid job: these neurons of its layer


def load_job(conn: psycopg.Connection, job_id: int) -> JobRow | None:
    row = conn.execute("SELECT id, model_name, step, config_id, layers, device, force, status, "
                       "checkpoint_id, grid_neurons FROM job WHERE id = %s",
                       (job_id,)).fetchone()
    return JobRow(*row) if row else None


def job_config(conn: psycopg.Connection, config_id: int) -> dict:
    """The stored config JSON of a job."""
    return scalar(conn.execute("SELECT config FROM measure_config WHERE id = %s",
                        (config_id,)))


def layer_status(conn: psycopg.Connection, job_id: int, layer: int) -> str | None:
    row = conn.execute("SELECT status FROM job_layer WHERE job_id = %s AND layer = %s",
                       (job_id, layer)).fetchone()
    return row[0] if row else None


@dataclass
class LayerState:
    status: str
    attempts: int  # starts, ever
    resends: int  # losses since a person last queued it (retry resets them)
    worker: str | None  # who started it last


def layer_state(conn: psycopg.Connection, job_id: int, layer: int) -> LayerState | None:
    row = conn.execute("SELECT status, attempts, resends, worker FROM job_layer "
                       "WHERE job_id = %s AND layer = %s", (job_id, layer)).fetchone()
    return LayerState(*row) if row else None


def count_loss(conn: psycopg.Connection, job_id: int, layer: int, cause: str,
               kind: str) -> None:
    """One more loss of the layer (``resends``, ``loss_kinds``), with its cause, without
    queueing it: the caller is about to start it again."""
    conn.execute("UPDATE job_layer SET resends = resends + 1, error = %s, "
                 "loss_kinds = loss_kinds || %s::text WHERE job_id = %s AND layer = %s",
                 (cause[:ERROR_CHARS], kind, job_id, layer))


LOSS_KINDS = ("process died", "database unreachable", "no heartbeat")


def tally(kinds: list[str]) -> str:
    """'database unreachable 3 times' or 'process died 2 times, no heartbeat once': what
    a layer's losses were, in the order each kind first happened."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} {'once' if n == 1 else f'{n} times'}" for k, n in counts.items())


def lose_layer(conn: psycopg.Connection, job_id: int, layer: int, *, resends: int,
               limit: int, cause: str, then: str, kind: str) -> bool:
    """The one rule for a layer lost while running (its process died without a word, or
    its task or database connection was lost; the reconciler, a worker's redelivery and a
    worker that lost its connection all come here): the loss is counted in ``resends``
    (losses since a person last queued it, ``resends`` before this one) and its ``kind``
    (one of LOSS_KINDS) in ``loss_kinds``; the ``limit``-th (NCAT_MAX_ATTEMPTS) fails the
    layer and its job with every loss's kind counted and the last one's cause, otherwise
    ``then``: 'resend' (back to queued, to be sent again) or 'count' (the caller starts it
    again now). True if the layer failed."""
    if then not in ("resend", "count"):
        raise ValueError(f"then must be 'resend' or 'count', got {then!r}")
    if kind not in LOSS_KINDS:
        raise ValueError(f"kind must be one of {LOSS_KINDS}, got {kind!r}")
    lost = resends + 1
    if lost >= limit:
        row = conn.execute("SELECT loss_kinds FROM job_layer WHERE job_id = %s AND layer = %s",
                           (job_id, layer)).fetchone()
        kinds = list(row[0])[-(lost - 1):] if row and lost > 1 else []
        kinds = ["kind not recorded"] * (lost - 1 - len(kinds)) + kinds  # before 0037
        fail_layer(conn, job_id, layer,
                   f"layer {layer} was lost {lost} times while running "
                   f"({tally(kinds + [kind])}); the last: {cause}; NCAT_MAX_ATTEMPTS is "
                   f"{limit}, so it is not started again (`ncat retry` does)")
        return True
    if then == "resend":
        resend_layer(conn, job_id, layer, error=cause, only_running=True, kind=kind)
    else:
        count_loss(conn, job_id, layer, cause, kind)
    return False


def start_layer(conn: psycopg.Connection, job_id: int, layer: int, worker: str) -> int:
    """The job is running (if it was queued) and this layer is, on ``worker``; returns
    this start's number (``attempts``)."""
    conn.execute("UPDATE job SET status = %s, updated_at = now() WHERE id = %s AND status = %s",
                 (Status.RUNNING, job_id, Status.QUEUED))
    return int(scalar(conn.execute(
        "UPDATE job_layer SET status = %s, worker = %s, started_at = now(), "
        "heartbeat_at = now(), attempts = attempts + 1, error = NULL "
        "WHERE job_id = %s AND layer = %s RETURNING attempts",
        (Status.RUNNING, worker, job_id, layer))))


def finish_layer(conn: psycopg.Connection, job_id: int, layer: int, status: Status,
                 error: str | None = None) -> None:
    conn.execute("UPDATE job_layer SET status = %s, finished_at = now(), error = %s "
                 "WHERE job_id = %s AND layer = %s",
                 (status, None if error is None else error[:ERROR_CHARS], job_id, layer))
    conn.execute("UPDATE job SET updated_at = now() WHERE id = %s", (job_id,))


def fail_layer(conn: psycopg.Connection, job_id: int, layer: int, error: str) -> None:
    """The layer failed with ``error``, and so did its job; stored layers stay."""
    finish_layer(conn, job_id, layer, Status.FAILED, error=error)
    fail_job(conn, job_id, error, layer)


def resend_layer(conn: psycopg.Connection, job_id: int, layer: int, *,
                 error: str | None = None, only_running: bool = False,
                 kind: str = "no heartbeat") -> bool:
    """The layer back to queued, to be sent again: ``resends`` counts one more loss since
    a person last queued it (the reconciler and a worker that lost its connection both
    come here). With ``only_running``, only a layer still marked running; True if the row
    changed."""
    cond = "AND status = %s" if only_running else ""
    params: tuple = (Status.QUEUED, None if error is None else error[:ERROR_CHARS], kind,
                     job_id, layer) + ((Status.RUNNING,) if only_running else ())
    return conn.execute(
        "UPDATE job_layer SET status = %s, error = coalesce(%s, error), sent_at = now(), "
        "resends = resends + 1, loss_kinds = loss_kinds || %s::text "
        f"WHERE job_id = %s AND layer = %s {cond} RETURNING layer",
        params).fetchone() is not None


def resend_queued(conn: psycopg.Connection, job_id: int, layer: int) -> bool:
    """A queued layer sent again (its message may be lost, or wait in a worker's
    prefetch): ``sends`` counts it, not ``resends`` (no start of it died). True if the
    row changed."""
    return conn.execute(
        "UPDATE job_layer SET sent_at = now(), sends = sends + 1 WHERE job_id = %s "
        "AND layer = %s AND status = %s RETURNING layer",
        (job_id, layer, Status.QUEUED)).fetchone() is not None


def set_checkpoint(conn: psycopg.Connection, job_id: int, checkpoint_id: int) -> None:
    conn.execute("UPDATE job SET checkpoint_id = %s WHERE id = %s", (checkpoint_id, job_id))


def fail_job(conn: psycopg.Connection, job_id: int, error: str, layer: int | None) -> None:
    """Mark a job failed with the error and the layer it failed on; stored layers stay."""
    conn.execute("UPDATE job SET status = %s, error = %s, failed_layer = %s, "
                 "updated_at = now(), finished_at = now() WHERE id = %s",
                 (Status.FAILED, error[:ERROR_CHARS], layer, job_id))


def claim_summary(conn: psycopg.Connection, job_id: int) -> bool:
    """Atomically move a job whose layers are all done to summarizing; True if this
    caller won. The caller holds the job's summary lock (jobs.locks), so a job already
    'summarizing' was left so by a worker that died: it is claimed again."""
    return conn.execute(
        "UPDATE job SET status = %s, updated_at = now() WHERE id = %s AND status IN (%s, %s) "
        "AND NOT EXISTS (SELECT 1 FROM job_layer WHERE job_id = %s AND status <> %s) "
        "RETURNING id", (Status.SUMMARIZING, job_id, Status.RUNNING, Status.SUMMARIZING,
                         job_id, Status.DONE)).fetchone() is not None


def later_pending(conn: psycopg.Connection, job: JobRow) -> bool:
    """Whether a job of ``job``'s model and config at a later training step (a job with a
    summary, not a full-grid one) still has layers to measure: queued or running (the
    latest checkpoint to be summarized measures the final circuit at the earlier ones:
    ``jobs.runner._fill_final_circuits``)."""
    if job.step is None:  # a model without steps has one checkpoint
        return False
    return conn.execute(
        "SELECT 1 FROM job WHERE model_name = %s AND config_id = %s AND id <> %s "
        "AND step > %s AND grid_neurons IS NULL AND status IN (%s, %s) LIMIT 1",
        (job.model_name, job.config_id, job.id, job.step, Status.QUEUED,
         Status.RUNNING)).fetchone() is not None


def mark_done(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute("UPDATE job SET status = %s, updated_at = now(), finished_at = now() "
                 "WHERE id = %s", (Status.DONE, job_id))


def insert_job(conn: psycopg.Connection, *, key: str, model: str, step: int | None,
               config_id: int, layers: list[int], device: str, force: bool, done: bool,
               checkpoint_id: int | None, grid_neurons: list[int] | None = None) -> int | None:
    """A new job and its layers (done at once when ``done``); None if the key exists.
    With ``grid_neurons`` it is a full-grid job (one layer)."""
    status = Status.DONE if done else Status.QUEUED
    row = conn.execute(
        "INSERT INTO job (job_key, model_name, step, config_id, layers, device, force, "
        "status, checkpoint_id, grid_neurons, finished_at) VALUES (%s, %s, %s, %s, %s, %s, "
        "%s, %s, %s, %s, CASE WHEN %s THEN now() END) ON CONFLICT (job_key) DO NOTHING "
        "RETURNING id",
        (key, model, step, config_id, layers, device, force, status, checkpoint_id,
         grid_neurons, done)).fetchone()
    if row is None:
        return None
    for layer in layers:
        conn.execute("INSERT INTO job_layer (job_id, layer, status, attempts, finished_at, "
                     "sent_at) VALUES (%s, %s, %s, 0, CASE WHEN %s THEN now() END, now())",
                     (row[0], layer, status, done))
    return row[0]


def job_id_by_key(conn: psycopg.Connection, key: str) -> int:
    return scalar(conn.execute("SELECT id FROM job WHERE job_key = %s", (key,)))


def requeue(conn: psycopg.Connection, job_id: int, *, only_unfinished: bool,
            force: bool) -> list[int]:
    """Queue a job's layers again (all, or those not done); returns them."""
    cond = "AND status <> 'done'" if only_unfinished else ""
    layers = [r[0] for r in conn.execute(
        f"UPDATE job_layer SET status = %s, error = NULL, sent_at = now(), resends = 0, "
        "sends = 0, loss_kinds = '{}' "
        f"WHERE job_id = %s {cond} "
        "RETURNING layer", (Status.QUEUED, job_id)).fetchall()]
    conn.execute("UPDATE job SET status = %s, error = NULL, failed_layer = NULL, "
                 "force = %s, finished_at = NULL, updated_at = now() WHERE id = %s",
                 (Status.QUEUED, force, job_id))
    return sorted(layers)


def resume_summary(conn: psycopg.Connection, job_id: int) -> None:
    """A job whose layers are all stored goes back to running, so that the next worker to
    see one of its layers claims and runs the final step."""
    conn.execute("UPDATE job SET status = %s, error = NULL, failed_layer = NULL, "
                 "finished_at = NULL, updated_at = now() WHERE id = %s",
                 (Status.RUNNING, job_id))


def first_layer(conn: psycopg.Connection, job_id: int) -> int:
    return scalar(conn.execute("SELECT min(layer) FROM job_layer WHERE job_id = %s",
                               (job_id,)))


def cancel(conn: psycopg.Connection, job_id: int) -> str | None:
    """Cancel a queued or running job; returns None if it was, else its status (or
    'missing')."""
    row = conn.execute("UPDATE job SET status = %s, updated_at = now(), finished_at = now() "
                       "WHERE id = %s AND status IN (%s, %s) RETURNING id",
                       (Status.CANCELLED, job_id, Status.QUEUED, Status.RUNNING)).fetchone()
    if row:
        conn.execute("UPDATE job_layer SET status = %s WHERE job_id = %s AND status = %s",
                     (Status.CANCELLED, job_id, Status.QUEUED))
        return None
    status = conn.execute("SELECT status FROM job WHERE id = %s", (job_id,)).fetchone()
    return status[0] if status else "missing"


def job_status(conn: psycopg.Connection, job_id: int) -> str | None:
    row = conn.execute("SELECT status FROM job WHERE id = %s", (job_id,)).fetchone()
    return row[0] if row else None


@dataclass
class JobProgress:
    job_id: int
    model: str
    step: int | None
    status: str
    layers_total: int
    layers_done: int
    error: str | None
    failed_layer: int | None
    workers: list[str]
    updated_at: object = None


def progress(conn: psycopg.Connection, job_ids: list[int] | None = None,
             newest_first: bool = False, limit: int | None = None) -> list[JobProgress]:
    """Progress of jobs (all, or the given ones): the one job-progress query."""
    order = "DESC" if newest_first else "ASC"
    rows = conn.execute(
        "SELECT j.id, j.model_name, j.step, j.status, count(l.layer), "
        "count(l.layer) FILTER (WHERE l.status = 'done'), j.error, j.failed_layer, "
        "array_remove(array_agg(DISTINCT l.worker), NULL), j.updated_at "
        "FROM job j LEFT JOIN job_layer l ON l.job_id = j.id "
        "WHERE %s::int[] IS NULL OR j.id = ANY(%s::int[]) "
        f"GROUP BY j.id ORDER BY j.id {order} LIMIT %s",
        (job_ids, job_ids, limit)).fetchall()
    return [JobProgress(*r) for r in rows]


# ------------------------------------------------------------------ the reconciler's reads


def try_lock(conn, key: int, *, transaction: bool = False) -> bool:
    """Take advisory lock ``key`` if no other session holds it (for this transaction
    only, with ``transaction``); True if taken."""
    fn = "pg_try_advisory_xact_lock" if transaction else "pg_try_advisory_lock"
    return bool(scalar(conn.execute(f"SELECT {fn}(%s)", (key,))))


def unlock(conn, key: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def beat(conn, job_id: int, layer: int | None) -> None:
    """A heartbeat: of the layer, or of the job's final step (``layer`` None)."""
    if layer is None:
        conn.execute("UPDATE job SET updated_at = now() WHERE id = %s", (job_id,))
    else:
        conn.execute("UPDATE job_layer SET heartbeat_at = now() WHERE job_id = %s "
                     "AND layer = %s", (job_id, layer))


def layer_losses(conn, job_id: int, layer: int) -> tuple[str | None, int]:
    """(status, resends) of a job's layer; (None, 0) if it has no row."""
    row = conn.execute("SELECT status, resends FROM job_layer WHERE job_id = %s "
                       "AND layer = %s", (job_id, layer)).fetchone()
    return (row[0], int(row[1])) if row else (None, 0)


def queued_layers(conn, job_id: int) -> list[int]:
    """The job's layers that are queued (no one has started them), in order."""
    return [int(r[0]) for r in conn.execute(
        "SELECT layer FROM job_layer WHERE job_id = %s AND status = %s ORDER BY layer",
        (job_id, Status.QUEUED)).fetchall()]


def grids_of(conn, checkpoint_id: int, config_hash: str, layer: int,
             neurons: list[int]) -> tuple[int, dict[int, bool], int]:
    """(config id, neuron -> whether its stored grid is a sketch, for the ``neurons`` that
    have one, the layer's neuron count) of a stored layer."""
    config_id = scalar(conn.execute("SELECT id FROM measure_config WHERE config_hash = %s",
                                    (config_hash,)))
    stored = dict(conn.execute(
        "SELECT neuron, bool_or(sketch) FROM neuron_grid WHERE checkpoint_id = %s AND "
        "config_id = %s AND layer = %s AND neuron = ANY(%s) GROUP BY neuron",
        (checkpoint_id, config_id, layer, neurons)).fetchall())
    width = scalar(conn.execute(
        "SELECT count(DISTINCT neuron) FROM neuron_op WHERE checkpoint_id = %s AND "
        "config_id = %s AND layer = %s", (checkpoint_id, config_id, layer)))
    return int(config_id), stored, int(width)


def advisory_keys(conn) -> set[int]:
    """Advisory lock keys (bigint form) held by any session in THIS database (advisory
    locks are per database: another catalog on the same server has job ids, and so lock
    keys, of its own)."""
    rows = conn.execute(
        "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks "
        "WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return {r[0] for r in rows}


def active_layers(conn) -> list[tuple]:
    """(job, layer, status, attempts, resends, sends, worker, seconds quiet) of the queued
    and running layers of active jobs; quiet is since the last heartbeat, send or start."""
    return conn.execute(
        "SELECT l.job_id, l.layer, l.status, l.attempts, l.resends, l.sends, l.worker, "
        "extract(epoch FROM now() - greatest(l.heartbeat_at, l.sent_at, l.started_at)) "
        "FROM job_layer l JOIN job j ON j.id = l.job_id "
        "WHERE j.status IN (%s, %s) AND l.status IN (%s, %s) ORDER BY l.job_id, l.layer",
        (Status.QUEUED, Status.RUNNING, Status.QUEUED, Status.RUNNING)).fetchall()


def finished_layers_jobs(conn) -> list[tuple]:
    """(job, status, seconds since its last update, its first layer, how often its summary
    was resumed since its last layer finished) of the active jobs whose layers are all
    done: their final step is to run, or running."""
    return conn.execute(
        "SELECT j.id, j.status, extract(epoch FROM now() - j.updated_at), "
        "(SELECT min(layer) FROM job_layer WHERE job_id = j.id), "
        "(SELECT count(*) FROM reconcile_event e WHERE e.job_id = j.id "
        " AND e.action = 'summary_resumed' AND e.at > coalesce((SELECT max(finished_at) "
        " FROM job_layer WHERE job_id = j.id), j.created_at)) FROM job j "
        "WHERE j.status IN (%s, %s, %s) AND NOT EXISTS (SELECT 1 FROM job_layer l "
        "WHERE l.job_id = j.id AND l.status <> %s)",
        (Status.QUEUED, Status.RUNNING, Status.SUMMARIZING, Status.DONE)).fetchall()


def record_events(conn, events: list[tuple]) -> None:
    """The reconciler's actions, (job, layer, action, detail) each, into reconcile_event."""
    for job_id, layer, action, detail in events:
        conn.execute("INSERT INTO reconcile_event (job_id, layer, action, detail) "
                     "VALUES (%s, %s, %s, %s)", (job_id, layer, action, json.dumps(detail)))


def recent_events(conn, job_ids: list[int] | None = None, limit: int = 10) -> list[tuple]:
    """The reconciler's latest actions: (at, job, layer, action, detail), newest first."""
    return conn.execute(
        "SELECT at, job_id, layer, action, detail FROM reconcile_event "
        "WHERE %s::int[] IS NULL OR job_id = ANY(%s::int[]) ORDER BY at DESC, id DESC LIMIT %s",
        (job_ids, job_ids, limit)).fetchall()
