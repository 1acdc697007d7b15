"""The analysts' SQL console: one read-only statement, bounded in rows, bytes and time.

Layers, each enough on its own for what it guards:

- a lexer (``statements``) that knows quotes, dollar quotes and comments, so ``select ';'``
  is one statement and ``select 1; drop table x`` is two (refused); only statements that
  start with SELECT, WITH, VALUES, TABLE, EXPLAIN or SHOW are sent;
- the ``catalog_reader`` role (SELECT only; migration 0007 takes large objects, advisory
  locks and NOTIFY away from it);
- a fresh connection per statement, in a READ ONLY transaction that has already run a
  query (after that PostgreSQL refuses to make it read-write), always rolled back and
  closed: nothing the statement sets, creates or locks outlives it;
- a statement timeout, kept by a watchdog thread of this process too (``Watchdog``: a
  statement may turn its own timeout off), and a server-side cursor that fetches at most
  ``row_cap + 1`` rows; each row's size is measured on the server (``pg_column_size``),
  a row above ``max_row_bytes`` comes back as NULLs with a note, and fetching stops once
  the rows fetched pass ``max_bytes`` (each row counted at the larger of its size on the
  server and as Python objects here, ``python_bytes``: a float8 array is 8 bytes per
  element there, about 32 decoded): a 1 GB string or 100 million rows never reach this
  process, and the cap bounds its memory;
- repeated column names (``select a.*, b.*``) come back made unique (``x``, ``x_2``).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from dataclasses import dataclass, field

import psycopg
from psycopg import sql as psql

from schema import store
from schema.export import as_reader

log = logging.getLogger(__name__)

ALLOWED = ("select", "with", "values", "table", "explain", "show")
WRAPPABLE = ("select", "with", "values", "table")  # may stand as a subquery in FROM
SIZE_COLUMN = "__ncat_row_bytes"


class ConsoleError(ValueError):
    """A statement that was refused or failed, with a message for the user."""


@dataclass
class ConsoleResult:
    columns: list[str]
    rows: list[tuple]
    capped: bool = False  # more rows than row_cap
    byte_capped: bool = False  # fetching stopped at max_bytes
    oversized: list[int] = field(default_factory=list)  # row numbers shown as NULLs


def python_bytes(value) -> int:
    """Memory of a decoded value as Python objects (containers and what they hold)."""
    if isinstance(value, list | tuple):
        return sys.getsizeof(value) + sum(python_bytes(v) for v in value)
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(python_bytes(k) + python_bytes(v)
                                          for k, v in value.items())
    return sys.getsizeof(value)


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique in order: a repeated ``x`` becomes ``x_2``, ``x_3``."""
    seen: set[str] = set()
    out = []
    for name in names:
        new, k = name, 1
        while new in seen:
            k += 1
            new = f"{name}_{k}"
        seen.add(new)
        out.append(new)
    return out


_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")


