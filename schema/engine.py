"""Engine creation, database creation, waiting for the server, and migrating."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from schema.settings import resolve_database_url

ROOT = Path(__file__).resolve().parents[1]


def ensure_database(url: str) -> None:
    """Create the URL's database if the server lacks it (connects to 'postgres')."""
    u = make_url(url)
    admin = create_engine(u.set(database="postgres"), isolation_level="AUTOCOMMIT")
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
            eng = create_engine(make_url(url).set(database="postgres"))
            with eng.connect():
                eng.dispose()
                return
        except Exception as exc:  # server still starting
            last = exc
            time.sleep(0.5)
    raise ConnectionError(f"PostgreSQL at {make_url(url).render_as_string(hide_password=True)} "
                          f"did not answer within {timeout:.0f} s: {last}")


def make_engine(url: str | None = None, **kwargs) -> Engine:
    """Engine for ``url`` (default: schema.settings' resolution), creating the database."""
    url = url or resolve_database_url()
    wait_for(url)
    ensure_database(url)
    return create_engine(url, pool_pre_ping=True, **kwargs)


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = url
    return cfg


def migrate(url: str | None = None, revision: str = "head") -> str:
    """Upgrade the database to ``revision``; returns the URL used."""
    from alembic import command

    url = url or resolve_database_url()
    make_engine(url).dispose()
    command.upgrade(alembic_config(url), revision)
    return url
