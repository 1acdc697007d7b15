"""Two catalogs, one Redis queue: every message names its catalog (schema.identity), and a
worker never runs or drops another catalog's message; it leaves it for the owner's
workers. Real PostgreSQL databases, a real Redis and real ``ncat worker`` processes."""

import os
import time

from catalog.config import ScienceConfig
from jobs import enqueue as enq
from jobs.reconcile import broker_pending
from schema import store
from schema.engine import migrate
from schema.identity import catalog_identity, identity_of

from helpers import copy_database, drop_database, new_database_url, statuses, wait_until
from tiny_model import TINY

CONFIG = ScienceConfig(operand_hi=10, pairs_per_op=6, faithfulness_prompts=20)


def test_the_identity_is_minted_once_and_a_copy_mints_its_own(db, pg_server):
    with store.connect(db, autocommit=True) as conn:
        first = catalog_identity(conn)
        assert catalog_identity(conn) == first
    identity_of.cache_clear()
    assert identity_of(db) == first
    copy = new_database_url(pg_server)
    copy_database(db, copy)
    try:
        with store.connect(copy, autocommit=True) as conn:
            own = catalog_identity(conn)
            assert own != first and catalog_identity(conn) == own
        with store.connect(db, autocommit=True) as conn:
            assert catalog_identity(conn) == first  # the original keeps its own
    finally:
        drop_database(copy)


def test_a_worker_leaves_another_catalogs_messages_for_its_owner(queue, pg_server,
                                                                  redis_url, monkeypatch):
    """Catalog A's worker runs alone on the queue while catalog B's job 1 (A has a job 1
    too) waits there: A's worker runs its own job, leaves B's messages in the queue
    (neither runs them against its own job 1 nor drops them as done), and B's worker,
    started afterwards, finds them and finishes B's job. The reconciler, which would send
    B's layers again, is kept out of it (stale after 10 minutes). A's own messages may
    find their layer done or their job done (a process goes on with its job's other layer;
    the broker delivers again a message unacknowledged past the visibility timeout), so
    A's log is read from the moment every one of A's messages is taken."""
    monkeypatch.setenv("NCAT_STALE_SECONDS", "600")
    monkeypatch.setenv("NCAT_VISIBILITY_TIMEOUT", "600")
    monkeypatch.setenv("NCAT_BUSY_RETRY_SECONDS", "0.5")
    other = new_database_url(pg_server)
    migrate(other)
    try:
        a = enq.enqueue(queue.url, queue.name, "300", CONFIG)[0].job_id
        queue.start_worker("a")
        wait_until(lambda: statuses(queue.url)[a].status == "done", timeout=240,
                   what="catalog A's job")
        wait_until(lambda: queue.queued_messages() == 0 and queue.unacked_messages() == 0,
                   timeout=120, what="every one of A's messages taken")
        mark = len(queue.worker_log("a"))
        b = enq.enqueue(other, queue.name, "128", CONFIG)[0].job_id
        assert a == b == 1  # the same job id in both catalogs
        wait_until(lambda: queue.worker_log("a").count("left in the queue") >= 2,
                   timeout=120, what="A's worker to see B's messages")
        time.sleep(2)  # A's worker keeps seeing them: still neither run nor dropped
        assert statuses(other)[b].status == "queued"
        log = queue.worker_log("a")[mark:]
        assert "left in the queue" in log
        assert "skipped" not in log and "already done" not in log
        with store.connect(queue.url) as conn:  # nothing of B's checkpoint in A
            assert conn.execute("SELECT count(*) FROM checkpoint WHERE step = 128"
                                ).fetchone()[0] == 0
        # what each catalog's reconciler counts as waiting: B's messages are B's only
        identity_of.cache_clear()
        mine, theirs = identity_of(queue.url), identity_of(other)
        assert mine != theirs
        assert broker_pending(redis_url, os.environ["NCAT_QUEUE"], mine) == set()
        waiting = broker_pending(redis_url, os.environ["NCAT_QUEUE"], theirs)
        assert waiting and waiting <= {(b, layer) for layer in range(TINY.n_layers)}
        monkeypatch.setenv("DATABASE_URL", other)
        queue.start_worker("b")
        wait_until(lambda: statuses(other)[b].status == "done", timeout=240,
                   what="catalog B's job, on B's worker")
        with store.connect(other) as conn:
            workers = {w for (w,) in conn.execute("SELECT worker FROM job_layer")}
        assert workers and all(w.startswith("b@") for w in workers), workers
    finally:
        drop_database(other)
