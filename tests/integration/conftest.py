"""Integration fixtures: a real PostgreSQL (DATABASE_URL's, the local one, or embedded)."""

import pytest

from catalog.sources import load_model
from jobs.store_results import catalog_checkpoint
from schema.engine import migrate
from schema.settings import Settings, resolve_database_url

from helpers import SEED_CONFIG, SEED_STEPS, drop_database, new_database_url


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


@pytest.fixture
def empty_db(pg_server):
    """A new, empty database (not migrated); dropped afterwards."""
    url = new_database_url(pg_server)
    from schema.engine import make_engine

    make_engine(url).dispose()
    yield url
    drop_database(url)


@pytest.fixture
def db(pg_server):
    """A new database migrated to head; dropped afterwards."""
    url = new_database_url(pg_server)
    migrate(url)
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def seeded(pg_server, tiny_builtin):
    """A catalog of the tiny built-in model at three checkpoints, written through the writer."""
    cfg, root = tiny_builtin
    url = new_database_url(pg_server)
    migrate(url)
    for step in SEED_STEPS:
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        catalog_checkpoint(url, lm, SEED_CONFIG)
    yield url
    drop_database(url)
