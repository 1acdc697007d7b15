"""Commands around the database and the explorer: migrate, export, explore, demo."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs.cli.common import (
    database_option,
    database_url,
    fail,
    json_option,
    ncat_command,
    psql_url,
    science_from,
    science_options,
)
from jobs.signals import sigterm_exits

ROOT = Path(__file__).resolve().parents[2]


def _port(args) -> int:
    if args.port is not None:
        return args.port
    from catalog.config.settings import SettingsError, get_settings

    try:
        return get_settings().ncat_explorer_port
    except SettingsError as exc:  # ncat's main refuses it first; the demo's own start too
        raise SystemExit(str(exc)) from None


def cmd_migrate(args) -> int:
    from catalog.config.settings import get_settings
    from jobs.cli.common import Report, hide_password
    from schema.console import reader_guard_loaded
    from schema.engine import current_revision, migrate, set_reader_password
    from schema.store import connect

    out = Report(args)
    url = migrate(database_url(args))
    out.say(f"database migrated to head: {hide_password(url)}")  # never the password
    secret = get_settings().ncat_reader_password
    if secret is not None:
        set_reader_password(url, secret.get_secret_value())
        out.say("catalog_reader's password set (NCAT_READER_PASSWORD)")
    with connect(url) as conn:
        guarded = reader_guard_loaded(conn)
    if guarded:
        out.say("reader guard: loaded into catalog_reader's sessions (no LISTEN/NOTIFY, no "
                "ALTER ROLE, work_mem capped)")
    else:
        out.say("reader guard: not loaded (this server has no ncat_reader_guard library, "
                "or the migrating role is not a superuser): analysts keep LISTEN/NOTIFY, "
                "ALTER ROLE on their shared role and any work_mem; scripts/reader-guard.sh "
                "builds it (docs/store.md)")
    out.put(url=hide_password(url), revision=current_revision(url),
            reader_password_set=secret is not None, reader_guard=guarded)
    out.emit()
    return 0


def cmd_export(args) -> int:
    from schema.export import export

    if args.format in ("mib", "neuronpedia"):
        return _export_field(args)
    try:
        n = export(database_url(args), args.what, Path(args.out), args.format)
    except ValueError as exc:
        return fail(str(exc))
    except Exception as exc:  # database errors: say what failed
        from jobs.cli.common import service_error
        from schema.database import first_line

        if service_error(exc, args) is not None:
            raise  # the server could not be reached: main() says so, exit 3
        return fail(f"export of {args.what!r} failed: {first_line(exc)}")
    from jobs.cli.common import Report

    out = Report(args)
    out.say(f"{n} rows written to {args.out}")
    out.put(rows=n, out=args.out)
    out.emit()
    return 0


def _export_field(args) -> int:
    """``ncat export MODEL --format mib|neuronpedia --out DIR`` (jobs.field_exports)."""
    from jobs import field_exports
    from schema.engine import SchemaBehind, require_current

    try:
        url = require_current(database_url(args))
        model = stored_name(args.what)
        if args.format == "mib":
            paths = field_exports.export_mib(url, model, Path(args.out),
                                             step=args.checkpoint, config_id=args.config_id,
                                             op=args.op, k=args.k)
        else:
            paths = field_exports.export_neuronpedia(url, model, Path(args.out),
                                                     step=args.checkpoint,
                                                     config_id=args.config_id, top=args.top,
                                                     examples=args.examples)
    except (field_exports.ExportError, SchemaBehind) as exc:
        return fail(str(exc))
    from jobs.cli.common import Report

    out = Report(args)
    out.say(f"{len(paths)} {args.format} file(s) written to {args.out}: "
            + ", ".join(p.name for p in paths[:6]) + (" ..." if len(paths) > 6 else ""))
    out.put(format=args.format, files=[str(p) for p in paths])
    out.emit()
    return 0


def stored_name(name: str) -> str:
    """The name a model is stored under, as every other command resolves it (``builtin``
    is ``builtin-arith``); a name no source knows here (a model measured on another
    machine) is looked up as given."""
    from catalog.sources import ModelSourceError, canonical_name

    try:
        return canonical_name(name)
    except (ModelSourceError, ValueError, FileNotFoundError):
        return name


def cmd_report(args) -> int:
    from schema.engine import SchemaBehind, require_current
    from schema.report_reads import ReportError

    try:
        # the database first: a refused login or an unreachable server is said at once,
        # not after the report's heavy imports (8 s)
        url = require_current(database_url(args))
        from reports.report import report

        model = stored_name(args.model)
        html_path, md_path = report(url, model, args.checkpoint, Path(args.out),
                                    top_n=args.top)
    except (ReportError, SchemaBehind, ValueError) as exc:
        return fail(str(exc))
    from jobs.cli.common import Report

    out = Report(args)
    out.say(f"report: {html_path} (self-contained HTML) and {md_path}")
    out.put(html=str(html_path), markdown=str(md_path))
    out.emit()
    return 0


def cmd_explore(args) -> int:
    """Serve the Streamlit explorer (prints its URL)."""
    from catalog.config.settings import child_env, get_settings

    port = _port(args)
    settings = get_settings()
    if args.database_url:
        settings = settings.model_copy(update={"database_url": args.database_url})
    app = ROOT / "ui" / "app.py"
    shown = "localhost" if args.host in ("127.0.0.1", "localhost") else args.host
    print(f"explorer: http://{shown}:{port} (Ctrl+C stops it)", flush=True)
    with sigterm_exits():
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(app),
                                 "--server.port", str(port), "--server.address", args.host,
                                 "--server.headless", "true", "--browser.gatherUsageStats",
                                 "false", "--server.fileWatcherType", "none"],
                                env=child_env(settings), preexec_fn=_die_with_parent)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return 130
        finally:
            _stop_child(proc)


def _die_with_parent() -> None:
    """In the explorer's process before it starts (Linux): the kernel kills it when this
    command's process dies, however that happens (even SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop_child(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Ask a child to stop (SIGTERM), and kill it if it has not within ``grace`` seconds
    (Streamlit with a browser session attached has been seen to ignore SIGTERM)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cmd_demo(args) -> int:
    # SIGTERM as Ctrl+C: the worker it starts is stopped in catalog_all's finally, the
    # explorer in cmd_explore's
    with sigterm_exits():
        return _demo(args)


