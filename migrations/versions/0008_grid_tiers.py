"""Grid storage tiers: full grids for the top set, sketches for the rest, zstd.

- neuron_grid: ``codec`` (0: the raw 8-bit codes every row held before; 1: one zstd
  frame) and ``sketch`` (the payload is a sketch: block means plus row and column means,
  schema.sketch; false: every valid cell). Rows written before keep reading as raw full
  grids.
- job: ``grid_neurons``, set for a full-grid job (the neurons of its one layer whose
  grids are to be computed and stored in full); NULL for a measurement job.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # on the partitioned parent: every partition gets the columns
    op.add_column("neuron_grid", sa.Column("codec", sa.SmallInteger(), nullable=False,
                                           server_default="0"))
    op.add_column("neuron_grid", sa.Column("sketch", sa.Boolean(), nullable=False,
                                           server_default="false"))
    op.add_column("job", sa.Column("grid_neurons", ARRAY(sa.Integer()), nullable=True))


def downgrade() -> None:
    op.drop_column("job", "grid_neurons")
    op.drop_column("neuron_grid", "sketch")
    op.drop_column("neuron_grid", "codec")
