"""A catalog's identity, and the kinds of a layer's losses (issue 80).

- ``catalog_identity``: one row, a random UUID minted for this database
  (``schema.identity``). Every queue message names it, so a worker of another catalog on
  the same Redis queue leaves the message for its owner instead of running or dropping it
  (job and request ids repeat across catalogs). ``db_oid`` is the database the UUID was
  minted in: a copy of the database (CREATE DATABASE ... TEMPLATE, a restored dump) mints
  its own on first use, so two copies on one queue are two catalogs.
- ``job_layer.loss_kinds``: what each loss of the layer since a person last queued it was
  ('process died', 'database unreachable', 'no heartbeat'), so that a layer failed for
  its losses names them all, counted, not only the last.

Revision ID: 0037
Revises: 0036
"""

from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE catalog_identity ("
               "one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one), "
               "id UUID NOT NULL, db_oid OID NOT NULL, "
               "minted_at TIMESTAMPTZ NOT NULL DEFAULT now())")
    op.execute("ALTER TABLE job_layer ADD COLUMN loss_kinds TEXT[] NOT NULL DEFAULT '{}'")


def downgrade() -> None:
    op.execute("ALTER TABLE job_layer DROP COLUMN loss_kinds")
    op.execute("DROP TABLE catalog_identity")
