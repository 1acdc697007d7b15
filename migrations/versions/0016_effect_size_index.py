"""An index for the explorer's default order: (model, checkpoint, config, |rank_value|).

The search page lists a checkpoint's neurons by the size of their effect,
``abs(rank_value) DESC NULLS LAST``, which no index served: every page sorted all of the
checkpoint's rows (786K at Pythia-1.4B's width; 363 ms warm on the 8-checkpoint catalog
of ``bench/scale_catalog.py``). Through this index the first page reads fifty entries
(0.2 ms), and a filtered page reads the index in that order until fifty rows pass. The
search also counts matches only up to ``ui.data.COUNT_CAP`` (10,000): the exact count of
an unfiltered checkpoint was another full pass (256 ms). 189 MB per 6.3M neuron_op rows
(30 B a row).

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_neuron_op_effect_size ON neuron_op "
               "(model_id, checkpoint_id, config_id, abs(rank_value) DESC NULLS LAST)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_neuron_op_effect_size")
