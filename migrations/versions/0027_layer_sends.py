"""A queued layer's re-sends apart from its losses: ``job_layer.sends``.

The reconciler sends a queued layer again when no message for it waits in the broker's
queue; a message a worker has prefetched is not in that queue, so a healthy layer was
re-sent while it waited, and each re-send raised ``resends``, which the poison rule reads
as losses: a layer started once failed as "lost 4 times". ``resends`` now counts only
losses (a start that died: a running layer with no live holder) and ``sends`` the re-sends
of a queued layer; the reconciler's back-off reads both, the poison rule only losses.
``ncat retry`` resets both.

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE job_layer ADD COLUMN sends INTEGER NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE job_layer DROP COLUMN sends")
