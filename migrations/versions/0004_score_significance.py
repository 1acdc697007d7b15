"""Base rate and p-value beside every heuristic score.

A score is the share of a heuristic's cells among a neuron's top-k cells; on a random
ordering its expected value is the base rate |S_H| / cells, and the exact upper tail of
the hypergeometric overlap is its p-value (docs/method.md section 7). Rows written
before this revision keep NULL in both.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import DOUBLE_PRECISION

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # on the partitioned parent: PostgreSQL adds the columns to every partition
    op.add_column("neuron_score", sa.Column("base_rate", sa.REAL(), nullable=True))
    op.add_column("neuron_score", sa.Column("p_value", DOUBLE_PRECISION(), nullable=True))


def downgrade() -> None:
    op.drop_column("neuron_score", "p_value")
    op.drop_column("neuron_score", "base_rate")
