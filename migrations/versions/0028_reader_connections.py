"""The analysts' role cannot crowd out the workers nor read other sessions' queries.

- ``catalog_reader`` gets a connection limit: a quarter of the connections the server
  gives non-superusers (``max_connections`` less ``superuser_reserved_connections``; 24
  of PostgreSQL's default 100). 89 idle reader connections once took every slot, and the
  workers' heartbeats and the reconciler failed for a minute; now the readers' next
  connection is refused ("too many connections for role") and the rest stay for the
  workers and the writer. A limit an administrator set already (anything but -1,
  unlimited) is left alone: ``ALTER ROLE catalog_reader CONNECTION LIMIT n`` changes it.
  The role is the server's, shared by every catalog on it, so the limit stays on
  downgrade (as the role and its settings do, 0002 and 0022), and two catalogs migrating
  at once race on its row as in 0022 (retried the same way).
- ``pg_stat_get_backend_activity`` joins the functions 0022 took from PUBLIC: given a
  backend's slot it returns that session's query text (analysts share the role, so
  PostgreSQL shows them each other's). The role that migrates keeps it.

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# a quarter of the non-superuser slots
SHARE = 4

CONNECTION_LIMIT = f"""
            FOR tries IN 1..50 LOOP
              BEGIN
                IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'catalog_reader'
                           AND rolconnlimit = -1) THEN
                  EXECUTE format('ALTER ROLE catalog_reader CONNECTION LIMIT %s', GREATEST(1,
                    (current_setting('max_connections')::int
                     - current_setting('superuser_reserved_connections')::int) / {SHARE}));
                END IF;
                EXIT;
              EXCEPTION WHEN internal_error THEN
                IF tries = 50 THEN
                  RAISE;
                END IF;
                PERFORM pg_sleep(0.05 + 0.2 * random());
              END;
            END LOOP;"""

GUARDED = "pg_stat_get_backend_activity"


def _function(body: str) -> str:
    return f"""
          FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
                   JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = 'pg_catalog' AND p.proname = '{GUARDED}' LOOP
            {body}
          END LOOP;"""


def upgrade() -> None:
    op.execute(f"""
        DO $$ DECLARE f text; BEGIN
          BEGIN
            {CONNECTION_LIMIT}
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to limit catalog_reader''s connections (needs '
              'CREATEROLE); it keeps no limit';
          END;
          BEGIN
            {_function("EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); "
                       "EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, "
                       "current_user);")}
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to hide other sessions'' queries from '
              'catalog_reader (needs a superuser); it keeps them';
          END;
        END $$;""")


def downgrade() -> None:
    op.execute(f"""
        DO $$ DECLARE f text; BEGIN
          {_function("EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);")}
        EXCEPTION WHEN insufficient_privilege THEN
          RAISE WARNING 'ncat: not allowed to give catalog_reader its defaults back';
        END $$;""")
