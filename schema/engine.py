"""Engine creation, database creation, waiting for the server, and migrating."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from schema.database import connect_args, first_line, resolve_database_url, shown_url

ROOT = Path(__file__).resolve().parents[1]


def ensure_database(url: str) -> None:
    """Create the URL's database if the server lacks it (connects to 'postgres')."""
    u = make_url(url)
    admin = create_engine(u.set(database="postgres"), isolation_level="AUTOCOMMIT",
                          connect_args=connect_args(url))
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                  {"n": u.database}).scalar()
            if not exists:
                conn.execute(text(f'CREATE DATABASE "{u.database}"'))
    finally:
        admin.dispose()


def wait_for(url: str, timeout: float = 30.0) -> None:
    """Block until the server accepts connections, or raise naming the URL."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            eng = create_engine(make_url(url).set(database="postgres"),
                                connect_args=connect_args(url))
            with eng.connect():
                eng.dispose()
                return
        except Exception as exc:  # server still starting
            reason = login_refused(exc)
            if reason is not None:  # it answered: waiting will not change its answer
                raise LoginRefused(f"PostgreSQL at {shown_url(url)} refused the login: "
                                   f"{reason}") from None
            last = exc
            time.sleep(0.5)
    first = first_line(last)
    raise DatabaseUnreachable(
        f"PostgreSQL at {shown_url(url)} did not answer "
        f"within {timeout:.0f} s: {first}")


class DatabaseUnreachable(ConnectionError):
    """The server did not answer; the message names the URL (password hidden)."""


def make_engine(url: str | None = None, **kwargs) -> Engine:
    """Engine for ``url`` (default: schema.database' resolution), creating the database."""
    url = url or resolve_database_url()
    wait_for(url)
    ensure_database(url)
    return create_engine(url, pool_pre_ping=True,
                         **{"connect_args": connect_args(url), **kwargs})


def alembic_config(url: str):
    """Alembic's config for ``url``, built here rather than read from alembic.ini: an
    installed copy (the image, a wheel) has the ``migrations`` package beside ``schema``
    and no alembic.ini (which stays for the ``alembic`` command in a checkout)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def migrate(url: str | None = None, revision: str = "head") -> str:
    """Upgrade the database to ``revision``; returns the URL used. At head, the database's
    own settings are checked and put back where missing (``DATABASE_SETTINGS``)."""
    from alembic import command

    url = url or resolve_database_url()
    make_engine(url).dispose()
    command.upgrade(alembic_config(url), revision)
    if revision == "head":
        from schema import store

        with store.connect(url, autocommit=True) as conn:
            conn.execute(DATABASE_SETTINGS)
            conn.execute(READER_DATABASE)
    return url


def _retried(body: str, refused: str) -> str:
    """A DO block running ``body`` (a server-wide or database-wide setting that other
    catalogs migrating at the same time race on: "tuple concurrently updated", retried
    as in 0022), with WARNING ``refused`` (its % is the database's name) and nothing
    changed where the migrating role lacks the rights."""
    return f"""
    DO $$ BEGIN
      FOR tries IN 1..50 LOOP
        BEGIN
{body}
          EXIT;
        EXCEPTION
          WHEN internal_error THEN
            IF tries = 50 THEN
              RAISE;
            END IF;
            PERFORM pg_sleep(0.05 + 0.2 * random());
          WHEN insufficient_privilege THEN
            RAISE WARNING '{refused}', current_database();
            EXIT;
        END;
      END LOOP;
    END $$;"""


# The reader guard (schema/reader_guard) refuses catalog_reader's logins to any database
# not marked as a catalog: every migration to head marks this one (a copy of the database
# does not carry the mark: it is the role's setting in this database, keyed by its oid).
# Settings of the role are the server's, so a collision with another catalog migrating at
# once is retried, as in 0022; a role that may not set it gets a warning.
READER_DATABASE = _retried("""
          IF NOT EXISTS (
              SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
              JOIN pg_database d ON d.oid = s.setdatabase
              WHERE r.rolname = 'catalog_reader' AND d.datname = current_database()
                AND s.setconfig @> ARRAY['ncat_reader_guard.catalog_database=on']) THEN
            EXECUTE format('ALTER ROLE catalog_reader IN DATABASE %I '
                           'SET ncat_reader_guard.catalog_database = on', current_database());
          END IF;""",
    "neuron catalog: not allowed to mark % as a catalog for the reader guard (needs a "
    "superuser): catalog_reader''s logins to it are refused where the guard is loaded")


# What migrations 0013 and 0022 set on the database itself rather than in it: JIT off, and
# the TEMPORARY privilege taken from PUBLIC (the analysts' role) and given to the role that
# migrates. A copy of the catalog made with CREATE DATABASE ... TEMPLATE, or restored by
# pg_restore without --create, has its tables and Alembic's revision but not these, and
# Alembic finds nothing to do at head; so every migration to head checks them and sets
# what is missing. Nothing is written where they hold (two commands migrating at once
# would otherwise race on the database's catalog row: "tuple concurrently updated", retried
# as in 0022). Without the rights (not the owner) it warns, as the migrations do.
DATABASE_SETTINGS = _retried("""
          IF NOT EXISTS (
              SELECT FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
              WHERE d.datname = current_database() AND s.setrole = 0
                AND s.setconfig @> ARRAY['jit=off']) THEN
            EXECUTE format('ALTER DATABASE %I SET jit = off', current_database());
          END IF;
          IF EXISTS (
              SELECT FROM pg_database d WHERE d.datname = current_database()
                AND (d.datacl IS NULL OR EXISTS (
                  SELECT FROM aclexplode(d.datacl) a
                  WHERE a.grantee = 0 AND a.privilege_type = 'TEMPORARY'))) THEN
            EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO %I', current_database(),
                           current_user);
            EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC',
                           current_database());
          END IF;""",
    "neuron catalog: not the owner of database %, its settings (JIT off, no TEMPORARY "
    "for PUBLIC) left as they are")


def set_reader_password(url: str, password: str) -> None:
    """Give the analysts' role ``password`` (``NCAT_READER_PASSWORD``; ``ncat migrate``):
    sent as its SCRAM-SHA-256 verifier, computed here, so the server's logs never hold
    the password itself. The role is the server's: two catalogs migrating at once race on
    its row ("tuple concurrently updated"), and the loser tries again."""
    import time

    import psycopg
    from psycopg import sql

    from schema import store
    from schema.export import READER

    with store.connect(url, autocommit=True) as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), READER.encode(),
                                                b"scram-sha-256").decode()
        statement = sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(READER),
                                                               sql.Literal(verifier))
        for attempt in range(50):
            try:
                conn.execute(statement)
                return
            except psycopg.errors.InternalError:
                if attempt == 49:
                    raise
                time.sleep(0.05 + 0.2 * (attempt % 5) / 5)


class SchemaBehind(RuntimeError):
    """The database is missing, empty, or at an older migration than this code."""


def current_revision(url: str) -> str | None:
    """The database's Alembic revision (None: not migrated)."""
    from alembic.runtime.migration import MigrationContext

    eng = create_engine(url, connect_args=connect_args(url))
    try:
        with eng.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        eng.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None
    return head


