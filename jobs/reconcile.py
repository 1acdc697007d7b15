"""The reconciler: the database says what work exists; the broker only carries hints.

Every worker runs one in its parent process (a thread started when the worker is ready;
no torch there), every NCAT_RECONCILE_SECONDS; a transaction-level advisory lock lets one
pass run at a time across workers. A pass finds, for jobs that are queued or running:

- layers that are queued or running with no live holder: their advisory lock is free
  (the server frees it when the holder's connection dies), no message for them waits in
  the broker's queue, and neither a heartbeat nor a send happened within
  NCAT_STALE_SECONDS (doubled after each resend, up to 8x). Those are sent again; a layer
  lost while running NCAT_MAX_ATTEMPTS times (``resends``: starts that died, counted since
  a person last queued it) fails its job with the error, so a layer that kills its worker
  every time does not loop forever. Re-sending a queued layer (its message may wait
  unacknowledged in a worker's prefetch, which the queue does not show) is not a loss
  (``sends``);
- jobs whose layers are all stored but whose final step (summary, view refresh) never
  ran or died: no one holds the job's summary lock and nothing changed within the stale
  bound (doubled after each time it was resumed, up to 8x: no worker may be ready to take
  it). They go back to running and one message goes out; the worker that takes it finds
  the layer stored and runs the final step.

Each pass also holds the analysts' sessions (``catalog_reader``, e.g. through psql) to the
role's bounds plus a grace (``schema.console.bound_readers``): statements past the
statement timeout are cancelled, sessions idle past the idle timeout and transactions open
past the transaction timeout are ended; a session may lengthen its own timeouts.

What it did is written to ``reconcile_event`` (``ncat status`` shows it). Messages go out
after the transaction commits, so a worker always finds the rows they point to.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from catalog.config.settings import Settings, get_settings
from jobs.broker import RUN_LAYER
from jobs.locks import LOCK_NAMESPACE, RECONCILE_KEY, SUMMARY_SLOT, layer_lock_key
from schema import jobs as jobdb
from schema import store
from schema.console import bound_readers
from schema.identity import identity_of
from schema.jobs import Status, active_layers

log = logging.getLogger(__name__)

Send = Callable[[int, int], None]


@dataclass
class Action:
    job_id: int
    layer: int | None
    action: str  # resent | summary_resumed | failed
    detail: dict


def broker_pending(redis_url: str, queue: str,
                   catalog: str | None = None) -> set[tuple[int, int]] | None:
    """(job, layer) of the run_layer messages of ``catalog`` (schema.identity; and those
    that name none, sent by catalog 0.11.0 or before) waiting in ``queue`` (not yet
    delivered); another catalog's job 3 on the same queue is not this one's. None when
    the broker cannot be read (then nothing is judged lost)."""
    import redis

    try:
        r = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
        raw = []
        for key in [queue] + [f"{queue}\x06\x16{p}" for p in range(1, 10)]:
            raw += r.lrange(key, 0, -1)
    except Exception as exc:  # noqa: BLE001 - any broker trouble means "do not judge"
        log.warning("reconciler: cannot read the broker's queue %s: %s", queue, exc)
        return None
    out = set()
    for item in raw:
        try:
            msg = json.loads(item)
            body = msg["body"]
            if msg.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args, kwargs = json.loads(body)[:2]
            named = (kwargs or {}).get("catalog")
            if msg.get("headers", {}).get("task") == RUN_LAYER and len(args) == 2 and (
                    catalog is None or named is None or named == catalog):
                out.add((int(args[0]), int(args[1])))
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return out


def reconcile(url: str, send: Send, pending: set[tuple[int, int]] | None,
              settings: Settings | None = None) -> list[Action]:
    """One pass (see the module docstring); returns what it did."""
    s = settings or get_settings()
    if pending is None:
        return []
    actions: list[Action] = []
    to_send: list[tuple[int, int]] = []
    with store.connect(url) as conn, conn.transaction():
        if not jobdb.try_lock(conn, RECONCILE_KEY, transaction=True):
            return []  # another worker's reconciler is at it
        held = held_lock_keys(conn)
        rows = active_layers(conn)
        failed_jobs: set[int] = set()
        for job_id, layer, status, attempts, resends, sends, worker, quiet in rows:
            if job_id in failed_jobs or layer_lock_key(job_id, layer) in held \
                    or (job_id, layer) in pending:
                continue
            bound = s.ncat_stale_seconds * 2 ** min(resends + sends, 3)
            if quiet is not None and quiet < bound:
                continue
            quiet_s = None if quiet is None else round(float(quiet), 1)
            if status == Status.RUNNING:  # a start that died: one more loss
                cause = (f"no heartbeat for {quiet_s} s (last on {worker}); the reconciler "
                         "judged it lost")
                if jobdb.lose_layer(conn, job_id, layer, resends=resends,
                                    limit=s.ncat_max_attempts, cause=cause, then="resend",
                                    kind="no heartbeat"):
                    failed_jobs.add(job_id)
                    actions.append(Action(job_id, layer, "failed", {"lost": resends + 1,
                                                                    "started": attempts}))
                    continue
                counts = {"lost": resends + 1}
            else:  # queued: its message lost, or waiting in a worker's prefetch
                jobdb.resend_queued(conn, job_id, layer)
                counts = {"sends": sends + 1}
            to_send.append((job_id, layer))
            actions.append(Action(job_id, layer, "resent", {
                "was": status, "quiet_seconds": quiet_s, "worker": worker, **counts}))
        # jobs whose layers are all done and whose final step is not running
        # (with how often its summary was resumed since its last layer finished: the
        # bound doubles each time, up to 8x, so a summary no worker can take is not sent
        # every stale period)
        finals = jobdb.finished_layers_jobs(conn)
        for job_id, status, quiet, first, resumed in finals:
            bound = s.ncat_stale_seconds * 2 ** min(int(resumed), 3)
            if layer_lock_key(job_id, SUMMARY_SLOT) in held or quiet < bound:
                continue
            jobdb.resume_summary(conn, job_id)
            to_send.append((job_id, first))
            actions.append(Action(job_id, None, "summary_resumed",
                                  {"was": status, "quiet_seconds": round(float(quiet), 1),
                                   "times": int(resumed) + 1}))
        jobdb.record_events(conn, [(a.job_id, a.layer, a.action, a.detail) for a in actions])
    for job_id, layer in to_send:
        send(job_id, layer)
    for a in actions:
        log.warning("reconciler: job %s layer %s: %s %s", a.job_id, a.layer, a.action, a.detail)
    return actions


def held_lock_keys(conn) -> set[int]:
    """Advisory lock keys of this project's namespace held in THIS database
    (``schema.jobs.advisory_keys``)."""
    return {k for k in jobdb.advisory_keys(conn) if k >> 40 == LOCK_NAMESPACE}


def stale_layers(conn, settings: Settings | None = None) -> list[tuple]:
    """(job, layer, status, worker, seconds quiet) of active layers that no live worker
    holds and that have been quiet longer than the stale bound: what the next reconciler
    pass will send again (``ncat status`` lists them)."""
    s = settings or get_settings()
    held = held_lock_keys(conn)
    return [(j, la, st, w, None if q is None else float(q))
            for j, la, st, _, _, _, w, q in active_layers(conn)
            if layer_lock_key(j, la) not in held and (q is None or q >= s.ncat_stale_seconds)]


class Reconciler(threading.Thread):
    """The periodic pass, in a daemon thread of the worker's parent process."""

    def __init__(self, url: str, send: Send, redis_url: str, queue: str,
                 settings: Settings | None = None) -> None:
        super().__init__(name="ncat-reconciler", daemon=True)
        self.url, self.send, self.redis_url, self.queue = url, send, redis_url, queue
        self.settings = settings or get_settings()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                pending = broker_pending(self.redis_url, self.queue, identity_of(self.url))
                reconcile(self.url, self.send, pending, self.settings)
            except Exception:  # noqa: BLE001 - a pass that fails is tried again next time
                log.exception("reconciler pass failed; trying again in %.0f s",
                              self.settings.ncat_reconcile_seconds)
            try:
                with store.connect(self.url, autocommit=True, connect_timeout=10) as conn:
                    bound_readers(conn)
            except Exception:  # noqa: BLE001 - the guard is tried again next time
                log.exception("reconciler: the guard on analysts' statements failed")
            self.stopped.wait(self.settings.ncat_reconcile_seconds)

    def stop(self) -> None:
        self.stopped.set()
