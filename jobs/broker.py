"""Where the Redis broker is: ``REDIS_URL``, else localhost:6379, else an embedded server.

The embedded fallback starts the ``redis-server`` binary (Debian's package) on a free
local port with its files in ``$NCAT_HOME/redis``, so the demo runs on a bare machine. It
keeps an append-only file there, so queued messages survive its restart.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from pathlib import Path

from catalog.config.settings import Settings, get_settings
from schema.database import port_open

log = logging.getLogger(__name__)

RUN_LAYER = "ncat.run_layer"  # compute and store one (job, layer)
EXPLAIN_PROMPT = "ncat.explain_prompt"  # explain one requested prompt (jobs.explain_jobs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_embedded_redis(home: Path) -> str:
    """Start (or reuse) a redis-server under ``home``; returns its URL."""
    folder = home / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    port_file = folder / "port"
    if port_file.exists():
        port = int(port_file.read_text())
        if port_open("127.0.0.1", port):
            return f"redis://127.0.0.1:{port}/0"
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("no Redis: set REDIS_URL, run one on localhost:6379, or install "
                           "the redis-server package (scripts/setup.sh does on Debian)")
    port = _free_port()
    subprocess.run([binary, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes",
                    "--dir", str(folder), "--save", "", "--appendonly", "yes",
                    "--appendfsync", "everysec",
                    "--logfile", str(folder / "redis.log")], check=True)
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded redis-server did not start; see {folder / 'redis.log'}")
        time.sleep(0.1)
    port_file.write_text(str(port))
    log.warning("started an embedded redis-server on 127.0.0.1:%d (files in %s); it keeps "
                "running for later commands; `ncat stop` stops it", port, folder)
    return f"redis://127.0.0.1:{port}/0"


def stop_embedded_redis(home: Path) -> bool:
    """Shut down the embedded redis-server of ``home`` (its append-only file stays);
    returns whether one was running."""
    import redis

    port_file = home / "redis" / "port"
    if not port_file.exists():
        return False
    port = int(port_file.read_text())
    if not port_open("127.0.0.1", port):
        return False
    try:
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=10).shutdown()
    except redis.ConnectionError:
        pass  # the server closes the connection as it goes
    return True


def resolve_redis_url(settings: Settings | None = None) -> str:
    s = settings or get_settings()
    if s.redis_url:
        return s.redis_url
    if port_open("localhost", 6379):
        return "redis://localhost:6379/0"
    return start_embedded_redis(s.ncat_home)


def check_broker(url: str, timeout: float = 5.0) -> str:
    """Raise redis' own ConnectionError (which the CLI turns into exit 3) unless the broker
    at ``url`` answers: checked before a job row is written. Returns the server's run id,
    which changes when it restarts (``BrokerRestarted``)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    return str(client.info("server").get("run_id", ""))


class BrokerRestarted(ConnectionError):
    """The broker answered before messages were sent and answers after, but as a restarted
    server (another run id): messages sent to the old one may be lost with its memory."""

    def __init__(self) -> None:
        super().__init__("the broker restarted while the messages were sent (its run id "
                         "changed), so some of them may be lost")
