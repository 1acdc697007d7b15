"""The search page's best-score order, ties included: (model, checkpoint, config, best
score, layer, neuron, op).

The page orders by ``best_score DESC NULLS LAST, layer, neuron, op``. The index of
0017 held the first key only, so rows of equal best score came out unordered and were
sorted, one group at a time. A neuron with no stored score has a NULL best score, and
those form one group: on the 8-checkpoint Pythia-1.4B-shaped catalog of
``bench/scale_catalog.py``, whose synthetic rows carry no best score, the first page
sorted the checkpoint's 786K rows (556 ms warm, 699 ms cold, spilling to disk). With
the tie-breakers in the index the page reads its fifty entries in order, whatever the
scores hold.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX ix_neuron_op_score_order")
    op.execute("CREATE INDEX ix_neuron_op_score_order ON neuron_op "
               "(model_id, checkpoint_id, config_id, best_score DESC NULLS LAST, "
               "layer, neuron, op)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_neuron_op_score_order")
    op.execute("CREATE INDEX ix_neuron_op_score_order ON neuron_op "
               "(model_id, checkpoint_id, config_id, best_score DESC NULLS LAST)")
