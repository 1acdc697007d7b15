"""Every query on the ``job`` and ``job_layer`` tables, and the job status vocabulary.

A job is (model, checkpoint, config, layers); its layers move queued -> running ->
done (or failed / cancelled), and the job moves queued -> running -> summarizing ->
done, or failed / cancelled. ``jobs.enqueue``, ``jobs.runner`` and the explorer all
go through these functions, so a status string is written in one place.
"""

from __future__ import annotations

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


def count_loss(conn: psycopg.Connection, job_id: int, layer: int, cause: str) -> None:
    """One more loss of the layer (``resends``), with its cause, without queueing it: the
    caller is about to start it again."""
    conn.execute("UPDATE job_layer SET resends = resends + 1, error = %s "
                 "WHERE job_id = %s AND layer = %s", (cause[:ERROR_CHARS], job_id, layer))


def lose_layer(conn: psycopg.Connection, job_id: int, layer: int, *, resends: int,
               limit: int, cause: str, then: str) -> bool:
    """The one rule for a layer lost while running (its process died without a word, or
    its task or database connection was lost; the reconciler, a worker's redelivery and a
    worker that lost its connection all come here): the loss is counted in ``resends``
    (losses since a person last queued it, ``resends`` before this one); the ``limit``-th
    (NCAT_MAX_ATTEMPTS) fails the layer and its job with the cause, otherwise ``then``:
    'resend' (back to queued, to be sent again) or 'count' (the caller starts it again
    now). True if the layer failed."""
    if then not in ("resend", "count"):
        raise ValueError(f"then must be 'resend' or 'count', got {then!r}")
    lost = resends + 1
    if lost >= limit:
        fail_layer(conn, job_id, layer,
                   f"layer {layer} was lost {lost} times while running: {cause}; "
                   f"NCAT_MAX_ATTEMPTS is {limit}, so it is not started again "
                   "(`ncat retry` does)")
        return True
    if then == "resend":
        resend_layer(conn, job_id, layer, error=cause, only_running=True)
    else:
        count_loss(conn, job_id, layer, cause)
    return False


def start_layer(conn: psycopg.Connection, job_id: int, layer: int, worker: str) -> None:
    """The job is running (if it was queued) and this layer is, on ``worker``."""
    conn.execute("UPDATE job SET status = %s, updated_at = now() WHERE id = %s AND status = %s",
                 (Status.RUNNING, job_id, Status.QUEUED))
    conn.execute("UPDATE job_layer SET status = %s, worker = %s, started_at = now(), "
                 "heartbeat_at = now(), attempts = attempts + 1, error = NULL "
                 "WHERE job_id = %s AND layer = %s",
                 (Status.RUNNING, worker, job_id, layer))


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
                 error: str | None = None, only_running: bool = False) -> bool:
    """The layer back to queued, to be sent again: ``resends`` counts one more loss since
    a person last queued it (the reconciler and a worker that lost its connection both
    come here). With ``only_running``, only a layer still marked running; True if the row
    changed."""
    cond = "AND status = %s" if only_running else ""
    params: tuple = (Status.QUEUED, None if error is None else error[:ERROR_CHARS],
                     job_id, layer) + ((Status.RUNNING,) if only_running else ())
    return conn.execute(
        "UPDATE job_layer SET status = %s, error = coalesce(%s, error), sent_at = now(), "
        f"resends = resends + 1 WHERE job_id = %s AND layer = %s {cond} RETURNING layer",
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
        "sends = 0 "
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
