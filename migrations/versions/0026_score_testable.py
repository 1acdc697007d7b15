"""Whether the grid can test a heuristic at all (catalog 0.10.0): ``neuron_score.testable``.

TRUE where the heuristic's set, put on top of the map, could reach the value rule's
corrected level (Tarone's bound, ``catalog.labels.value_null.ValueNull.min_p``); FALSE for sets too
small for the grid (a residue class of two or three cells scores 1 on anything and can
never be labelled). The catalog keeps testable rows before untestable ones when it
stores a few scores per family, and never names an untestable heuristic a neuron's best
while a testable one scored. NULL in rows catalogued before 0.10.0.

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable without a default: no rewrite of the (partitioned) score table
    op.execute("ALTER TABLE neuron_score ADD COLUMN testable BOOLEAN")


def downgrade() -> None:
    op.execute("ALTER TABLE neuron_score DROP COLUMN testable")
