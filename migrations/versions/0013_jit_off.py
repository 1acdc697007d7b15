"""JIT compilation off for the catalog's database.

The analysts' queries read a few hundred index entries, but their cost estimates
cross PostgreSQL's ``jit_above_cost`` (a circuit size read from ``catalog_setting`` is
unknown at plan time, so ``rank < k`` is estimated at a third of the checkpoint), and
compiling the plan then costs more than running it: on a Pythia-1.4B-shaped catalog of
32 checkpoints (``bench/scale_catalog.py``) the circuit query took 47 ms with JIT and
1.0 ms without, the heuristic query 3.7 against 1.8 ms, a neuron across training 1.6
against 0.3 ms; no documented query got slower. The fold and rebuild functions already
ran with ``SET jit = off`` (0011).

The setting is the database's default for new sessions; a session may still
``SET jit = on``. Changing a database's settings takes its owner or a superuser: where
the migrating role is neither, the migration says so and leaves the default as it is.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

SET_FOR_DATABASE = """
    DO $$ BEGIN
      EXECUTE format('ALTER DATABASE %I {action}', current_database());
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'neuron catalog: not the owner of database %, JIT left as it was '
                    '(ask its owner to run: ALTER DATABASE % SET jit = off)',
                    current_database(), current_database();
    END $$;"""


def upgrade() -> None:
    op.execute(SET_FOR_DATABASE.format(action="SET jit = off"))


def downgrade() -> None:
    op.execute(SET_FOR_DATABASE.format(action="RESET jit"))
