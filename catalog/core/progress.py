"""Progress for long work, readable on a terminal and in a log.

On a terminal, a tqdm bar. Anywhere else (CI logs, a file, a pipe) a tqdm bar redraws
itself with carriage returns and no newline, so a log shows nothing for minutes and then
one long line: there, ``progress_bar`` prints a plain line at most every
``NCAT_PROGRESS_SECONDS`` (default 30) and at the end, with the count, the elapsed time
and the time left. Both estimate the time left from the average rate since the start
(tqdm's default moving average follows the last few updates, and the built-in model's
first steps, each followed by a checkpoint's evaluation, made its first estimates 100x
too long).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from tqdm.auto import tqdm

INTERVAL_ENV = "NCAT_PROGRESS_SECONDS"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class LineProgress:
    """The tqdm calls the catalog uses (update, set_postfix, set_postfix_str, close, n),
    written as one plain line per interval."""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int = 0,
                 interval: float | None = None, file=None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self._start_n = initial
        self.interval = (float(os.environ.get(INTERVAL_ENV, "30")) if interval is None
                         else interval)
        self.file = file or sys.stderr
        self._start = self._last = time.monotonic()
        self._postfix = ""
        self._closed = False
        self._say()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._say()

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kwargs: Any) -> None:
        items = dict(ordered_dict or {}, **kwargs)
        self._postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self._postfix = s

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        done = self.n - self._start_n
        units = self.unit + ("es" if self.unit.endswith(("s", "x", "ch", "sh")) else "s")
        head = f"{self.desc}: {self.n}"
        if self.total:
            head += f"/{self.total} {units} ({100 * self.n / self.total:.0f}%)"
        else:
            head += f" {units}"
        head += f", {_clock(elapsed)} elapsed"
        if self.total and 0 < done and self.n < self.total:
            head += f", about {_clock(elapsed / done * (self.total - self.n))} left"
        return head + (f" [{self._postfix}]" if self._postfix else "")

    def _say(self) -> None:
        print(self.line(), file=self.file, flush=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._say()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(total: int | None, desc: str, unit: str, enabled: bool = True,
                 initial: int = 0):
    """A tqdm bar on a terminal, plain lines elsewhere, nothing when not ``enabled``."""
    if not enabled:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, smoothing=0)
    return LineProgress(total, desc, unit, initial=initial)
