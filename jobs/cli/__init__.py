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
import difflib
import logging
import sys

from jobs.cli import explaining, measuring, queue, serving
from jobs.cli.common import LOGIN_REFUSED as LOGIN_REFUSED
from jobs.cli.common import UNREACHABLE as UNREACHABLE
from jobs.cli.common import early_refusal, fail, service_error, service_exit_code
from jobs.cli.measuring import print_result

__all__ = ["build_parser", "main", "print_result"]


def version_line() -> str:
    """The installed project's version and the catalog version its configs are hashed
    with (rows measured under another catalog version are another config)."""
    from importlib.metadata import PackageNotFoundError, version

    from catalog.config import CATALOG_VERSION

    try:
        project = version("neuron-catalog")
    except PackageNotFoundError:  # run from a checkout that was never installed
        project = "not installed"
    return f"ncat {project} (catalog {CATALOG_VERSION}, Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ncat", description="The arithmetic neuron catalog.")
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)
    serving.add_commands(sub)
    measuring.add_commands(sub)
    explaining.add_commands(sub)
    queue.add_commands(sub)
    p.set_defaults(commands=sub.choices)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line parsed; an argument the command does not take is refused by that
    command's own parser (its usage, not ncat's list of commands), with the nearest
    option it does take where one is close (``--hii`` -> ``--hi``)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = args.commands.get(args.command, parser)
        command.error(unrecognized(command, extra))
    return args


def unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """'unrecognized arguments: ...', and for each unknown option the one it is close to."""
    options = [s for action in parser._actions for s in action.option_strings]
    hints = []
    for arg in extra:
        if arg.startswith("-") and not arg.lstrip("-").replace(".", "").isdigit():
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, options, n=1, cutoff=0.8)
            hints.append(f"{flag}: did you mean {close[0]}?" if close else
                         f"{parser.prog} has no {flag}")
    return (f"unrecognized arguments: {' '.join(extra)}"
            + (f" ({'; '.join(hints)}; {parser.prog} --help lists the options)"
               if hints else ""))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse(argv)
    refused = early_refusal(args)  # before any command imports the science
    if refused is not None:
        return fail(refused)
    try:
        return args.fn(args)
    except Exception as exc:
        line = service_error(exc, args)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return service_exit_code(exc)
