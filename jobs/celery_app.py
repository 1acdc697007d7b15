"""The Celery application and the settings long GPU tasks need.

- late acks and ``task_reject_on_worker_lost``: a task whose worker dies is delivered
  again instead of being lost;
- prefetch 1: a worker holds one task at a time, so others can take the rest;
- a Redis visibility timeout longer than the longest task (``NCAT_VISIBILITY_TIMEOUT``,
  default 6 hours), after which an unacknowledged task is delivered again;
- one process per GPU (concurrency 1); results are not stored in Redis: progress is
  durable in PostgreSQL;
- a pool process may take NCAT_CHILD_STARTUP_SECONDS to start (it imports torch), so a
  replacement for a killed child is not itself killed for being slow.
This module imports neither torch nor the catalog, so the worker's parent process never
initialises CUDA; the tasks import them inside the child.
"""

from __future__ import annotations

from celery import Celery

from catalog.config.settings import Settings, get_settings
from jobs.broker import EXPLAIN_PROMPT, RUN_LAYER, resolve_redis_url


def send_layer(app: Celery, job_id: int, layer: int, queue: str | None = None, *,
               catalog: str) -> None:
    """Send the run-layer task of (job, layer) of the catalog whose identity is
    ``catalog`` (schema.identity): every sender of a layer goes through here."""
    app.send_task(RUN_LAYER, args=[job_id, layer], kwargs={"catalog": catalog},
                  queue=queue or queue_name())


def send_explanation(app: Celery, request_id: int, queue: str | None = None, *,
                     catalog: str) -> None:
    """Send the explain-prompt task of a request (jobs.explain_jobs) of ``catalog``."""
    app.send_task(EXPLAIN_PROMPT, args=[request_id], kwargs={"catalog": catalog},
                  queue=queue or queue_name())


def queue_name() -> str:
    return get_settings().ncat_queue


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app configured from the settings (broker URL, queue, timeouts), lazily:
    nothing is resolved until the app's configuration is first read (a task sent, a
    worker started, a control command), so importing this module neither probes for a
    broker nor starts the embedded Redis server (``jobs.broker.resolve_redis_url``)."""
    app = Celery("ncat", include=["jobs.tasks"])
    app.add_defaults(lambda: _config(settings or get_settings()))
    return app


def _config(settings: Settings) -> dict:
    return {
        "broker_url": resolve_redis_url(settings),
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": 1,
        # kombu's Redis transport sweeps for unacknowledged messages past their visibility
        # timeout every 10 s but scans Redis only on every 10th sweep by default, so a
        # killed worker's task came back up to 100 s after its timeout (a test saw 97 s
        # against 20 s); a scan per sweep is one ZRANGE every 10 s
        # a broker URL whose port accepts and never answers (another server, a hung
        # Redis) held a worker silent for ever, and its SIGTERM for minutes: reads and
        # connects are bounded (NCAT_BROKER_TIMEOUT_SECONDS; kombu's Redis transport
        # polls with BRPOP for 1 s at a time), so Celery logs "Cannot connect ... Trying
        # again" instead
        "broker_transport_options": {"visibility_timeout": settings.ncat_visibility_timeout,
                                     "unacked_restore_throttle": 1,
                                     "socket_timeout": settings.ncat_broker_timeout_seconds,
                                     "socket_connect_timeout":
                                         settings.ncat_broker_timeout_seconds},
        "broker_connection_retry_on_startup": True,
        "task_ignore_result": True,
        "task_default_queue": settings.ncat_queue,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
        # a new pool process imports torch and the catalog before it reports ready, which
        # takes 7-17 s on a loaded machine; Celery's default allowance (4 s) killed every
        # replacement child in a loop, so the task it held never ran
        "worker_proc_alive_timeout": settings.ncat_child_startup_seconds,
    }


def workers_on_queue(settings: Settings | None = None, timeout: float = 1.0) -> int:
    """How many workers consuming this settings' queue answer on the broker within
    ``timeout`` seconds (workers of other queues on the same broker are not counted)."""
    settings = settings or get_settings()
    ask = make_app(settings)
    try:
        replies = ask.control.inspect(timeout=timeout).active_queues() or {}
    finally:
        ask.close()
    return sum(any(q.get("name") == settings.ncat_queue for q in queues)
               for queues in replies.values())


app = make_app()
