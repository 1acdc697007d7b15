"""Celery tasks: thin wrappers around jobs.runner."""

from __future__ import annotations

import logging

from celery.signals import worker_process_init

from jobs.celery_app import app

log = logging.getLogger(__name__)


@worker_process_init.connect
def _import_the_science(**_) -> None:
    """Import torch and the catalog in each pool process as it starts, not on its first
    task (several seconds). The parent process never imports them, so CUDA is never
    initialised there."""
    import catalog.measurement  # noqa: F401
    import catalog.sources  # noqa: F401
    import jobs.runner  # noqa: F401


def _db_url() -> str:
    from schema.settings import resolve_database_url

    return resolve_database_url()


@app.task(name="ncat.run_layer", bind=True, max_retries=None)
def run_layer(self, job_id: int, layer: int) -> str:
    """Compute and store one layer of one job (and, if it is the last, the summary).

    A layer whose lock another session holds is sent again after
    NCAT_BUSY_RETRY_SECONDS, never dropped: if that session dies, the layer still runs.
    """
    from catalog.settings import get_settings
    from jobs.runner import process_layer

    outcome = process_layer(_db_url(), job_id, layer, worker=self.request.hostname or "worker")
    log.info("job %s layer %s: %s", job_id, layer, outcome)
    if outcome == "busy":
        raise self.retry(countdown=get_settings().ncat_busy_retry_seconds)
    return outcome