def statements(text: str) -> list[str]:
    """Split SQL at top-level semicolons, skipping quoted text and comments; empty
    statements (a trailing ';') are dropped."""
    out, start, i, n = [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            out.append(text[start:i])
            start = i = i + 1
        else:
            i = _skip(text, i, c)
    out.append(text[start:])
    return [s.strip() for s in out if s.strip() and not _only_comments(s)]


def _skip(text: str, i: int, c: str) -> int:
    """Where the token at ``i`` (character ``c``) ends: past a comment, a quoted string or
    identifier, a dollar-quoted body, else the next character."""
    if c == "-" and text.startswith("--", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j + 1
    if c == "/" and text.startswith("/*", i):
        return _past_block_comment(text, i)
    if c in "'\"":
        return _past_quoted(text, i, c)
    if c == "$" and (m := _DOLLAR.match(text, i)) and not _in_word(text, i):
        end = text.find(m.group(0), m.end())
        return len(text) if end < 0 else end + len(m.group(0))
    return i + 1


def _past_block_comment(text: str, i: int) -> int:
    """Past the /* ... */ at ``i``, nested as PostgreSQL allows."""
    depth, i, n = 1, i + 2, len(text)
    while i < n and depth:
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _past_quoted(text: str, i: int, c: str) -> int:
    """Past the string or identifier quoted by ``c`` at ``i`` (doubled quotes inside; a
    backslash escapes in an E'...' string)."""
    i, n = i + 1, len(text)
    while i < n:
        if text[i] == c:
            if i + 1 < n and text[i + 1] == c:  # a doubled quote inside
                i += 2
                continue
            break
        if c == "'" and text[i] == "\\" and _escape_string(text, i):
            i += 1
        i += 1
    return i + 1


def _escape_string(text: str, backslash: int) -> bool:
    """Whether the quote before ``backslash`` opened an E'...' string."""
    q = text.rfind("'", 0, backslash)
    return q > 0 and text[q - 1] in "eE" and not _in_word(text, q - 1)


def _in_word(text: str, i: int) -> bool:
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")


def _only_comments(s: str) -> bool:
    s = re.sub(r"--[^\n]*", "", s)
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    return not s.strip()


def _first_word(stmt: str) -> str:
    s = stmt
    while True:
        s = s.lstrip()
        if s.startswith("--"):
            s = s.split("\n", 1)[1] if "\n" in s else ""
        elif s.startswith("/*"):
            s = s.split("*/", 1)[1] if "*/" in s else ""
        elif s.startswith("("):
            s = s[1:]
        else:
            break
    m = re.match(r"[A-Za-z]+", s)
    return m.group(0).lower() if m else ""


def check(text: str) -> str:
    """The one statement to run, or ConsoleError saying why not."""
    parts = statements(text)
    if not parts:
        raise ConsoleError("Enter a SELECT query.")
    if len(parts) > 1:
        raise ConsoleError(f"One statement at a time: this text holds {len(parts)} statements "
                           "separated by ';'.")
    if _first_word(parts[0]) not in ALLOWED:
        raise ConsoleError("The SQL console is read-only: only SELECT, WITH, EXPLAIN, VALUES, "
                           "TABLE and SHOW are allowed (no INSERT, UPDATE, DELETE or DDL).")
    return parts[0]


def run(url: str, text: str, *, row_cap: int = 1000, timeout_ms: int = 5000,
        max_row_bytes: int = 1 << 20, max_bytes: int = 64 << 20,
        batch: int = 20) -> ConsoleResult:
    """Run one read-only statement as ``catalog_reader`` on the database at ``url``."""
    stmt = check(text)
    wrap = _first_word(stmt) in WRAPPABLE
    try:
        with store.connect(as_reader(url)) as conn:
            conn.read_only = True  # every transaction of this connection: BEGIN READ ONLY
            try:
                with Watchdog(conn, timeout_ms / 1000 + WATCHDOG_GRACE_S) as dog:
                    return _run(conn, stmt, wrap, row_cap, timeout_ms, max_row_bytes,
                                max_bytes, batch, dog)
            finally:
                conn.rollback()
    except psycopg.errors.ReadOnlySqlTransaction:
        raise ConsoleError("The SQL console is read-only: writes are refused.") from None
    except psycopg.errors.FeatureNotSupported as exc:
        if "data-modifying" in str(exc):  # WITH ... INSERT/UPDATE/DELETE, inside our wrapper
            raise ConsoleError("The SQL console is read-only: writes are refused.") from None
        raise ConsoleError(f"PostgreSQL: {exc}".strip()) from None
    except psycopg.errors.ActiveSqlTransaction:  # set transaction_read_only = off
        raise ConsoleError("The SQL console is read-only: its transaction cannot be made "
                           "read-write.") from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise ConsoleError(f"The SQL console is read-only: {exc.diag.message_primary}.") \
            from None
    except (psycopg.errors.QueryCanceled, _OutOfTime):
        raise ConsoleError(f"The query ran longer than {timeout_ms / 1000:g} s and was "
                           "stopped.") from None
    except psycopg.OperationalError as exc:
        if "too many connections for role" in str(exc):  # migration 0028's limit
            raise ConsoleError("Every analysts' connection is in use (the catalog_reader "
                               "role's connection limit, which leaves the rest to the "
                               "workers); try again in a moment.") from None
        raise ConsoleError(f"PostgreSQL: {exc}".strip()) from None
    except psycopg.Error as exc:
        raise ConsoleError(f"PostgreSQL: {exc}".strip()) from None


WATCHDOG_GRACE_S = 1.0  # the watchdog stops a statement this long after its own timeout


class _OutOfTime(Exception):
    """The watchdog's bound passed between two fetches."""


class Watchdog:
    """The statement's time bound, kept by this process whatever the statement sets:
    ``statement_timeout`` bounds each statement, and a query that calls
    ``set_config('statement_timeout', '0', false)`` in its first rows, or a cursor fetched
    in steps each under the limit, escaped it (108 s against 10). Past ``seconds`` a thread
    cancels whatever the connection runs, every 0.2 s until the statement returns, and
    ``check`` (between fetches) raises."""

    def __init__(self, conn: psycopg.Connection, seconds: float) -> None:
        self.conn, self.seconds = conn, seconds
        self.done = threading.Event()
        self.fired = False
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        if self.done.wait(self.seconds):
            return
        self.fired = True
        while not self.done.is_set():
            try:
                self.conn.cancel()
            except psycopg.Error:
                return  # the connection is gone: nothing runs on it
            self.done.wait(0.2)

    def check(self) -> None:
        if self.fired:
            raise _OutOfTime()

    def __enter__(self) -> Watchdog:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def _run(conn: psycopg.Connection, stmt: str, wrap: bool, row_cap: int, timeout_ms: int,
         max_row_bytes: int, max_bytes: int, batch: int,
         dog: Watchdog | None = None) -> ConsoleResult:
    conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(int(timeout_ms)),))
    # a query has run in this transaction: it can no longer be made read-write
    if not wrap:  # EXPLAIN, SHOW: small answers, which cannot stand in a FROM clause
        return _run_plain(conn, stmt, row_cap)
    # the statement's columns (planned, not run), renamed by position so that repeated
    # names stay apart; each row's size is measured on the server, and a row over the limit
    # comes back as NULLs
    probe = conn.execute(psql.SQL("SELECT * FROM ({stmt}\n) AS q LIMIT 0").format(
        stmt=psql.SQL(stmt)))
    names = [d.name for d in probe.description or []]
    if not names:
        return ConsoleResult([], [])
    out = ConsoleResult([], [])
    with conn.cursor(name="ncat_console") as cur:
        cur.execute(_sized_query(stmt, names, row_cap, max_row_bytes))
        assert cur.description is not None
        out.columns = unique_names([d.name for d in cur.description][:-1])
        _fetch(cur, out, row_cap, max_row_bytes, max_bytes, batch, dog)
    return _capped(out, row_cap)


