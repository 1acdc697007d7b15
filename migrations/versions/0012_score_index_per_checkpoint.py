"""neuron_score's heuristic index leads with the checkpoint.

``ix_neuron_score_heuristic`` was (model, heuristic, score): the documented
"which neurons implement a heuristic most strongly at the last checkpoint" query
walked that heuristic's scores at every checkpoint, best first, and kept the rows of
the last one, so its time grew with the number of checkpoints (107 ms on a
Pythia-1.4B-shaped catalog of 32 checkpoints). Every reader of neuron_score names
one checkpoint (explorer search and neuron page, report, the per-checkpoint fold),
so the index now is (model, checkpoint, heuristic, score): one range per checkpoint
and heuristic, already in score order. The key grows by 4 bytes, which the 8-byte
alignment of index tuples absorbs (neuron_score with its indexes: 635 B per neuron_op
row before, 624 B after, in two 32-checkpoint runs of the bench).

On a large catalog this rebuilds the index on every partition (PostgreSQL cannot
build an index on a partitioned table concurrently); expect minutes per 100M rows.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_neuron_score_checkpoint_heuristic", "neuron_score",
                    ["model_id", "checkpoint_id", "heuristic_id", "score"], unique=False)
    op.drop_index("ix_neuron_score_heuristic", table_name="neuron_score")


def downgrade() -> None:
    op.create_index("ix_neuron_score_heuristic", "neuron_score",
                    ["model_id", "heuristic_id", "score"], unique=False)
    op.drop_index("ix_neuron_score_checkpoint_heuristic", table_name="neuron_score")
