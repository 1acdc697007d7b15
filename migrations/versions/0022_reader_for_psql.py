"""The analysts' role made safe for direct psql use, as far as PostgreSQL allows.

``catalog_reader`` is documented for psql, where a session may change its own settings.
What a session cannot undo is enforced here:

- no TEMPORARY privilege on this database for PUBLIC (given back to the role that
  migrates, whose writer stages rows in temporary tables): a reader that turns
  ``default_transaction_read_only`` off still cannot create a table of any kind, since it
  holds no CREATE anywhere either;
- ``temp_file_limit`` of 1 GB for the role: a superuser-only setting, so a reader cannot
  raise it (sorts and hashes that spill past it fail instead of filling the disk);
- no USAGE on the language plpgsql for PUBLIC (given back to the migrating role): no
  ``DO`` blocks, no functions of its own;
- ``pg_terminate_backend`` and ``pg_cancel_backend`` not executable by PUBLIC: a reader
  cannot end another analyst's session (they share the role, which PostgreSQL would
  otherwise allow);
- ``pg_stat_activity`` (and ``pg_stat_get_activity`` under it) not readable by PUBLIC:
  analysts share the role, so they would see each other's query text; a reader sees its
  own statement with ``current_query()``.

What a session can always change, ``statement_timeout``, is guarded outside the database:
each worker's reconciler cancels reader statements running longer than the role's
timeout plus a grace (``schema.console.cancel_overdue_readers``).

Changing privileges on pg_catalog objects, the language and role settings needs a
superuser; without one the migration warns and goes on (the console's read-only,
rolled-back transactions still hold).

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

GUARDED = ("pg_terminate_backend", "pg_cancel_backend", "pg_stat_get_activity")


def _guarded(to: str) -> str:
    names = ", ".join(f"'{n}'" for n in GUARDED)
    if to == "owner":
        body = ("EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); "
                "EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, current_user);")
    else:
        body = "EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f);"
    return f"""
        FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p
                 JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'pg_catalog' AND p.proname IN ({names}) LOOP
          {body}
        END LOOP;"""


# The role's settings are one row of a catalog shared by every database of the server, so
# catalogs migrating at the same time race on it (as in 0002): an ALTER ROLE waits for the
# other migration's transaction and then fails with "tuple concurrently updated"
# (internal_error). A setting already in place is left alone; after a collision the other
# side has committed, so the retry finds the setting and goes on.
TEMP_FILE_LIMIT = """
            FOR tries IN 1..50 LOOP
              BEGIN
                IF NOT EXISTS (
                    SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
                    WHERE r.rolname = 'catalog_reader' AND s.setdatabase = 0
                      AND s.setconfig @> ARRAY['temp_file_limit=1GB']) THEN
                  ALTER ROLE catalog_reader SET temp_file_limit = '1GB';
                END IF;
                EXIT;
              EXCEPTION WHEN internal_error THEN
                IF tries = 50 THEN
                  RAISE;
                END IF;
                PERFORM pg_sleep(0.05 + 0.2 * random());
              END;
            END LOOP;"""


def upgrade() -> None:
    op.execute(f"""
        DO $$ DECLARE f text; BEGIN
          EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
          EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO %I', current_database(),
                         current_user);
          BEGIN
            {TEMP_FILE_LIMIT}
            EXECUTE format('GRANT USAGE ON LANGUAGE plpgsql TO %I', current_user);
            REVOKE USAGE ON LANGUAGE plpgsql FROM PUBLIC;
            {_guarded("owner")}
            REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC;
            EXECUTE format('GRANT SELECT ON pg_catalog.pg_stat_activity TO %I', current_user);
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to limit catalog_reader''s temp files, DO blocks, '
              'signals and view of other sessions (needs a superuser); it keeps them';
          END;
        END $$;""")


def downgrade() -> None:
    op.execute(f"""
        DO $$ DECLARE f text; BEGIN
          EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
          BEGIN
            -- catalog_reader's temp_file_limit stays: the role and its settings belong to
            -- the server, whose other catalogs keep relying on them (as 0002 keeps the role)
            GRANT USAGE ON LANGUAGE plpgsql TO PUBLIC;
            {_guarded("public")}
            GRANT SELECT ON pg_catalog.pg_stat_activity TO PUBLIC;
          EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'ncat: not allowed to give catalog_reader its defaults back';
          END;
        END $$;""")