def _run_plain(conn: psycopg.Connection, stmt: str, row_cap: int) -> ConsoleResult:
    """A statement run as it is, its first ``row_cap`` rows (capped: there were more)."""
    cur = conn.execute(stmt)
    cols = unique_names([d.name for d in cur.description] if cur.description else [])
    rows = cur.fetchmany(row_cap + 1)
    return ConsoleResult(cols, rows[:row_cap], capped=len(rows) > row_cap)


def _capped(out: ConsoleResult, row_cap: int) -> ConsoleResult:
    """``out`` cut to ``row_cap`` rows, its oversized rows among them (capped: more)."""
    if len(out.rows) > row_cap:
        out.capped = True
        out.rows = out.rows[:row_cap]
        out.oversized = [i for i in out.oversized if i < row_cap]
    return out


def _sized_query(stmt: str, names: list[str], row_cap: int, max_row_bytes: int):
    """``stmt`` with each row's size on the server beside its columns (renamed by position,
    so that repeated names stay apart); a row over ``max_row_bytes`` comes back as NULLs;
    at most ``row_cap`` + 1 rows."""
    alias = [psql.Identifier(f"c{i}") for i in range(len(names))]
    lim = psql.Literal(int(max_row_bytes))
    return psql.SQL(
        "SELECT {cols}, q.{size} FROM (SELECT q0.*, pg_column_size(q0.*) AS {size} "
        "FROM ({stmt}\n) AS q0({alias})) AS q LIMIT {n}").format(
        cols=psql.SQL(", ").join(
            psql.SQL("CASE WHEN q.{size} <= {lim} THEN q.{a} END AS {name}").format(
                size=psql.Identifier(SIZE_COLUMN), lim=lim, a=a, name=psql.Identifier(name))
            for a, name in zip(alias, names, strict=True)),
        size=psql.Identifier(SIZE_COLUMN), stmt=psql.SQL(stmt),
        alias=psql.SQL(", ").join(alias), n=psql.Literal(int(row_cap) + 1))


def _fetch(cur, out: ConsoleResult, row_cap: int, max_row_bytes: int, max_bytes: int,
           batch: int, dog: Watchdog | None) -> None:
    """Rows of ``cur`` into ``out`` in batches, until ``row_cap`` + 1 rows or
    ``max_bytes`` (each row counted at the larger of its server and Python sizes); rows
    over ``max_row_bytes`` noted in ``out.oversized``."""
    total = 0
    while len(out.rows) <= row_cap and not out.byte_capped:
        if dog is not None:
            dog.check()
        got = cur.fetchmany(batch)  # at most batch * max_row_bytes in memory at once
        if not got:
            return
        for row in got:
            size = row[-1] or 0
            values = tuple(row[:-1])
            if size > max_row_bytes:
                out.oversized.append(len(out.rows))
            else:
                total += max(size, python_bytes(values))
            out.rows.append(values)
            if total > max_bytes:
                out.byte_capped = True
                return


# ------------------------------------------------------------------ overdue readers


READER = "catalog_reader"
READER_GRACE_S = 5.0  # beyond the role's own statement_timeout


