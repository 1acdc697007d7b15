"""Integration fixtures: a real PostgreSQL (DATABASE_URL's, the local one, or embedded)."""

import uuid

import pytest
from sqlalchemy.engine import make_url

from catalog.sources import load_model
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.engine import migrate
from schema.settings import Settings, resolve_database_url

from helpers import SEED_CONFIG, SEED_STEPS


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis: REDIS_URL's, the local one, or an embedded redis-server."""
    import os

    from jobs.broker import start_embedded_redis
    from schema.settings import port_open

    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if port_open("localhost", 6379):
        return "redis://localhost:6379/0"
    return start_embedded_redis(tmp_path_factory.mktemp("redis-home"))


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """URL of a real server to create test databases on."""
    return resolve_database_url(Settings(ncat_home=tmp_path_factory.mktemp("pg")))


def _create(server_url: str) -> str:
    url = make_url(server_url).set(database=f"ncat_test_{uuid.uuid4().hex[:10]}")
    return url.render_as_string(hide_password=False)


def _drop(url: str) -> None:
    u = make_url(url)
    admin = u.set(database="postgres").render_as_string(hide_password=False)
    with store.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{u.database}" WITH (FORCE)')


@pytest.fixture
def empty_db(pg_server):
    """A new, empty database (not migrated); dropped afterwards."""
    url = _create(pg_server)
    from schema.engine import make_engine

    make_engine(url).dispose()
    yield url
    _drop(url)


@pytest.fixture
def db(pg_server):
    """A new database migrated to head; dropped afterwards."""
    url = _create(pg_server)
    migrate(url)
    yield url
    _drop(url)


@pytest.fixture(scope="module")
def seeded(pg_server, tiny_builtin):
    """A catalog of the tiny built-in model at three checkpoints, written through the writer."""
    cfg, root = tiny_builtin
    url = _create(pg_server)
    migrate(url)
    for step in SEED_STEPS:
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        catalog_checkpoint(url, lm, SEED_CONFIG)
    yield url
    _drop(url)
