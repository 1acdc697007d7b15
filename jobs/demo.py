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

from catalog.config import MeasureConfig

ROOT = Path(__file__).resolve().parents[1]
# The demo catalogs operands in [0, 100): on 2 CPU cores a full built-in checkpoint then
# takes well under a minute (the paper's [0, 300) grid takes about 9x longer).
DEMO_CONFIG = MeasureConfig(operand_hi=100)


def _start_worker(log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jobs.cli", "worker", "--loglevel", "warning",
                             "--hostname", "demo@%h"], cwd=ROOT, env=dict(os.environ),
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def catalog_all(model: str = "builtin", config: MeasureConfig = DEMO_CONFIG,
                progress: bool = True) -> dict:
    """The non-interactive part: services, migration, training, queue, worker, wait."""
    from tqdm.auto import tqdm

    from catalog import builtin
    from jobs.broker import resolve_redis_url
    from jobs.enqueue import enqueue, job_statuses, retry
    from schema.engine import migrate
    from schema.settings import Settings, resolve_database_url, with_driver

    db = os.environ.get("DATABASE_URL")
    url = migrate(with_driver(db) if db else resolve_database_url())
    os.environ["DATABASE_URL"] = url
    os.environ["REDIS_URL"] = resolve_redis_url()
    os.environ.setdefault("NCAT_QUEUE", "ncat-demo")
    if model in ("builtin", builtin.BUILTIN_NAME):
        builtin.train(builtin.TrainConfig(), progress=progress)
    jobs = enqueue(url, model, "all", config)
    ids = [j.job_id for j in jobs]
    for s in job_statuses(url, ids):
        if s.status in ("failed", "cancelled"):
            retry(url, s.job_id)
    status = job_statuses(url, ids)
    total = sum(s.layers_total for s in status)
    worker = None
    if any(s.status != "done" for s in status):
        home = Settings().ncat_home
        home.mkdir(parents=True, exist_ok=True)
        worker = _start_worker(home / "demo-worker.log")
    try:
        with tqdm(total=total, desc="cataloging checkpoints", unit="layer",
                  disable=not progress) as bar:
            while True:
                status = job_statuses(url, ids)
                done = sum(s.layers_done for s in status)
                bar.update(done - bar.n)
                if all(s.status in ("done", "failed") for s in status):
                    break
                if worker is not None and worker.poll() is not None:
                    raise RuntimeError("the demo worker stopped; see "
                                       f"{Settings().ncat_home / 'demo-worker.log'}")
                time.sleep(0.5)
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
    failed = [s for s in status if s.status == "failed"]
    return {"database_url": url, "jobs": len(status), "layers": total,
            "failed": [(s.job_id, s.step, s.error) for s in failed]}
