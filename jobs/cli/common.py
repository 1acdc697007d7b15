"""What several commands share: measurement flags generated from the configs, the
database URL, and turning bad input into one-line errors with exit code 2."""

from __future__ import annotations

import argparse
import sys

from catalog.config import ExecutionConfig, ScienceConfig
from catalog.config_fields import add_arguments, from_args

DB_HELP = "database URL (default: DATABASE_URL, a local server, or an embedded one)"
BAD_INPUT = 2  # exit code of every command for input it refuses
# exit code when job rows are committed but the broker failed while their messages went out
QUEUED_NOT_SENT = 4


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


def execution_options(s: argparse.ArgumentParser, device_only: bool = False) -> None:
    if device_only:
        s.add_argument("--device", default=None,
                       help="torch device the workers run this job on (default cpu)")
        return
    add_arguments(s, ExecutionConfig)


def science_from(args, base: ScienceConfig | None = None) -> ScienceConfig:
    return from_args(ScienceConfig, args, base)


def execution_from(args) -> ExecutionConfig:
    return from_args(ExecutionConfig, args)


def database_url(args) -> str:
    from schema.database import resolve_database_url, with_driver

    return with_driver(args.database_url) if args.database_url else resolve_database_url()


def database_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--database-url", default=None, help=DB_HELP)
