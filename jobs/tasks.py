"""Celery tasks: thin wrappers around jobs.runner."""

from __future__ import annotations

import logging

from jobs.celery_app import app

log = logging.getLogger(__name__)


def _db_url() -> str:
    from schema.settings import resolve_database_url

    return resolve_database_url()


@app.task(name="ncat.run_layer", bind=True)
def run_layer(self, job_id: int, layer: int) -> str:
    """Compute and store one layer of one job (and, if it is the last, the summary)."""
    from jobs.runner import process_layer

    outcome = process_layer(_db_url(), job_id, layer, worker=self.request.hostname or "worker")
    log.info("job %s layer %s: %s", job_id, layer, outcome)
    return outcome
