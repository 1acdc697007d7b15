"""Jobs that heal themselves; a reader that cannot lock, notify or keep large objects.

- job_layer: ``heartbeat_at`` (a working worker's last sign of life, written every
  NCAT_HEARTBEAT_SECONDS from its own connection), ``sent_at`` (when a message for the
  layer last went to the broker) and ``resends`` (how often the reconciler sent it again).
- reconcile_event: what the reconciler did (re-sent a layer, resumed a summary, failed a
  job after too many lost attempts), shown by ``ncat status``.
- Functions on large objects, advisory locks and NOTIFY are taken from PUBLIC in this
  database and given back to the role that migrates it (the one the workers use), so
  ``catalog_reader`` cannot create large objects that persist, take the workers' locks or
  signal listeners. Revoking privileges on pg_catalog functions needs a superuser or the
  functions' owner; without one, the migration says so and goes on (the console's
  read-only transaction, always rolled back on a fresh connection, still holds).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# every overload of these, looked up in pg_proc
GUARDED = ("lo_from_bytea", "lo_create", "lo_creat", "lo_import", "lo_export", "lo_open",
           "lo_put", "lo_get", "lowrite", "loread", "lo_unlink", "lo_truncate", "lo_truncate64",
           "lo_lseek", "lo_lseek64", "lo_tell", "lo_tell64", "lo_close",
           "pg_advisory_lock", "pg_advisory_lock_shared", "pg_advisory_xact_lock",
           "pg_advisory_xact_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared",
           "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared",
           "pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all",
           "pg_notify")


def _privileges(action: str) -> str:
    names = ", ".join(f"'{n}'" for n in GUARDED)
    if action == "revoke":
        body = ("EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); "
                "EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_user);")
    else:
        body = "EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);"
    return f"""
        DO $$ DECLARE f text; BEGIN
          FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
                   JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pg_catalog' AND p.proname IN ({names}) LOOP
            {body}
          END LOOP;
        EXCEPTION WHEN insufficient_privilege THEN
          RAISE WARNING 'ncat: not allowed to change privileges on large-object, advisory-lock '
            'and NOTIFY functions (needs a superuser); catalog_reader keeps them';
        END $$;"""


def upgrade() -> None:
    op.add_column("job_layer", sa.Column("heartbeat_at", sa.DateTime(timezone=True)))
    op.add_column("job_layer", sa.Column("sent_at", sa.DateTime(timezone=True)))
    op.add_column("job_layer", sa.Column("resends", sa.Integer(), nullable=False,
                                         server_default="0"))
    op.execute("UPDATE job_layer SET sent_at = now() WHERE status IN ('queued', 'running')")
    op.create_table(
        "reconcile_event",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("job.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("layer", sa.SmallInteger()),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("detail", JSONB()),
    )
    op.create_index("ix_reconcile_event_job", "reconcile_event", ["job_id", "at"])
    op.execute("GRANT SELECT ON reconcile_event TO catalog_reader")
    op.execute(_privileges("revoke"))


def downgrade() -> None:
    op.execute(_privileges("grant"))
    op.drop_table("reconcile_event")
    for col in ("resends", "sent_at", "heartbeat_at"):
        op.drop_column("job_layer", col)
