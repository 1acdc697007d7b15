"""Readers' sessions end: idle sessions after 10 minutes, transactions after 5; readers
log in to catalog databases only (issue 80).

The analysts' role has a connection limit (24), so sessions left open in psql kept every
analyst out of the console for ever, and a cursor fetched in pieces, each under the
statement timeout, ran one query for as long as its holder liked. The role's defaults
now close a session idle for 10 minutes (``idle_session_timeout``, PostgreSQL 14+), one
idle inside a transaction for 1 minute, and end a transaction open for 5 minutes
(``transaction_timeout``, PostgreSQL 17+). A session may change its own (PostgreSQL
cannot forbid it), so each worker's reconciler also ends reader sessions past them
(schema.console.bound_readers), as it cancels statements past the statement timeout.

The reader guard now refuses a reader's login to a database not marked as a catalog (a
reader read and cancelled other sessions' queries in `postgres` and `template1`, where no
migration's revokes hold): this marks this database (``schema.engine.READER_DATABASE``,
which every migration to head also runs, for copies of the database).

Revision ID: 0038
Revises: 0037
"""

from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None

# (setting, value, the first server version that has it)
SETTINGS = (("idle_session_timeout", "10min", 140000),
            ("idle_in_transaction_session_timeout", "1min", 90600),
            ("transaction_timeout", "5min", 170000))


def _set(setting: str, value: str, since: int) -> str:
    """The role setting, where the server has it; a setting already in place is left
    alone, and a collision with another catalog migrating at the same time (the role's
    settings are shared by every database of the server) is retried, as in 0022."""
    return f"""
            IF current_setting('server_version_num')::int >= {since} THEN
              FOR tries IN 1..50 LOOP
                BEGIN
                  IF NOT EXISTS (
                      SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
                      WHERE r.rolname = 'catalog_reader' AND s.setdatabase = 0
                        AND s.setconfig @> ARRAY['{setting}={value}']) THEN
                    ALTER ROLE catalog_reader SET {setting} = '{value}';
                  END IF;
                  EXIT;
                EXCEPTION WHEN internal_error THEN
                  IF tries = 50 THEN
                    RAISE;
                  END IF;
                  PERFORM pg_sleep(0.05 + 0.2 * random());
                END;
              END LOOP;
            END IF;"""


def upgrade() -> None:
    from schema.engine import READER_DATABASE

    op.execute(READER_DATABASE)
    body = "".join(_set(*s) for s in SETTINGS)
    op.execute(f"""
        DO $$ BEGIN
          BEGIN
            {body}
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to set catalog_reader''s idle and transaction '
              'timeouts (needs the role''s owner or a superuser); the reconciler still ends '
              'reader sessions past them';
          END;
        END $$;""")


def downgrade() -> None:
    op.execute("""
        DO $$ BEGIN
          EXECUTE format('ALTER ROLE catalog_reader IN DATABASE %I '
                         'RESET ncat_reader_guard.catalog_database', current_database());
        EXCEPTION WHEN insufficient_privilege THEN NULL;
        END $$;""")
    for setting, _, since in SETTINGS:
        op.execute(f"""
            DO $$ BEGIN
              IF current_setting('server_version_num')::int >= {since} THEN
                ALTER ROLE catalog_reader RESET {setting};
              END IF;
            END $$;""")
