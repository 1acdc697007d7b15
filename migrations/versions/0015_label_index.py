"""An index of the labels alone: (model, checkpoint, heuristic, operator, score) WHERE
implements.

"Which neurons implement a heuristic most strongly" asks for one operator's labels of
one heuristic at one checkpoint. Through (model, checkpoint, heuristic, score) (0012) it
fetched every stored score of the heuristic at that checkpoint, labels or not and of
every operator, from the table to test ``op`` and ``implements``: on a
Pythia-1.4B-shaped catalog (``bench/scale_catalog.py``) 2,356 rows for 205 answers,
2,370 pages, 112 ms with a cold cache. This index holds the labels only, so that range
is the answer's rows (210 pages cold, 9 ms). It also serves any label query that names
a checkpoint and a heuristic. Its size follows the labels: 244 MB beside the 741 MB of
the all-scores index in that bench, where a third of the stored scores are labels.

(The documented query also takes its ten best rows before it joins ``neuron_op``, so
it looks up ten neurons instead of every label's: 1,894 pages cold before.)

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_neuron_score_label", "neuron_score",
                    ["model_id", "checkpoint_id", "heuristic_id", "op", "score"],
                    unique=False, postgresql_where=sa.text("implements"))


def downgrade() -> None:
    op.drop_index("ix_neuron_score_label", table_name="neuron_score")
