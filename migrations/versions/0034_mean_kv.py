"""The KV map's mean per neuron and operator: ``neuron_op.mean_kv`` (issue 77).

A label keeps the side of the map that scored (``neuron_score.bottom``): the neuron is
high, or low, on the heuristic's set. Whether a label holds for one prompt is then the
prompt being in the set AND the neuron's value there on that side of the map's typical
value: ``mean_act`` for the K map, and, for result labels, the KV map's mean, stored
here (NULL for a constant neuron, which has no KV map, and for rows written before: the
side is then not checked, only the set).

Revision ID: 0034
Revises: 0033
"""

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE neuron_op ADD COLUMN mean_kv REAL")


def downgrade() -> None:
    op.execute("ALTER TABLE neuron_op DROP COLUMN mean_kv")
