"""Indexes for every sort order of the explorer's search, in place of two no query used.

The search page sorts a checkpoint's neurons by effect size (served by 0016), by rank,
by best score or by neuron (the primary key). By rank and by best score no index
matched: ``ix_neuron_op_rank`` leads with the operator, so with no operator chosen each
page sorted all of the checkpoint's rows (786K at Pythia-1.4B's width), and nothing
indexed ``best_score`` within a checkpoint. Two indexes now lead with (model,
checkpoint, config) and hold those orders, so a page reads its fifty entries.

They take the place of ``ix_neuron_op_effect`` (model, checkpoint, operator,
``effect_exact``) and ``ix_neuron_op_best`` (model, best heuristic, best score) from
0001: no documented query, view, explorer page or job reads them (0 scans in
``bench/scale_catalog.py``'s reads), since ranking moved to ``rank_value`` and the
heuristic queries to the labels' index (0015). The index count and the table's size
stay about where they were.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX ix_neuron_op_effect")
    op.execute("DROP INDEX ix_neuron_op_best")
    op.execute("CREATE INDEX ix_neuron_op_rank_order ON neuron_op "
               "(model_id, checkpoint_id, config_id, rank)")
    op.execute("CREATE INDEX ix_neuron_op_score_order ON neuron_op "
               "(model_id, checkpoint_id, config_id, best_score DESC NULLS LAST)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_neuron_op_score_order")
    op.execute("DROP INDEX ix_neuron_op_rank_order")
    op.create_index("ix_neuron_op_best", "neuron_op",
                    ["model_id", "best_heuristic_id", "best_score"])
    op.create_index("ix_neuron_op_effect", "neuron_op",
                    ["model_id", "checkpoint_id", "op", "effect_exact"])
