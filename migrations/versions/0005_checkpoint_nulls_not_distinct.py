"""One checkpoint per (model, step), a missing step included.

The unique constraint treated NULL steps as distinct, so a model without training
steps (a GGUF file, a local directory) could get two checkpoint rows when two processes
registered it at once. NULLS NOT DISTINCT (PostgreSQL 15+) closes that, and lets the
writer upsert with ON CONFLICT instead of select-then-insert.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("uq_checkpoint_model_step", "checkpoint", type_="unique")
    op.create_unique_constraint("uq_checkpoint_model_step", "checkpoint", ["model_id", "step"],
                                postgresql_nulls_not_distinct=True)


def downgrade() -> None:
    op.drop_constraint("uq_checkpoint_model_step", "checkpoint", type_="unique")
    op.create_unique_constraint("uq_checkpoint_model_step", "checkpoint", ["model_id", "step"])
