"""Prompts explained by a worker (the explorer's Prompt page, for models too large to
explain in its own process).

- table ``explain_request``: one request per (checkpoint, config, prompt) and knockout
  seeds: queued when sent, running while a worker explains it, done when its row of
  ``prompt_explanation`` is written (in the same transaction), failed with the error a
  worker met (a prompt longer than the model's context, a model that cannot be loaded).
  At most one request of a prompt is queued or running at a time (a partial unique index),
  so a second click or a second explorer session joins the first.

Revision ID: 0030
Revises: 0029
"""

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

READER = "catalog_reader"


def upgrade() -> None:
    op.execute("""
        CREATE TABLE explain_request (
            id SERIAL PRIMARY KEY,
            model_id INTEGER NOT NULL REFERENCES model(id) ON DELETE CASCADE,
            checkpoint_id INTEGER NOT NULL REFERENCES checkpoint(id) ON DELETE CASCADE,
            config_id INTEGER NOT NULL REFERENCES measure_config(id) ON DELETE CASCADE,
            prompt TEXT NOT NULL,
            seeds INTEGER NOT NULL CHECK (seeds >= 0),
            status VARCHAR(8) NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'done', 'failed')),
            error TEXT,
            worker TEXT,
            starts INTEGER NOT NULL DEFAULT 0,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            started_at TIMESTAMPTZ,
            finished_at TIMESTAMPTZ
        )""")
    op.execute("CREATE UNIQUE INDEX explain_request_open_idx ON explain_request "
               "(checkpoint_id, config_id, prompt) WHERE status IN ('queued', 'running')")
    op.execute("CREATE INDEX explain_request_prompt_idx ON explain_request "
               "(checkpoint_id, config_id, prompt, id)")
    op.execute(f"GRANT SELECT ON explain_request TO {READER}")


def downgrade() -> None:
    op.execute("DROP TABLE explain_request")
