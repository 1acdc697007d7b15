"""Hash partitions of the measurement tables, analysis settings, the read-only role.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

N_PARTITIONS = 8
PARTITIONED = ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")
READER = "catalog_reader"

# The role and its settings are rows of the server's shared catalogs, so catalogs on one
# server that migrate at the same time race on them: ALTER ROLE waits for the other
# migration's transaction (Alembic runs them all in one) and then fails with "tuple
# concurrently updated"; two CREATE ROLEs collide on the role's name. Settings already in
# place are left alone, and a collision is retried once the other side has committed.
READER_ROLE = f"""
    DO $$
    DECLARE tries integer := 0;
    BEGIN
      LOOP
        BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER}') THEN
            CREATE ROLE {READER} LOGIN;
          END IF;
          IF NOT EXISTS (
              SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
              WHERE r.rolname = '{READER}' AND s.setdatabase = 0
                AND s.setconfig @> ARRAY['default_transaction_read_only=on',
                                         'statement_timeout=10s']) THEN
            ALTER ROLE {READER} SET default_transaction_read_only = on;
            ALTER ROLE {READER} SET statement_timeout = '10s';
          END IF;
          EXIT;
        EXCEPTION WHEN internal_error OR unique_violation OR duplicate_object THEN
          tries := tries + 1;
          IF tries >= 50 THEN
            RAISE;
          END IF;
          PERFORM pg_sleep(0.05 + 0.2 * random());
        END;
      END LOOP;
    END $$;"""


def upgrade() -> None:
    for table in PARTITIONED:
        for r in range(N_PARTITIONS):
            op.execute(f"CREATE TABLE {table}_p{r} PARTITION OF {table} "
                       f"FOR VALUES WITH (MODULUS {N_PARTITIONS}, REMAINDER {r})")
    op.execute("INSERT INTO catalog_setting (key, value) VALUES "
               "('match_threshold', 0.6), ('circuit_k', 20)")
    # Roles belong to the whole server: create it once, never drop it here (other
    # databases on the same server may use it). Read-only by default, with a timeout.
    op.execute(READER_ROLE)
    op.execute(f"GRANT USAGE ON SCHEMA public TO {READER}")
    op.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}")
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {READER}")


def downgrade() -> None:
    op.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {READER}")
    op.execute(f"REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM {READER}")
    op.execute(f"REVOKE USAGE ON SCHEMA public FROM {READER}")
    op.execute("DELETE FROM catalog_setting")
    for table in PARTITIONED:
        for r in range(N_PARTITIONS):
            op.execute(f"DROP TABLE {table}_p{r}")
