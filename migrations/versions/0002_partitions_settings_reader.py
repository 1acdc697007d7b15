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


def upgrade() -> None:
    for table in PARTITIONED:
        for r in range(N_PARTITIONS):
            op.execute(f"CREATE TABLE {table}_p{r} PARTITION OF {table} "
                       f"FOR VALUES WITH (MODULUS {N_PARTITIONS}, REMAINDER {r})")
    op.execute("INSERT INTO catalog_setting (key, value) VALUES "
               "('match_threshold', 0.6), ('circuit_k', 20)")
    # Roles belong to the whole server: create it once, never drop it here (other
    # databases on the same server may use it). Read-only by default, with a timeout.
    op.execute(f"""
        DO $$ BEGIN
          IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER}') THEN
            CREATE ROLE {READER} LOGIN;
          END IF;
        END $$;""")
    op.execute(f"ALTER ROLE {READER} SET default_transaction_read_only = on")
    op.execute(f"ALTER ROLE {READER} SET statement_timeout = '10s'")
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
