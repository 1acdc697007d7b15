"""The reader guard (schema/reader_guard, migration 0033): what no privilege takes from
catalog_reader, refused in its sessions on a server that has the library, which
scripts/setup.sh builds and installs for this machine's servers (issue 49.4 and 49.5).

Without it a reader, from psql, could LISTEN and NOTIFY, change the password every
analyst logs in with and the role's defaults (statement_timeout = 0 for everyone), and
raise work_mem so that one statement held gigabytes (1.58 GB seen)."""

import json
import uuid

import psycopg
import pytest

from schema import store
from schema.console import GUARD
from schema.engine import migrate

from helpers import (
    as_role,
    copy_database,
    drop_database,
    migration_module,
    new_database_url,
    reader_url,
)


def _guard_sql(library: str = GUARD) -> str:
    """Migration 0033's statement for ``library``."""
    return migration_module("0033_reader_guard.py").guard_sql(library)


def _role_state(owner: psycopg.Connection) -> tuple:
    """The reader role's password hash and its server-wide settings."""
    return owner.execute(
        "SELECT a.rolpassword, s.setconfig FROM pg_authid a "
        "LEFT JOIN pg_db_role_setting s ON s.setrole = a.oid AND s.setdatabase = 0 "
        "WHERE a.rolname = 'catalog_reader'").fetchone()


def _require_guard(owner: psycopg.Connection) -> None:
    from schema.console import reader_guard_loaded

    settings = _role_state(owner)[1] or []
    assert reader_guard_loaded(owner) == any(GUARD in c for c in settings)
    assert any(c.startswith("session_preload_libraries=") and GUARD in c for c in settings), (
        "the reader guard is not loaded for catalog_reader on this server: scripts/setup.sh "
        "(as root) or scripts/reader-guard.sh builds and installs it; migration 0033 names "
        f"it then (settings: {settings})")


def test_readers_cannot_listen_notify_alter_their_role_nor_raise_memory(db):
    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
        before = _role_state(owner)
    refused = [
        "LISTEN ncat_probe", "UNLISTEN *", "NOTIFY ncat_probe, 'x'",
        "SELECT pg_notify('ncat_probe', 'x')",
        "ALTER ROLE catalog_reader PASSWORD 'taken-over'",
        "ALTER ROLE catalog_reader SET statement_timeout = 0",
        "ALTER ROLE catalog_reader RESET ALL",
        "ALTER USER catalog_reader CONNECTION LIMIT -1",
        "SET work_mem = '1GB'",
        "SELECT set_config('work_mem', '10GB', false)",
        "SELECT set_config('work_mem', '10GB', true)",
        "SET hash_mem_multiplier = 100",
        "SET maintenance_work_mem = '2GB'",
        "SET max_parallel_workers_per_gather = 8",
    ]
    with store.connect(reader_url(db), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # allowed, gains nothing
        work_mem = conn.execute("SHOW work_mem").fetchone()[0]
        for sql in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
            assert conn.execute("SHOW work_mem").fetchone()[0] == work_mem, sql
        # inside a transaction too (SET LOCAL), and under the cap a session sets its own
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("SET LOCAL work_mem = '512MB'")
        conn.execute("SET work_mem = '32MB'")
        assert conn.execute("SHOW work_mem").fetchone()[0] == "32MB"
        assert conn.execute("SELECT count(*) FROM catalog_setting").fetchone()[0] >= 1
    with store.connect(db, autocommit=True) as owner:
        assert _role_state(owner) == before  # password and defaults as they were
        # the writer is not held (its fold function sets 256MB; it may listen)
        owner.execute("SET work_mem = '1GB'")
        owner.execute("LISTEN ncat_probe")
        owner.execute("UNLISTEN *")
    # a connection whose startup options ask for more is closed, the cap named
    with pytest.raises(psycopg.OperationalError, match="work_mem is capped"):
        psycopg.connect(reader_url(db).replace("+psycopg", ""),
                        options="-c work_mem=10GB").close()


def _sort_space(conn: psycopg.Connection) -> tuple[str, int]:
    """Where the server sorted four million rows, and how many kB it used there."""
    plan = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT g FROM generate_series(1, 4000000) g "
        "ORDER BY g DESC").fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    node = plan[0]["Plan"]
    while node.get("Node Type") != "Sort":
        node = node["Plans"][0]
    return node["Sort Space Type"], int(node["Sort Space Used"])


