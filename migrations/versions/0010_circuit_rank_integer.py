"""The circuit view compares ranks with an integer circuit size.

``circuit_k`` lives in ``catalog_setting`` as a double, so ``rank < circuit_k`` cast
every rank to double precision and no index on ``rank`` could serve the circuit: the
documented circuit query scanned the model's whole partition (66-98 ms on a
Pythia-1.4B-shaped catalog of two checkpoints, growing with checkpoints). For an
integer rank, ``rank < k`` is ``rank < ceil(k)``, so the view now compares with that
integer and ``ix_neuron_op_rank`` (model, checkpoint, op, rank) answers it (1.5 ms).
Same columns, so the view is replaced in place and keeps its grants.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

VIEW = """
    CREATE OR REPLACE VIEW circuit_neurons AS
    SELECT m.name AS model, c.step, n.layer, n.neuron, n.op, n.config_id, n.rank,
           n.effect_exact, n.effect_attr, h.label AS best_heuristic, n.best_score,
           n.model_id, n.checkpoint_id, n.rank_value, n.is_exact, n.best_bottom,
           n.labelled
    FROM neuron_op n
    JOIN checkpoint c ON c.id = n.checkpoint_id
    JOIN model m ON m.id = n.model_id
    LEFT JOIN heuristic h ON h.id = n.best_heuristic_id
    WHERE n.rank < {k}"""


def upgrade() -> None:
    op.execute(VIEW.format(
        k="(SELECT ceil(value)::integer FROM catalog_setting WHERE key = 'circuit_k')"))


def downgrade() -> None:
    op.execute(VIEW.format(k="(SELECT value FROM catalog_setting WHERE key = 'circuit_k')"))
