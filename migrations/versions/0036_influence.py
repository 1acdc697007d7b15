"""The headline faithfulness's conditioning per circuit point (issue 78, catalog 0.11.0;
catalog.circuits.faithfulness): ``circuit_point.n_clipped``, ``max_influence`` and
``influence_bound``.

``ratio_of_means`` now clips each prompt's numerator and denominator terms to three
median |denominators|, so that no single prompt moves it by more than
``influence_bound`` whatever its circuit value or its denominator (NL's own denominator,
the largest number logit, included). ``n_clipped``: the prompts with a clipped term;
``max_influence``: the most that leaving one prompt out moves the statistic. NULL in rows
written before.

Revision ID: 0036
Revises: 0035
"""

from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE circuit_point ADD COLUMN n_clipped INTEGER, "
               "ADD COLUMN max_influence REAL, ADD COLUMN influence_bound REAL")


def downgrade() -> None:
    op.execute("ALTER TABLE circuit_point DROP COLUMN n_clipped, DROP COLUMN max_influence, "
               "DROP COLUMN influence_bound")