def test_a_reader_statement_stays_within_its_memory_cap(db):
    """The server's own accounting: four million rows sorted in memory take more than the
    readers' cap of 64 MB (the owner, work_mem 1 GB: in memory, over 64 MB); a reader who
    asks for 1 GB is refused, and at the cap the same sort spills to disk (bounded by
    temp_file_limit) instead of growing past it."""
    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
        owner.execute("SET work_mem = '1GB'")
        kind, used = _sort_space(owner)
        assert kind == "Memory" and used > 64 * 1024, (kind, used)
    with store.connect(reader_url(db), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET work_mem = '1GB'")
        conn.execute("SET statement_timeout = '60s'")
        conn.execute("SET work_mem = '64MB'")
        kind, used = _sort_space(conn)
        assert kind == "Disk", (kind, used)


def test_a_reader_statement_cannot_hold_gigabytes_through_values(db):
    """Issue 80.4: no setting sizes a value, so two 960 MB arrays in one row held 2.73 GB
    in a reader's backend. The guard bounds the process (1 GB beyond its size at login):
    that statement fails with "out of memory", while one 480 MB array, within the
    bound, is computed, and the session goes on."""
    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
    with store.connect(reader_url(db), autocommit=True) as conn:
        assert conn.execute("SHOW ncat_reader_guard.max_backend_memory").fetchone()[0] == "1GB"
        with pytest.raises(psycopg.errors.OutOfMemory):
            conn.execute("SELECT array_length(array_fill(0::int8, array[120000000]), 1), "
                         "array_length(array_fill(1::int8, array[120000000]), 1)")
        assert conn.execute("SELECT array_length(array_fill(0::int8, array[60000000]), 1)"
                            ).fetchone()[0] == 60_000_000
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ncat_reader_guard.max_backend_memory = '100GB'")


# the role's defaults (migration 0038) and the guard's caps, which equal them
READER_TIMEOUTS = {"idle_session_timeout": "10min",
                   "idle_in_transaction_session_timeout": "1min",
                   "transaction_timeout": "5min"}  # PostgreSQL 17+


def test_a_reader_cannot_turn_off_or_lengthen_its_idle_and_transaction_timeouts(db):
    """Issue 80.8's last gap: the role's defaults end a session idle for 10 minutes, one
    idle in a transaction for 1, and a transaction open for 5 (PostgreSQL 17+), but a
    session could turn its own off (SET idle_session_timeout = 0: allowed until now) and
    hold one of the role's 24 slots for as long as no worker's reconciler ran. The guard
    refuses 0 and any value above the cap, however it is set (SET, set_config, SET LOCAL,
    a connection's startup options); a shorter value is the session's own, and RESET
    goes back to the role's."""
    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
        version = int(owner.execute("SHOW server_version_num").fetchone()[0])
    names = [n for n in READER_TIMEOUTS if n != "transaction_timeout" or version >= 170000]
    with store.connect(reader_url(db), autocommit=True) as conn:
        for name in names:
            assert conn.execute(f"SHOW {name}").fetchone()[0] == READER_TIMEOUTS[name]
            for sql in (f"SET {name} = 0", f"SET {name} = '1h'",
                        f"SELECT set_config('{name}', '0', false)",
                        f"SELECT set_config('{name}', '2h', true)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=name):
                    conn.execute(sql)
                assert conn.execute(f"SHOW {name}").fetchone()[0] == READER_TIMEOUTS[name]
            with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                conn.execute(f"SET LOCAL {name} = 0")
            conn.execute(f"SET {name} = '30s'")  # shorter: the session's own
            assert conn.execute(f"SHOW {name}").fetchone()[0] == "30s"
            conn.execute(f"RESET {name}")
            assert conn.execute(f"SHOW {name}").fetchone()[0] == READER_TIMEOUTS[name]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ncat_reader_guard.max_idle_session_timeout = 0")
        assert conn.execute("SHOW ncat_reader_guard.max_idle_session_timeout"
                            ).fetchone()[0] == "10min"
    # the owner is not held
    with store.connect(db, autocommit=True) as owner:
        owner.execute("SET idle_session_timeout = 0")
    # a connection whose startup options turn one off is closed, the cap named
    for name in names:
        with pytest.raises(psycopg.OperationalError, match=f"{name} is capped"):
            psycopg.connect(reader_url(db).replace("+psycopg", ""),
                            options=f"-c {name}=0").close()


def test_readers_log_in_to_catalog_databases_only(db, pg_server):
    """Issue 80.3: catalog_reader logged in to the server's `postgres` and `template1`
    databases, where no migration took pg_stat_activity's query text and the signal
    functions from it, and read and cancelled other sessions' queries there. The guard
    refuses a reader's login to any database `ncat migrate` has not marked as a catalog:
    a copy of the catalog is refused until it is migrated, as is every other database."""
    from sqlalchemy.engine import make_url

    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
    with store.connect(reader_url(db), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    for other in ("postgres", "template1"):
        url = make_url(reader_url(db)).set(database=other).render_as_string(
            hide_password=False)
        with pytest.raises(psycopg.OperationalError, match="catalog databases only"):
            store.connect(url)
    copy = new_database_url(pg_server)
    copy_database(db, copy)
    try:
        with pytest.raises(psycopg.OperationalError, match="catalog databases only"):
            store.connect(reader_url(copy))
        migrate(copy)
        with store.connect(reader_url(copy), autocommit=True) as conn:
            assert conn.execute("SELECT 2").fetchone()[0] == 2
    finally:
        drop_database(copy)


def _warnings(conn: psycopg.Connection) -> list[str]:
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
    return seen


def test_the_migration_names_the_guard_only_where_it_loads(db):
    """A server without the library, or a migrating role that may not load it: the
    migration warns, goes on, and leaves the role's settings alone (a library named there
    that does not load would refuse every reader login)."""
    with store.connect(db, autocommit=True) as owner:
        before = _role_state(owner)
        seen = _warnings(owner)
        owner.execute(_guard_sql("ncat_no_such_guard"))
        assert any("has no ncat_no_such_guard" in w for w in seen), seen
        assert _role_state(owner) == before
        # a role that is not a superuser may not LOAD a library outside $libdir/plugins
        role = f"ncat_test_plain_{uuid.uuid4().hex[:8]}"
        owner.execute(f"CREATE ROLE {role} LOGIN")
        owner.execute(f"GRANT USAGE ON LANGUAGE plpgsql TO {role}")  # as a migrator has
        try:
            with store.connect(as_role(db, role), autocommit=True) as plain:
                seen = _warnings(plain)
                plain.execute(_guard_sql())
            assert any("does not load here" in w for w in seen), seen
            assert _role_state(owner) == before
        finally:
            owner.execute(f"REVOKE USAGE ON LANGUAGE plpgsql FROM {role}")
            owner.execute(f"DROP ROLE {role}")


@pytest.mark.serial  # changes the server-wide setting every reader login reads
def test_the_guard_joins_a_list_an_administrator_set(db):
    with store.connect(db, autocommit=True) as owner:
        _require_guard(owner)
        try:
            owner.execute("ALTER ROLE catalog_reader SET session_preload_libraries = 'plpgsql'")
            owner.execute(_guard_sql())
            owner.execute(_guard_sql())  # a second migration adds nothing
            settings = _role_state(owner)[1]
            assert "session_preload_libraries=plpgsql, ncat_reader_guard" in settings, settings
            with store.connect(reader_url(db), autocommit=True) as conn, \
                    pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("LISTEN ncat_probe")
        finally:
            owner.execute(f"ALTER ROLE catalog_reader SET session_preload_libraries = '{GUARD}'")
