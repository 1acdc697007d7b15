"""Queue overhead: one built-in checkpoint through enqueue -> Celery worker -> PostgreSQL,
against calling catalog.measure plus the writer directly, in the same run.

Run: .venv/bin/python bench/queue_overhead.py [--runs N]   (target: overhead <= 15%)
Each run measures the checkpoint directly (the model loaded afresh) and then through a
fresh worker; the report gives medians over the runs and the spread (min-max).
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from catalog import builtin
from catalog.config import ScienceConfig
from catalog.sources import load_model
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.database import resolve_database_url
from schema.engine import migrate

from _common import ROOT, over_runs, runs_option, save

CONFIG = ScienceConfig(operand_hi=100)


def fresh_db(server: str) -> str:
    url = server.rsplit("/", 1)[0] + f"/ncat_bench_{uuid.uuid4().hex[:8]}"
    migrate(url)
    return url


def drop(url: str) -> None:
    with store.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def main(runs: int = 5):
    builtin.train(builtin.TrainConfig())
    per_run = [one_run(resolve_database_url()) for _ in range(runs)]
    keys = ("direct_s", "queue_s", "queue_warm_worker_s", "overhead", "warm_worker_overhead")
    save("queue", {"runs": runs, **over_runs(per_run, keys),
                   "job_status": [r["job_status"] for r in per_run], "rows": per_run[-1]["rows"]})


def one_run(server: str) -> dict:
    """Direct measurement and then the same checkpoint through a fresh worker."""
    direct_db, queue_db = fresh_db(server), fresh_db(server)
    t0 = time.perf_counter()
    catalog_checkpoint(direct_db, load_model("builtin"), CONFIG)
    direct_s = time.perf_counter() - t0

    os.environ.update({"DATABASE_URL": queue_db, "NCAT_QUEUE": f"bench-{uuid.uuid4().hex[:8]}"})
    log = Path(ROOT / "bench" / "results" / "queue-worker.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    worker = subprocess.Popen([sys.executable, "-m", "jobs.cli", "worker", "--loglevel", "info"],
                              cwd=ROOT, env=dict(os.environ), stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while "ready." not in log.read_text():  # worker start-up is not part of the job
            time.sleep(0.2)
        from jobs.enqueue import enqueue, job_statuses

        runs = []
        for i in range(2):  # first: a fresh worker; second, forced: model and grids cached
            t0 = time.perf_counter()
            (job,) = enqueue(queue_db, "builtin", None, CONFIG, force=i > 0)
            while job_statuses(queue_db, [job.job_id])[0].status not in ("done", "failed"):
                time.sleep(0.05)
            runs.append(time.perf_counter() - t0)
        queue_s, warm_s = runs
        status = job_statuses(queue_db, [job.job_id])[0].status
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait()
    same = {t: store.connect(direct_db).execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("neuron_op", "neuron_score", "checkpoint_summary")}
    drop(direct_db)
    drop(queue_db)
    return {"direct_s": direct_s, "queue_s": queue_s, "queue_warm_worker_s": warm_s,
            "overhead": queue_s / direct_s - 1, "warm_worker_overhead": warm_s / direct_s - 1,
            "job_status": status, "rows": same}


if __name__ == "__main__":
    main(runs_option())
