"""The headline faithfulness's conditioning per circuit point (issue 78, catalog 0.11.0;
catalog.circuits.faithfulness): ``n_clipped``, ``max_influence`` and ``influence_bound``
of ``circuit_point`` and ``final_circuit_point``.

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


TABLES = ("circuit_point", "final_circuit_point")


def upgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN n_clipped INTEGER, "
                   "ADD COLUMN max_influence REAL, ADD COLUMN influence_bound REAL")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN n_clipped, "
                   "DROP COLUMN max_influence, DROP COLUMN influence_bound")
