"""The check against transformers, kept (issue 50): ``checkpoint.transformers_nats``.

Every load of a model that transformers can also run compares the converted model's
next-token log-probabilities with transformers' and refuses a difference over 0.01 nats
(catalog.sources.hf.check_against_transformers). The difference itself was dropped, so a
reader could not tell 7e-5 from 0.009; each checkpoint's row now keeps it (NULL where
nothing was compared: the built-in model, rows written before).

Revision ID: 0032
Revises: 0031
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE checkpoint ADD COLUMN transformers_nats REAL")


def downgrade() -> None:
    op.execute("ALTER TABLE checkpoint DROP COLUMN transformers_nats")
