"""The readers' sessions load the reader guard where the server has it.

What no privilege takes from a role (0022 and 0028 took the rest): ``LISTEN`` and
``NOTIFY`` (once a psql session turns read-only off), ``ALTER ROLE`` on itself (its
password, which analysts share, and its session defaults, statement_timeout included),
and any ``work_mem``, ``hash_mem_multiplier``, ``maintenance_work_mem`` or parallel
workers per statement (one ``SET work_mem = '10GB'`` grew a backend to 1.58 GB). The
library ``ncat_reader_guard`` (schema/reader_guard, built and installed by
scripts/reader-guard.sh) refuses them in every session of a role that is not a superuser,
and is loaded into catalog_reader's sessions by the role's ``session_preload_libraries``,
a setting only a superuser can change.

A library named there that the server cannot load would refuse every reader login, so it
is named only after this migration has loaded it itself (``LOAD``); where the server has
no such library, or the migrating role is not a superuser, the migration warns and goes
on, and the readers keep what PostgreSQL gives every role (docs/store.md says what). A
``session_preload_libraries`` an administrator set already is kept and the guard added
to it. The role and its settings are the server's, shared by every catalog on it, so the
setting stays on downgrade (as 0022's and 0028's do), and catalogs migrating at once
race on the role's row as in 0022 (retried the same way).

Revision ID: 0033
Revises: 0032
"""

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

LIBRARY = "ncat_reader_guard"


def guard_sql(library: str = LIBRARY) -> str:
    """The upgrade's statement for ``library`` (a test runs it with a name no server has)."""
    return f"""
        DO $$ DECLARE have text; names text[]; BEGIN
          IF NOT EXISTS (SELECT FROM pg_available_extensions WHERE name = '{library}') THEN
            RAISE WARNING 'ncat: this server has no {library} (scripts/reader-guard.sh '
              'builds and installs it); catalog_reader keeps LISTEN, NOTIFY, ALTER ROLE on '
              'itself and any work_mem';
            RETURN;
          END IF;
          BEGIN
            EXECUTE 'LOAD ''{library}''';  -- a library the server cannot load is never named
          EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'ncat: {library} does not load here (%); catalog_reader keeps '
              'LISTEN, NOTIFY, ALTER ROLE on itself and any work_mem', SQLERRM;
            RETURN;
          END;
          BEGIN
            FOR tries IN 1..50 LOOP
              BEGIN
                SELECT substr(c, length('session_preload_libraries=') + 1) INTO have
                FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole,
                     unnest(s.setconfig) c
                WHERE r.rolname = 'catalog_reader' AND s.setdatabase = 0
                  AND c LIKE 'session_preload_libraries=%';
                -- the stored list: names separated by commas, each quoted where needed
                names := ARRAY(SELECT btrim(n, ' "') FROM unnest(string_to_array(
                  coalesce(have, ''), ',')) n WHERE btrim(n, ' "') <> '');
                IF NOT '{library}' = ANY(names) THEN
                  -- one literal per name: a single literal would be one name with commas
                  EXECUTE 'ALTER ROLE catalog_reader SET session_preload_libraries = '
                    || (SELECT string_agg(quote_literal(n), ', ')
                        FROM unnest(names || '{library}'::text) n);
                END IF;
                EXIT;
              EXCEPTION WHEN internal_error THEN
                IF tries = 50 THEN
                  RAISE;
                END IF;
                PERFORM pg_sleep(0.05 + 0.2 * random());
              END;
            END LOOP;
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to load {library} into catalog_reader''s '
              'sessions (needs a superuser); it keeps LISTEN, NOTIFY, ALTER ROLE on itself '
              'and any work_mem';
          END;
        END $$;"""


def upgrade() -> None:
    op.execute(guard_sql())


def downgrade() -> None:
    # the setting is the server's (every catalog on it relies on it): it stays
    pass
