"""Celery tasks: thin wrappers around jobs.runner (a layer) and jobs.explain_jobs (a prompt)."""

from __future__ import annotations

import logging

from celery.signals import worker_process_init, worker_ready

from jobs.broker import EXPLAIN_PROMPT, RUN_LAYER
from jobs.celery_app import app, queue_name, send_layer

log = logging.getLogger(__name__)


@worker_process_init.connect
def _import_the_science(**_) -> None:
    """Import torch and the catalog in each pool process as it starts, not on its first
    task (several seconds). The parent process never imports them, so CUDA is never
    initialised there. With several pool processes (``ncat worker --concurrency N``),
    each takes its share of the cores for torch's threads (``pool_threads``): N processes
    of the default thread count each fought over the same cores."""
    threads = pool_threads()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    import catalog.run.measurement  # noqa: F401
    import catalog.sources.loading  # noqa: F401  (the package alone is light)
    import jobs.runner  # noqa: F401


def pool_threads() -> int | None:
    """torch threads for one of NCAT_POOL_PROCESSES pool processes (set by ``ncat
    worker``): the cores this process may use, shared out; None with one process (torch's
    own default)."""
    import os

    n = int(os.environ.get("NCAT_POOL_PROCESSES", "1") or 1)
    if n <= 1:
        return None
    return max(1, len(os.sched_getaffinity(0)) // n)


@worker_ready.connect
def _start_reconciler(sender=None, **_) -> None:
    """Every worker's parent process runs the reconciler (jobs.reconcile) in a thread: it
    needs the database and the broker only, never torch."""
    from catalog.config.settings import get_settings
    from jobs.broker import resolve_redis_url
    from jobs.celery_app import queue_name
    from jobs.reconcile import Reconciler

    settings = get_settings()

    def send(job_id: int, layer: int) -> None:
        from schema.identity import identity_of

        send_layer(app, job_id, layer, catalog=identity_of(_db_url()))

    global _RECONCILER
    _RECONCILER = Reconciler(_db_url(), send, resolve_redis_url(settings), queue_name(),
                             settings)
    _RECONCILER.start()
    log.info("reconciler started: every %.0f s, stale after %.0f s",
             settings.ncat_reconcile_seconds, settings.ncat_stale_seconds)


_RECONCILER = None


def _db_url() -> str:
    from schema.database import resolve_database_url

    return resolve_database_url()


def _others(task, catalog: str | None) -> bool:
    """Whether the message names another catalog than this worker's (schema.identity).
    Then it is sent again to the same queue, unchanged, for a worker of its own catalog
    to take (after a pause of a second, so that a queue no owner serves is not spun
    through), and this delivery is acknowledged: never run here, never dropped. A message
    without a catalog (sent by catalog 0.11.0 or before) is taken as this catalog's; so is
    one that arrives while this worker's database cannot be reached (the task then finds
    the database away and is sent again, still naming its catalog)."""
    import time

    import psycopg

    from catalog.config.settings import get_settings
    from schema.identity import identity_of

    if catalog is None:
        return False
    try:
        mine = identity_of(_db_url())
    except psycopg.Error:
        return False
    if catalog == mine:
        return False
    log.info("%s %s: a message of catalog %s, not this worker's (%s); left in the queue "
             "for its own workers", task.name, list(task.request.args), catalog, mine)
    time.sleep(min(get_settings().ncat_busy_retry_seconds, 1.0))
    app.send_task(task.name, args=list(task.request.args),
                  kwargs=dict(task.request.kwargs or {}),
                  queue=(task.request.delivery_info or {}).get("routing_key") or queue_name())
    return True


@app.task(name=RUN_LAYER, bind=True, max_retries=None)
def run_layer(self, job_id: int, layer: int, catalog: str | None = None,
              lost: dict | None = None) -> str:
    """Compute and store one layer of one job (and, if it is the last, the summary).

    A layer whose lock another session holds is sent again after
    NCAT_BUSY_RETRY_SECONDS, never dropped: if that session dies, the layer still runs.
    ``catalog``: the identity of the catalog the job is in (another catalog's message is
    left for its workers); ``lost``: a loss of the layer that the database could not be
    told about when it happened (jobs.runner), counted by this delivery.
    """
    from catalog.config.settings import get_settings
    from jobs.runner import Outcome, Transient, process_layer

    if _others(self, catalog):
        return "another catalog's"
    try:
        outcome = process_layer(_db_url(), job_id, layer,
                                worker=self.request.hostname or "worker", lost=lost)
    except Transient as exc:  # the database connection dropped: the layer is queued again
        raise self.retry(countdown=exc.retry_in,
                         kwargs={"catalog": catalog, "lost": exc.unrecorded}) from None
    log.info("job %s layer %s: %s", job_id, layer, outcome)
    if outcome is Outcome.BUSY:
        raise self.retry(countdown=get_settings().ncat_busy_retry_seconds)
    return outcome


@app.task(name=EXPLAIN_PROMPT, bind=True)
def explain_prompt(self, request_id: int, catalog: str | None = None) -> str:
    """Explain one requested prompt and store it (jobs.explain_jobs.process), if the
    message is this worker's catalog's."""
    from jobs.explain_jobs import process

    if _others(self, catalog):
        return "another catalog's"
    outcome = process(_db_url(), request_id, worker=self.request.hostname or "worker")
    log.info("explain request %s: %s", request_id, outcome)
    return outcome
