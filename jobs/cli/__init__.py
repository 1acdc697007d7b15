"""Command line: ``ncat``. One module per group of commands; each adds its own parsers.

The catalog library never prints; these modules turn its results into text. Only
light modules are imported at start-up (``ncat worker`` must not import torch in the
worker's parent process); each command imports the science when it runs. Every
command exits with 2 for input it refuses, with a one-line message naming what to fix,
with 3 when the database or the broker cannot be reached (one line: the URL without its
password, and a hint; nothing is written), and enqueue and retry with 4 when the jobs
are committed but the broker failed while their messages went out (docs/cli.md).
"""

from __future__ import annotations

import argparse
import logging
import sys

from jobs.cli import measuring, queue, serving
from jobs.cli.measuring import print_result

__all__ = ["build_parser", "main", "print_result"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ncat", description="The arithmetic neuron catalog.")
    sub = p.add_subparsers(dest="command", required=True)
    serving.add_commands(sub)
    measuring.add_commands(sub)
    queue.add_commands(sub)
    return p


UNREACHABLE = 3  # exit code when the database or the broker cannot be reached


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except Exception as exc:
        line = service_error(exc, args)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return UNREACHABLE


def service_error(exc: BaseException, args=None) -> str | None:
    """One line for a database or broker failure (the URL without its password, a hint);
    None for anything else."""
    import psycopg
    import sqlalchemy.exc

    from schema.engine import DatabaseUnreachable

    if isinstance(exc, DatabaseUnreachable):
        return f"{exc}. Is PostgreSQL running there? (--database-url or DATABASE_URL)"
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        exc = exc.orig if isinstance(exc.orig, psycopg.Error) else exc
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError
                  | sqlalchemy.exc.OperationalError):
        from jobs.cli.common import database_url

        try:
            url = hide_password(database_url(args) if args is not None else "")
        except Exception:  # noqa: BLE001 - resolving the URL is what failed
            url = "the catalog database"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (f"lost or could not open the connection to {url}: {first}. Is PostgreSQL "
                "running there? (--database-url or DATABASE_URL chooses the server; what was "
                "stored before stays as it was)")
    if type(exc).__module__.split(".")[0] in ("redis", "kombu", "amqp"):
        from catalog.settings import get_settings

        url = hide_password(get_settings().redis_url or "redis://localhost:6379/0")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (f"cannot reach the job broker at {url}: {first}. Is Redis running? "
                "(REDIS_URL chooses it)")
    return None


def hide_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy knows: show no part of it
        return "the configured URL"