def reader_setting_s(conn, name: str, default: str) -> float:
    """One of the analysts' role's time settings in seconds (its role setting, else
    ``default``, a PostgreSQL interval such as '10s')."""
    value = store.scalar(conn.execute(
        "SELECT coalesce((SELECT split_part(c, '=', 2) FROM pg_roles r, unnest(r.rolconfig) c "
        "WHERE r.rolname = %s AND c LIKE %s), %s)", (READER, f"{name}=%", default)))
    return float(store.scalar(conn.execute("SELECT extract(epoch FROM %s::interval)",
                                           (value,))))


def reader_timeout(conn) -> float:
    """The analysts' role's statement_timeout in seconds (its role setting; 10 s if none)."""
    return reader_setting_s(conn, "statement_timeout", "10s")


# what migration 0038 gives the role; a server without the setting is held to it too
READER_IDLE = "10min"  # idle_session_timeout
READER_TRANSACTION = "5min"  # transaction_timeout (PostgreSQL 17+)


GUARD = "ncat_reader_guard"  # schema/reader_guard, loaded by migration 0033


def reader_guard_loaded(conn) -> bool:
    """Whether the analysts' sessions load the reader guard on this server (the role's
    session_preload_libraries names it: migration 0033 names it where it loads)."""
    return bool(store.scalar(conn.execute(
        "SELECT EXISTS (SELECT FROM pg_roles r, unnest(r.rolconfig) c WHERE r.rolname = %s "
        "AND c LIKE 'session_preload_libraries=%%' AND c LIKE %s)", (READER, f"%{GUARD}%"))))


def cancel_overdue_readers(conn, limit_s: float | None = None) -> list[int]:
    """Cancel the analysts' statements in this database that have run longer than the
    role's statement_timeout plus a grace (``limit_s`` instead, where given): a psql
    session may raise its own timeout, which PostgreSQL cannot forbid. Returns the pids."""
    limit = reader_timeout(conn) + READER_GRACE_S if limit_s is None else limit_s
    pids = [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE usename = %s AND state = 'active' "
        "AND datname = current_database() AND pid <> pg_backend_pid() "
        "AND now() - query_start > make_interval(secs => %s)", (READER, limit)).fetchall()]
    for pid in pids:
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        log.warning("reconciler: cancelled a %s statement (pid %s) past %.0f s", READER,
                    pid, limit)
    return pids


@dataclass
class Bounded:
    """What one pass of ``bound_readers`` did (the backends' pids)."""

    cancelled: list[int]  # statements past the statement timeout
    idle: list[int]  # sessions idle past the idle timeout: ended
    long: list[int]  # transactions (a cursor fetched in pieces) past their bound: ended


def bound_readers(conn, *, idle_s: float | None = None,
                  transaction_s: float | None = None) -> Bounded:
    """Hold the analysts' sessions here to the role's bounds, whatever a session set for
    itself (without the reader guard; with it, its statement timeout): statements past
    the statement timeout are cancelled (``cancel_overdue_readers``); sessions idle past the role's
    idle_session_timeout (10 minutes, migration 0038) and transactions open past its
    transaction_timeout (5 minutes: a psql cursor fetched in pieces, each under the
    statement timeout) are ended, each plus a grace (``idle_s`` and ``transaction_s``
    instead, where given). Each worker's reconciler runs it every pass."""
    cancelled = cancel_overdue_readers(conn)
    idle_limit = (reader_setting_s(conn, "idle_session_timeout", READER_IDLE) + READER_GRACE_S
                  if idle_s is None else idle_s)
    long_limit = (reader_setting_s(conn, "transaction_timeout", READER_TRANSACTION)
                  + READER_GRACE_S if transaction_s is None else transaction_s)
    mine = ("usename = %s AND datname = current_database() AND pid <> pg_backend_pid() AND "
            "backend_type = 'client backend'")
    idle = [r[0] for r in conn.execute(
        f"SELECT pid FROM pg_stat_activity WHERE {mine} AND state = 'idle' "
        "AND now() - state_change > make_interval(secs => %s)", (READER, idle_limit))]
    long = [r[0] for r in conn.execute(
        f"SELECT pid FROM pg_stat_activity WHERE {mine} AND xact_start IS NOT NULL "
        "AND now() - xact_start > make_interval(secs => %s)", (READER, long_limit))]
    for pids, what, limit in ((idle, "idle", idle_limit),
                              (long, "with a transaction open", long_limit)):
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            log.warning("reconciler: ended a %s session (pid %s) %s past %.0f s", READER,
                        pid, what, limit)
    return Bounded(cancelled, idle, long)
