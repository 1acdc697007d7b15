"""SIGTERM as Ctrl+C for the commands that start things they must stop: the serving
commands (the demo's worker, the explorer) and `ncat plan` (its calibration's scratch
databases)."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigterm_exits():
    """While inside, SIGTERM ends this command like Ctrl+C does: as an exception in the
    main thread, so that ``finally`` blocks stop what the command started (the demo's
    worker, the explorer). Python's default for SIGTERM ends the process at once and
    leaves its children running. The previous handler comes back on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)
