"""What several commands share: measurement flags generated from the configs, the
database URL, and turning bad input into one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import os
import sys

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.config.flags import add_arguments, from_args
from schema.database import first_line
from schema.database import psql_url as psql_url

DB_HELP = "database URL (default: DATABASE_URL, a local server, or an embedded one)"
BAD_INPUT = 2  # exit code of every command for input it refuses
UNREACHABLE = 3  # exit code when the database or the broker cannot be reached
LOGIN_REFUSED = 5  # exit code when the database answers but refuses the login
# exit code when job rows are committed but the broker failed while their messages went out
QUEUED_NOT_SENT = 4


def json_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout (notes and progress "
                        "go to stderr)")


def plain(x):
    """``x`` as JSON takes it: dataclasses and named tuples as objects, numpy values as
    numbers and lists, NaN as null, dates in ISO 8601, anything else as its text."""
    import dataclasses
    import datetime

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return plain({f.name: getattr(x, f.name) for f in dataclasses.fields(x)})
    if hasattr(x, "_asdict"):
        return plain(x._asdict())
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [plain(v) for v in x]
    if isinstance(x, datetime.date):
        return x.isoformat()
    if hasattr(x, "tolist"):  # numpy arrays and scalars
        return plain(x.tolist())
    if isinstance(x, float):
        return None if x != x or x in (float("inf"), float("-inf")) else x
    return x if isinstance(x, str | int | bool | type(None)) else str(x)


class Report:
    """What a command prints: lines for people on stdout, or with ``--json`` one JSON
    object on stdout at the end (``emit``) and the lines, as notes, on stderr."""

    def __init__(self, args) -> None:
        self.json = bool(getattr(args, "json", False))
        self.data: dict = {}

    def say(self, text: str) -> None:
        print(text, file=sys.stderr if self.json else sys.stdout, flush=True)

    def put(self, **values) -> None:
        self.data.update(values)

    def add(self, key: str, value) -> None:
        self.data.setdefault(key, []).append(value)

    def emit(self) -> None:
        if self.json:
            import json

            print(json.dumps(plain(self.data)), flush=True)
            self.data = {}


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return BAD_INPUT


def layer_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--layers", default=None, help="comma-separated layers (default all)")


def checkpoints_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--checkpoints", default=None,
                   help="'all', '0,512,3000' or 'start:stop:step' (default: final weights)")


def parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers must be comma-separated integers, got {text!r}") from None
    if not layers:
        raise ValueError("--layers is empty; leave it out for all layers")
    return layers


def science_options(s: argparse.ArgumentParser, base: ScienceConfig | None = None) -> None:
    """One flag per ScienceConfig field (defaults from ``base`` or the library)."""
    layer_option(s)
    add_arguments(s, ScienceConfig, base)
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(science_base=base or ScienceConfig())  # for early_refusal


def execution_options(s: argparse.ArgumentParser, device_only: bool = False) -> None:
    if device_only:
        s.add_argument("--device", default=None,
                       help="torch device the workers run this job on (default cpu)")
        return
    add_arguments(s, ExecutionConfig)
    s.set_defaults(execution_flags=True)  # for early_refusal


def loads_model(s: argparse.ArgumentParser) -> None:
    """Marks a command whose ``model`` argument names a model to load or inspect (not a
    catalogued name): early_refusal checks it (catalog.sources.names)."""
    s.set_defaults(loads_model=True)


def early_refusal(args) -> str | None:
    """What is wrong with a request that needs no model, no database and no heavy import,
    or None: the science and execution flags, the layers, the checkpoint list's syntax, a
    model path that does not exist, the database URL. ``main`` asks it before running any
    command, so such input is refused before torch is imported (issue 79; the commands
    check the same things again where they run alone)."""
    try:
        from catalog.config.settings import get_settings

        get_settings()  # NCAT_* variables the settings cannot take: SettingsError
        if getattr(args, "science_base", None) is not None:
            from catalog.labels.families import check_names

            check_names(from_args(ScienceConfig, args, args.science_base).families)
        if getattr(args, "execution_flags", False):
            execution_from(args)
        parse_layers(getattr(args, "layers", None))
        step = getattr(args, "checkpoint", None)
        if isinstance(step, int) and step < 0:
            raise ValueError(f"--checkpoint must be a training step >= 0, got {step}")
        if getattr(args, "loads_model", False):
            from catalog.sources.names import check_model_name
            from jobs.enqueue import parse_checkpoints

            check_model_name(args.model)
            if getattr(args, "checkpoints", None) not in (None, "all"):  # 'all' lists them
                parse_checkpoints(args.model, args.checkpoints)
        if getattr(args, "database_url", None):
            check_database_url(args.database_url)
        elif hasattr(args, "database_url") and os.environ.get("DATABASE_URL"):
            # the command takes one: the environment's too (read as is: the settings
            # above take any string)
            check_database_url(os.environ["DATABASE_URL"], "DATABASE_URL")
    except ValueError as exc:
        return str(exc)
    return None


def check_database_url(url: str, name: str = "--database-url") -> str:
    """``url`` if it is a PostgreSQL URL SQLAlchemy can read; ValueError naming where it
    came from (``name``) otherwise, never the URL itself."""
    from sqlalchemy.engine import make_url

    from schema.database import url_is_clean, with_driver

    if not url_is_clean(url):
        raise ValueError(f"{name} does not parse cleanly: an '@', '/', '?' or '#' in its "
                         "password must be percent-encoded ('@' is %40, '/' is %2F, '?' is "
                         "%3F, '#' is %23), or libpq reads part of the password as the host")
    try:
        parsed = make_url(with_driver(url))
    except Exception:  # noqa: BLE001 - any parse failure is the same refusal
        raise ValueError(f"{name} cannot be read as a database URL (is its port a "
                         "number?); write it as postgresql://USER@HOST:PORT/DATABASE") from None
    if parsed.get_backend_name() != "postgresql":  # the URL itself is not shown: a
        # password may sit in its query string, where hiding the password part misses it
        raise ValueError(f"{name} names the {parsed.get_backend_name()!r} backend, "
                         "not PostgreSQL (the catalog lives in PostgreSQL): write it as "
                         "postgresql://USER@HOST:PORT/DATABASE")
    return url


def science_from(args, base: ScienceConfig | None = None) -> ScienceConfig:
    """The request's science config; says on stderr what its dtype costs the effects."""
    config = from_args(ScienceConfig, args, base)
    caveat = config.precision_caveat()
    if caveat:
        print(f"warning: {caveat}", file=sys.stderr)
    return config


