"""The demo: everything from a bare machine to a browsable catalog of the built-in model.

Finds or starts PostgreSQL and Redis (embedded fallbacks), migrates, trains the built-in
model (cached), starts a worker, catalogs every checkpoint through the queue with a
progress bar, and serves the explorer. A second run finds every job done and is up in
seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from catalog.config import ScienceConfig
from catalog.config.settings import Settings, child_env, get_settings

ROOT = Path(__file__).resolve().parents[1]
# The demo catalogs operands in [0, 100): on 2 CPU cores a full built-in checkpoint then
# takes well under a minute (the paper's [0, 300) grid takes about 9x longer).
DEMO_CONFIG = ScienceConfig(operand_hi=100)


def _start_worker(log: Path, settings: Settings) -> subprocess.Popen:
    n = demo_processes()
    return subprocess.Popen([sys.executable, "-m", "jobs.cli", "worker", "--loglevel", "warning",
                             "--hostname", "demo@%h", "--concurrency", str(n)],
                            cwd=ROOT, env={**child_env(settings), **math_threads(n)},
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


# pool processes of the demo's worker at most: each holds its operators' fits (about
# 3 GB resident on the demo's grid)
DEMO_PROCESSES = 4


def demo_processes() -> int:
    """The demo worker's pool processes: one per core, up to ``DEMO_PROCESSES``. The
    built-in model's layers are small work each (a thread's share of a matrix product is
    too small to pay for itself); one process per core with one torch thread each
    catalogued 1.51x the checkpoints per minute of one process with two threads
    (``bench/demo_checkpoint.py``, docs/tests.md)."""
    return max(1, min(DEMO_PROCESSES, len(os.sched_getaffinity(0))))


def math_threads(processes: int) -> dict[str, str]:
    """The math libraries' thread counts for a worker of ``processes`` pool processes,
    each its share of the cores: numpy's BLAS reads them when it loads, before any pool
    process starts (a count the caller set already is kept)."""
    share = str(max(1, len(os.sched_getaffinity(0)) // processes))
    return {k: os.environ.get(k, share)
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


def demo_settings(settings: Settings | None = None) -> Settings:
    """The demo's settings: a database and a broker found or started (embedded fallbacks),
    and its own queue unless NCAT_QUEUE names one."""
    from jobs.broker import resolve_redis_url
    from schema.database import resolve_database_url, with_driver

    s = settings or get_settings()
    url = with_driver(s.database_url) if s.database_url else resolve_database_url(s)
    queue = s.ncat_queue if "ncat_queue" in s.model_fields_set else "ncat-demo"
    return s.model_copy(update={"database_url": url, "redis_url": resolve_redis_url(s),
                                "ncat_queue": queue})


def catalog_all(model: str = "builtin", config: ScienceConfig = DEMO_CONFIG,
                progress: bool = True, settings: Settings | None = None) -> dict:
    """The non-interactive part: services, migration, training, queue, worker, wait."""
    from jobs.enqueue import celery_sender
    from schema.engine import migrate
    from schema.jobs import Status

    s = demo_settings(settings)
    if progress:
        _announce(s)
    url = migrate(s.database_url)
    send = celery_sender(s, url)
    ids, status = _queued(url, model, config, send, s, progress)
    total = sum(st.layers_total for st in status)
    if any(st.status != Status.DONE for st in status):
        status = _worked(url, ids, total, s, progress)
    else:  # the bar, already full: a second run says the catalog is there
        status = _wait(url, ids, total, None, None, progress)
    failed = [st for st in status if st.status == Status.FAILED]
    return {"database_url": url, "jobs": len(status), "layers": total,
            "failed": [(st.job_id, st.step, st.error) for st in failed]}


def _announce(s: Settings) -> None:
    """Where the demo's catalog, queue and home are (URLs without their secrets)."""
    from schema.database import psql_url, shown_url

    print(f"demo: catalog database {psql_url(s.database_url)}; job broker "
          f"{shown_url(s.redis_url)}; home {s.ncat_home}", flush=True)


def _queued(url: str, model: str, config: ScienceConfig, send, s: Settings,
            progress: bool) -> tuple[list[int], list]:
    """(job ids, their statuses) once the model is trained (the built-in one) and its
    checkpoints enqueued, failed or cancelled jobs of an earlier run sent again."""
    from catalog import builtin
    from jobs.enqueue import enqueue, job_statuses, retry
    from schema.jobs import Status

    if model in ("builtin", builtin.BUILTIN_NAME):
        builtin.train(builtin.TrainConfig(), root=s.builtin_root, progress=progress)
    ids = [j.job_id for j in enqueue(url, model, "all", config, send=send)]
    for st in job_statuses(url, ids):
        if st.status in (Status.FAILED, Status.CANCELLED):
            retry(url, st.job_id, send=send)
    return ids, job_statuses(url, ids)


def _worked(url: str, ids: list[int], total: int, s: Settings, progress: bool) -> list:
    """The jobs' statuses once the demo's own worker has done them (it is stopped after)."""
    log_path = s.ncat_home / "demo-worker.log"
    s.ncat_home.mkdir(parents=True, exist_ok=True)
    worker = _start_worker(log_path, s)
    try:
        return _wait(url, ids, total, worker, log_path, progress)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)


def _wait(url: str, ids: list[int], total: int, worker, log_path, progress: bool) -> list:
    """Until every job is done or failed (a progress bar of their layers and summaries);
    their statuses. A worker that stops on the way is an error that names its log."""
    from catalog.core.progress import progress_bar
    from jobs.enqueue import job_statuses
    from schema.jobs import Status

    # a step each layer and each checkpoint's summary (the layers alone made the time
    # left 1.2-2x too short: the summary comes after them)
    with progress_bar(total + len(ids), "cataloging checkpoints", "step",
                      enabled=progress) as bar:
        while True:
            status = job_statuses(url, ids)
            done = sum(st.layers_done + (st.status == Status.DONE) for st in status)
            bar.update(done - bar.n)
            if all(st.status in (Status.DONE, Status.FAILED) for st in status):
                return status
            if worker is not None and worker.poll() is not None:
                raise RuntimeError(f"the demo worker stopped; see {log_path}")
            time.sleep(0.5)
