"""Integration fixtures: a real PostgreSQL (DATABASE_URL's, the local one, or embedded)."""

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from catalog.builtin import model_name
from catalog.sources import load_model
from jobs import enqueue as enq
from jobs import final_circuits
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.database import Settings, resolve_database_url
from schema.engine import migrate

from helpers import (
    SEED_CONFIG,
    SEED_STEPS,
    TEST_REDIS_DB,
    copy_database,
    drop_database,
    forget_queue,
    new_database_url,
)
from tiny_model import TINY


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis: REDIS_URL's, the local one (its database TEST_REDIS_DB), or an
    embedded redis-server."""
    import os

    from jobs.broker import start_embedded_redis
    from schema.database import port_open

    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if port_open("localhost", 6379):  # a database of its own: db 0 is the user's queue's
        return f"redis://localhost:6379/{TEST_REDIS_DB}"
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


@pytest.fixture(scope="session")
def seeded_template(pg_server, tiny_builtin):
    """A catalog of the tiny built-in model at three checkpoints, written through the
    writer: built once per test process, then copied for each module (``seeded``)."""
    cfg, root = tiny_builtin
    url = new_database_url(pg_server)
    migrate(url)
    for step in SEED_STEPS:  # in step order: the final circuit is filled in afterwards
        lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
        ids = catalog_checkpoint(url, lm, SEED_CONFIG)
    with store.connect(url, autocommit=True) as conn:
        final_circuits.fill(conn, model_id=ids.model_id, config_id=ids.config_id,
                            cache_root=root)
    yield url
    drop_database(url)


@pytest.fixture(scope="module")
def seeded(pg_server, seeded_template):
    """The tiny model's three-checkpoint catalog (``seeded_template``), a database of this
    module's own: a copy (CREATE DATABASE ... TEMPLATE, about a second, against about 25 s
    to catalog it again inside the suite), migrated as a user's copy would be (which puts
    back the database-level settings a copy lacks: schema.engine.DATABASE_SETTINGS)."""
    url = new_database_url(pg_server)
    copy_database(seeded_template, url)  # nothing uses the template's URL after its build
    migrate(url)
    yield url
    drop_database(url)


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue(db, redis_url, tiny_builtin, monkeypatch):
    """Environment of one isolated queue: its own Celery queue name and database."""
    _, root = tiny_builtin
    env = {
        "DATABASE_URL": db, "REDIS_URL": redis_url, "NCAT_QUEUE": f"test-{uuid.uuid4().hex[:8]}",
        "NCAT_HOME": str(root.parent), "NCAT_VISIBILITY_TIMEOUT": "3",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(enq, "_APP", None)  # the enqueuing side picks up this queue
    workers = []

    class Queue:
        url = db
        name = model_name(TINY)

        def start_worker(self, label="w"):
            log = open(Path(env["NCAT_HOME"]) / f"worker-{env['NCAT_QUEUE']}-{label}.log", "w")
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobs.cli", "worker", "--loglevel", "info",
                 "--hostname", f"{label}@{env['NCAT_QUEUE']}"],
                cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            workers.append(proc)
            return proc

        def worker_log(self, label="w") -> str:
            path = Path(env["NCAT_HOME"]) / f"worker-{env['NCAT_QUEUE']}-{label}.log"
            return path.read_text() if path.exists() else ""

        def queued_messages(self) -> int:
            return redis.Redis.from_url(redis_url).llen(env["NCAT_QUEUE"])

        def unacked_messages(self) -> int:
            """Messages of this queue delivered to a worker and not yet acknowledged (the
            broker's 'unacked' hash holds [message, exchange, routing key] per delivery)."""
            import json

            held = redis.Redis.from_url(redis_url).hvals("unacked")
            return sum(json.loads(v)[2] == env["NCAT_QUEUE"] for v in held)

    yield Queue()
    for proc in workers:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    forget_queue(redis_url, env["NCAT_QUEUE"])