# the server answered and refused the login: a wrong password (28P01), an unknown role or
# a pg_hba.conf line that rejects it (28000), a database that does not exist (3D000)
LOGIN_REFUSED = ("28P01", "28000", "3D000")
# libpq reports a refusal at login as text only (no SQLSTATE on the exception)
_REFUSALS = ("password authentication failed", "no password supplied", "does not exist",
             "no pg_hba.conf entry", "pg_hba.conf rejects", "permission denied for database",
             "catalog databases only")


class LoginRefused(ConnectionError):
    """The server answered but refused the login; the message names the URL (no secret)
    and the server's reason. Trying again does not help: nothing is retried."""


def login_refused(exc: BaseException) -> str | None:
    """The server's reason, if ``exc`` is a refused login (psycopg's or SQLAlchemy's)."""
    import psycopg
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if not isinstance(exc, psycopg.Error):
        return None
    if getattr(exc, "sqlstate", None) in LOGIN_REFUSED:
        diag = exc.diag.message_primary if exc.diag else None
        return diag or first_line(exc)
    if isinstance(exc, psycopg.OperationalError):
        for line in str(exc).splitlines():
            reason = line.split("FATAL:", 1)[-1].split("failed:", 1)[-1].strip()
            if any(r in line for r in _REFUSALS):
                return reason
    return None


def connection_problem(exc: BaseException, url: str) -> str:
    """One line on why the database at ``url`` could not be used (no secret): a refused
    login with the server's reason, no server answering, or the error's first line."""
    import sqlalchemy.exc

    reason = login_refused(exc)
    if reason is not None:
        return f"the server at {shown_url(url)} refused the login: {reason}"
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    first = first_line(exc)
    if _unreachable(exc):
        return f"no PostgreSQL answers at {shown_url(url)} ({first})"
    return f"{shown_url(url)}: {type(exc).__name__}: {first}"


def _unreachable(exc: BaseException) -> bool:
    """A failure to reach the server at all (refused, unknown host, timeout), as opposed
    to a database that answers but is missing or wrong."""
    import psycopg
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc)
    return any(s in text for s in ("Connection refused", "could not translate host name",
                                   "timeout expired", "No such file or directory",
                                   "Name or service not known", "Network is unreachable"))


def require_current(url: str) -> str:
    """The URL, if its database is migrated to this code's head; else SchemaBehind saying
    to run ``ncat migrate`` (commands that write never migrate on their own)."""
    shown = shown_url(url)
    try:
        have = current_revision(url)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = login_refused(exc)
        if reason is not None:  # a wrong password is not a schema problem (exit 5, not 2)
            raise LoginRefused(f"the catalog database {shown} refused the login: "
                               f"{reason}") from None
        if _unreachable(exc):  # no server there: not a schema problem (exit 3, not 2)
            raise DatabaseUnreachable(f"cannot reach the catalog database {shown}: "
                                      f"{first}") from None
        raise SchemaBehind(f"cannot open the catalog database {shown}: "
                           f"{type(exc).__name__}: {first}; "
                           "check the URL, then run `ncat migrate`") from None
    want = head_revision()
    if have != want:
        state = "is not migrated" if have is None else f"is at revision {have}"
        raise SchemaBehind(f"the catalog database {shown} {state}, this code needs {want}: "
                           "run `ncat migrate` (with the same --database-url)")
    return url


def scratch_url(url: str, database: str) -> str:
    """``url`` with another database name; the host, port and query (an embedded
    server's unix-socket ``?host=/path``) stay as they are."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)
