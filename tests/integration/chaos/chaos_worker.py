"""A real ncat worker with pauses, so a test can kill things at a known moment.

Run as ``python chaos_worker.py <ncat worker arguments>``. Each pool process, as it
starts (Celery's worker_process_init), wraps two functions of the project:
- ``jobs.store_results.store_layer``: writes ``layer <job> <layer> <pid>`` to
  CHAOS_MARKS, then sleeps CHAOS_LAYER_SLEEP seconds before computing;
- ``jobs.runner._summarize``: writes ``summary <job> <pid>``, sleeps CHAOS_SUMMARY_SLEEP;
- a poison layer: while the file CHAOS_POISON exists and holds "STEP LAYER", the pool
  process that starts that layer of that checkpoint writes ``poison <step> <layer> <pid>``
  and SIGKILLs itself (as the kernel's OOM killer would).
Nothing else changes: the worker, its reconciler, Celery, Redis and PostgreSQL are real.
"""

import os
import signal
import sys
import time


def _mark(text: str) -> None:
    with open(os.environ["CHAOS_MARKS"], "a") as f:
        f.write(f"{text} {os.getpid()}\n")


def _patch(**_) -> None:
    from jobs import runner, store_results

    store_layer, summarize = store_results.store_layer, runner._summarize

    def slow_store_layer(conn, run, ids, layer, *args, **kwargs):
        poison = os.environ.get("CHAOS_POISON")
        if poison and os.path.exists(poison):
            step = conn.execute("SELECT step FROM checkpoint WHERE id = %s",
                                (ids.checkpoint_id,)).fetchone()[0]
            if open(poison).read().split() == [str(step), str(layer)]:
                _mark(f"poison {step} {layer}")
                os.kill(os.getpid(), signal.SIGKILL)
        _mark(f"layer {os.environ.get('CHAOS_JOB', '?')} {layer}")
        time.sleep(float(os.environ.get("CHAOS_LAYER_SLEEP", "0")))
        return store_layer(conn, run, ids, layer, *args, **kwargs)

    def slow_summarize(conn, job):
        _mark(f"summary {job.id}")
        time.sleep(float(os.environ.get("CHAOS_SUMMARY_SLEEP", "0")))
        return summarize(conn, job)

    store_results.store_layer = slow_store_layer
    runner._summarize = slow_summarize


if __name__ == "__main__":
    from celery.signals import worker_process_init

    worker_process_init.connect(_patch, weak=False)
    from jobs.cli import main

    sys.exit(main(["worker", *sys.argv[1:]]))