def execution_from(args) -> ExecutionConfig:
    return from_args(ExecutionConfig, args)


def database_url(args) -> str:
    from schema.database import resolve_database_url, with_driver

    return with_driver(args.database_url) if args.database_url else resolve_database_url()


def database_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--database-url", default=None, help=DB_HELP)


def service_exit_code(exc: BaseException) -> int:
    """The exit code of a failure ``service_error`` explains: LOGIN_REFUSED when the
    server answered and refused the login (a wrong password, an unknown user or database),
    else UNREACHABLE."""
    from schema.engine import LoginRefused, login_refused

    refused = isinstance(exc, LoginRefused) or login_refused(exc) is not None
    return LOGIN_REFUSED if refused else UNREACHABLE


def service_error(exc: BaseException, args=None) -> str | None:
    """One line for a database or broker failure (the URL without its password, a hint);
    None for anything else."""
    import psycopg
    import sqlalchemy.exc

    from schema.engine import DatabaseUnreachable, LoginRefused, login_refused

    if isinstance(exc, DatabaseUnreachable):
        return f"{exc}. Is PostgreSQL running there? (--database-url or DATABASE_URL)"
    if isinstance(exc, LoginRefused):
        return f"{exc}. Check the user, password and database of the URL"
    reason = login_refused(exc)
    if reason is not None:
        try:
            url = hide_password(database_url(args) if args is not None else "")
        except Exception:  # noqa: BLE001 - resolving the URL is what failed
            url = "the catalog database"
        return (f"{url} refused the login: {reason}. Check the user, password and database "
                "of the URL (--database-url or DATABASE_URL); what was stored stays as it was")
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        exc = exc.orig if isinstance(exc.orig, psycopg.Error) else exc
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError
                  | sqlalchemy.exc.OperationalError):

        try:
            url = hide_password(database_url(args) if args is not None else "")
        except Exception:  # noqa: BLE001 - resolving the URL is what failed
            url = "the catalog database"
        first = first_line(exc)
        return (f"lost or could not open the connection to {url}: {first}. Is PostgreSQL "
                "running there? (--database-url or DATABASE_URL chooses the server; what was "
                "stored before stays as it was)")
    if type(exc).__module__.split(".")[0] in ("redis", "kombu", "amqp"):
        from catalog.config.settings import get_settings

        url = hide_password(get_settings().redis_url or "redis://localhost:6379/0")
        first = first_line(exc)
        return (f"cannot reach the job broker at {url}: {first}. Is Redis running? "
                "(REDIS_URL chooses it)")
    return None


def hide_password(url: str) -> str:
    """The URL as commands show it: no password in any form (schema.database.shown_url)."""
    from schema.database import shown_url

    return shown_url(url)


def ncat_command() -> str:
    """How to run ``ncat`` again from this shell: ``ncat`` when that name on the PATH is
    this program, else the path this one was started by (``.venv/bin/ncat`` when the
    virtual environment is not activated; ``python -m jobs.cli`` when run that way)."""
    import os
    import shutil
    from pathlib import Path

    me = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if me is None or me.name in ("__main__.py", "-m", "-c") or me.suffix == ".py":
        return f"{sys.executable} -m jobs.cli"
    found = shutil.which("ncat")
    if found and me.exists() and Path(found).resolve() == me.resolve():
        return "ncat"
    try:
        return os.path.relpath(me.resolve()) if me.exists() else str(me)
    except ValueError:  # another drive (Windows)
        return str(me.resolve())
