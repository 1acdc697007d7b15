"""Prompts explained by a worker (``explain_request``, migration 0030): requested by the
explorer's Prompt page, claimed and finished by ``jobs.explain_jobs``. A request is
queued, then running, then done (its explanation written in the same transaction) or
failed with the error the worker met; one request of a (checkpoint, config, prompt) is
open at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from schema.explanations import write_explanation

COLS = ("id", "model_id", "checkpoint_id", "config_id", "prompt", "seeds", "status",
        "error", "worker", "starts", "created_at", "started_at", "finished_at")


@dataclass
class ExplainRequest:
    id: int
    model_id: int
    checkpoint_id: int
    config_id: int
    prompt: str
    seeds: int
    status: str
    error: str | None
    worker: str | None
    starts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def _one(row) -> ExplainRequest | None:
    return None if row is None else ExplainRequest(*row)


def request_target(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int,
                   config_id: int) -> tuple[str, int | None, dict]:
    """(model name, step, stored config) of a catalogued checkpoint and config; ValueError
    naming the one the catalog does not hold."""
    row = conn.execute("SELECT m.name, c.step FROM checkpoint c JOIN model m ON "
                       "m.id = c.model_id WHERE c.id = %s AND m.id = %s",
                       (checkpoint_id, model_id)).fetchone()
    if row is None:
        raise ValueError(f"checkpoint #{checkpoint_id} of model #{model_id} is not in the "
                         "catalog")
    config = conn.execute("SELECT config FROM measure_config WHERE id = %s",
                          (config_id,)).fetchone()
    if config is None:
        raise ValueError(f"no measurement config #{config_id} in the catalog")
    return row[0], row[1], config[0]


def request_explanation(conn: psycopg.Connection, *, model_id: int, checkpoint_id: int,
                        config_id: int, prompt: str, seeds: int
                        ) -> tuple[ExplainRequest, bool]:
    """(the open request of the prompt, whether this call created it): a prompt already
    queued or running is not requested twice (two sessions clicking at once included:
    the partial unique index decides)."""
    with conn.transaction():
        row = conn.execute(
            f"INSERT INTO explain_request (model_id, checkpoint_id, config_id, prompt, "
            f"seeds) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (checkpoint_id, config_id, "
            f"prompt) WHERE status IN ('queued', 'running') DO NOTHING "
            f"RETURNING {', '.join(COLS)}",
            (model_id, checkpoint_id, config_id, prompt, seeds)).fetchone()
    if row is not None:
        return ExplainRequest(*row), True
    got = latest_request(conn, checkpoint_id=checkpoint_id, config_id=config_id,
                         prompt=prompt)
    assert got is not None and got.status in ("queued", "running"), got
    return got, False


def latest_request(conn: psycopg.Connection, *, checkpoint_id: int, config_id: int,
                   prompt: str) -> ExplainRequest | None:
    """The prompt's most recent request, None if it was never requested."""
    return _one(conn.execute(
        f"SELECT {', '.join(COLS)} FROM explain_request WHERE checkpoint_id = %s AND "
        "config_id = %s AND prompt = %s ORDER BY id DESC LIMIT 1",
        (checkpoint_id, config_id, prompt)).fetchone())


def claim_request(conn: psycopg.Connection, request_id: int, worker: str
                  ) -> ExplainRequest | None:
    """Mark a queued request running (or a running one whose worker died: the broker
    delivers it again) and count the start; None when it is done, failed or unknown
    (a message sent twice is then dropped)."""
    with conn.transaction():
        return _one(conn.execute(
            "UPDATE explain_request SET status = 'running', worker = %s, starts = starts + 1, "
            "started_at = now() WHERE id = %s AND status IN ('queued', 'running') "
            f"RETURNING {', '.join(COLS)}", (worker, request_id)).fetchone())


def finish_request(conn: psycopg.Connection, request: ExplainRequest, explanation: dict
                   ) -> None:
    """Write the explanation and mark the request done, together."""
    with conn.transaction():
        write_explanation(conn, model_id=request.model_id,
                          checkpoint_id=request.checkpoint_id,
                          config_id=request.config_id, explanation=explanation)
        conn.execute("UPDATE explain_request SET status = 'done', finished_at = now(), "
                     "error = NULL WHERE id = %s", (request.id,))


def fail_request(conn: psycopg.Connection, request_id: int, error: str) -> None:
    with conn.transaction():
        conn.execute("UPDATE explain_request SET status = 'failed', finished_at = now(), "
                     "error = %s WHERE id = %s", (error, request_id))