def _demo(args) -> int:
    from jobs.demo import DEMO_CONFIG, catalog_all
    from jobs.enqueue import EnqueueError

    t0 = time.perf_counter()
    try:
        out = catalog_all(args.model, science_from(args, DEMO_CONFIG), progress=not args.quiet)
    except (EnqueueError, ValueError) as exc:
        return fail(str(exc))
    print(f"catalog ready in {time.perf_counter() - t0:.0f} s: {out['jobs']} checkpoints, "
          f"{out['layers']} layers, in {psql_url(out['database_url'])}")
    for job_id, step, error in out["failed"]:
        print(f"job {job_id} (step {step}) failed: {error}", file=sys.stderr)
    if args.no_serve:
        return 1 if out["failed"] else 0
    print("the demo's worker has stopped: jobs queued from the explorer's Jobs page run once "
          f"`{ncat_command()} worker` runs (in another terminal)")
    args.database_url = out["database_url"]
    return cmd_explore(args)


def cmd_stop(args) -> int:
    """Stop the embedded servers of NCAT_HOME (started when no DATABASE_URL / REDIS_URL was
    set and nothing answered on the local ports)."""
    from catalog.config.settings import get_settings
    from jobs.broker import stop_embedded_redis
    from schema.database import stop_embedded_in

    home = get_settings().ncat_home
    pg = stop_embedded_in(home / "pgdata")
    rd = stop_embedded_redis(home)
    print(f"embedded PostgreSQL in {home / 'pgdata'}: " + ("stopped" if pg else "not running"))
    print(f"embedded Redis in {home / 'redis'}: " + ("stopped" if rd else "not running"))
    return 0


def _serve_options(s) -> None:
    s.add_argument("--port", type=int, default=None,
                   help="the explorer's port (default: $NCAT_EXPLORER_PORT or 8501)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address the explorer listens on (default 127.0.0.1, this machine "
                        "only; 0.0.0.0 for every interface)")


def add_commands(sub) -> None:
    from jobs.demo import DEMO_CONFIG

    s = sub.add_parser("demo", help="catalog every built-in checkpoint through the queue, "
                                    "then serve the explorer")
    s.add_argument("--model", default="builtin", help="model to catalog (default builtin)")
    s.add_argument("--no-serve", action="store_true", help="stop once the catalog is ready")
    _serve_options(s)
    science_options(s, DEMO_CONFIG)
    s.set_defaults(fn=cmd_demo, database_url=None)

    s = sub.add_parser("stop", help="stop the embedded PostgreSQL and Redis that commands "
                                    "started in NCAT_HOME (their data stays)")
    s.set_defaults(fn=cmd_stop)

    s = sub.add_parser("migrate", help="create or upgrade the catalog's database")
    database_option(s)
    json_option(s)
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("explore", help="serve the Streamlit explorer")
    _serve_options(s)
    database_option(s)
    s.set_defaults(fn=cmd_explore)

    s = sub.add_parser("report", help="an HTML page and a Markdown summary of one checkpoint "
                                      "of a model, beside the heuristics paper's claims")
    s.add_argument("model", help="the model's name in the catalog (e.g. builtin-arith)")
    s.add_argument("--checkpoint", type=int, default=None,
                   help="training step (default: the last one measured)")
    s.add_argument("--out", default="report", help="output folder (default ./report)")
    s.add_argument("--top", type=int, default=20,
                   help="top neurons per layer and operator, by rank (default 20)")
    database_option(s)
    json_option(s)
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("export", help="export a view or read-only query to Parquet or CSV, "
                                      "or a checkpoint's circuit (MIB) or neurons "
                                      "(Neuronpedia)")
    s.add_argument("what", help="a view or table name, or a SELECT query; with --format mib "
                                "or neuronpedia, the model's name in the catalog")
    s.add_argument("--out", required=True,
                   help="output file (.parquet or .csv); a folder for mib and neuronpedia")
    s.add_argument("--format", choices=("parquet", "csv", "mib", "neuronpedia"), default=None,
                   help="parquet or csv (default: from the file name); mib: the paper "
                        "circuit as MIB circuit-track graph files, one per circuit size; "
                        "neuronpedia: labelled and top neurons as Neuronpedia upload batches")
    s.add_argument("--checkpoint", type=int, default=None,
                   help="mib, neuronpedia: training step (default: the last one measured)")
    s.add_argument("--config-id", type=int, default=None,
                   help="mib, neuronpedia: the config (default: the last one written)")
    s.add_argument("--op", default="+", choices=("+", "-", "*", "/"),
                   help="mib: the operator whose circuit is written (default +)")
    s.add_argument("--k", type=int, default=None,
                   help="mib: one circuit size, neurons per pruned layer (default: every "
                        "size measured)")
    s.add_argument("--top", type=int, default=20,
                   help="neuronpedia: neurons ranked in the top TOP of their layer for some "
                        "operator, beside every labelled one (default 20)")
    s.add_argument("--examples", type=int, default=20,
                   help="neuronpedia: top activations per neuron (default 20)")
    database_option(s)
    json_option(s)
    s.set_defaults(fn=cmd_export)
