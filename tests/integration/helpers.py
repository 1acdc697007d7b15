"""Constants and helpers shared by the integration tests."""

import time
import uuid

from sqlalchemy.engine import make_url

from catalog.config import MeasureConfig
from schema import store

SEED_STEPS = (64, 128, 300)
SEED_CONFIG = MeasureConfig(operand_hi=20, pairs_per_op=20, faithfulness_prompts=40)


def as_role(url: str, role: str) -> str:
    """The same database, as another role (no password: the test servers trust)."""
    return make_url(url).set(username=role, password=None).render_as_string(
        hide_password=False)


def reader_url(url: str) -> str:
    """The same database, as the read-only analysts' role."""
    return as_role(url, "catalog_reader")


def new_database_url(server_url: str) -> str:
    """A URL for a new database on the server (created by whoever connects first)."""
    url = make_url(server_url).set(database=f"ncat_test_{uuid.uuid4().hex[:10]}")
    return url.render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    store.drop_database(url)


def wait_until(predicate, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def statuses(url):
    from jobs import enqueue as enq

    return {s.job_id: s for s in enq.job_statuses(url)}


def all_done(url):
    st = statuses(url)
    return bool(st) and all(s.status == "done" for s in st.values())


def count(url, sql, args=()):
    with store.connect(url) as conn:
        return conn.execute(sql, args).fetchone()[0]
