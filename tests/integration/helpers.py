"""Constants and helpers shared by the integration tests."""

import shutil
import subprocess
import time
import uuid
from pathlib import Path

from sqlalchemy.engine import make_url

from catalog.config import ScienceConfig
from schema import store

SEED_STEPS = (64, 128, 300)
SEED_CONFIG = ScienceConfig(operand_hi=20, pairs_per_op=20, faithfulness_prompts=40,
                            spectra=True)


def as_role(url: str, role: str) -> str:
    """The same database, as another role (no password: the test servers trust)."""
    return make_url(url).set(username=role, password=None).render_as_string(
        hide_password=False)


def reader_url(url: str) -> str:
    """The same database, as the read-only analysts' role."""
    return as_role(url, "catalog_reader")


def new_database_url(server_url: str) -> str:
    """A URL for a new database on the server (created by whoever connects first)."""
    url = make_url(server_url).set(database=f"ncat_test_{uuid.uuid4().hex[:10]}")
    return url.render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    store.drop_database(url)


def copy_database(template_url: str, url: str) -> None:
    """Create ``url``'s database as a copy of ``template_url``'s (CREATE DATABASE ...
    TEMPLATE: tables, rows and Alembic's revision, not the database-level settings).
    PostgreSQL copies only a template nobody is connected to, so sessions left open on it
    (a pool's idle connections) are ended first."""
    template = make_url(template_url).database
    admin = make_url(template_url).set(database="postgres").render_as_string(
        hide_password=False)
    with store.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", (template,))
        conn.execute(f'CREATE DATABASE "{make_url(url).database}" TEMPLATE "{template}"')


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Until something answers on 127.0.0.1:``port``; AssertionError (with the process's
    output) if ``proc`` exits first or ``timeout`` seconds pass."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else b""
                raise AssertionError(f"{what} exited: {out!r}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not answer in {timeout} s") from None
            time.sleep(0.3)


def wait_until(predicate, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def statuses(url):
    from jobs import enqueue as enq

    return {s.job_id: s for s in enq.job_statuses(url)}


def all_done(url):
    st = statuses(url)
    return bool(st) and all(s.status == "done" for s in st.values())


def count(url, sql, args=()):
    with store.connect(url) as conn:
        return conn.execute(sql, args).fetchone()[0]


def dump(url):
    """Every row of the four neuron tables, in key order (equal dumps: equal catalogs)."""
    with store.connect(url) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY {t}").fetchall()
                for t in ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")}


# the columns that make a catalog's numbers (not ids or times), for comparing two
# databases that were written separately
CHECKSUMS = {
    "neuron_op": "n.layer, n.neuron, n.op, n.max_act, n.mean_act, n.density, n.effect_exact, "
                 "n.effect_attr, n.effect_log, n.rank, n.rank_value, n.best_score, "
                 "n.is_exact, n.constant",
    "neuron_score": "n.layer, n.neuron, n.op, n.heuristic_id, n.score, n.bottom, n.p_value, "
                    "n.implements",
    "neuron_grid": "n.layer, n.neuron, n.op, encode(n.q, 'hex'), n.scale, n.vmin",
    "neuron_lens": "n.layer, n.neuron, n.numbers, n.top_tokens, n.top_values",
}


def checksums(url: str) -> dict:
    """(table, step, config hash) -> (rows, md5 of the rows in key order), plus the
    summaries and layer results."""
    out = {}
    with store.connect(url) as conn:
        for table, cols in CHECKSUMS.items():
            key = "n.layer, n.neuron" + (", n.op" if "n.op" in cols else "")
            if table == "neuron_score":
                cols = cols.replace("n.heuristic_id", "h.key")
                join, key = "JOIN heuristic h ON h.id = n.heuristic_id", key + ", h.key, n.bottom"
            else:
                join = ""
            for step, config, rows, digest in conn.execute(
                    f"SELECT c.step, m.config_hash, count(*), "
                    f"md5(string_agg(row({cols})::text, '|' ORDER BY {key})) FROM {table} n "
                    f"JOIN checkpoint c ON c.id = n.checkpoint_id "
                    f"JOIN measure_config m ON m.id = n.config_id {join} GROUP BY 1, 2"):
                out[(table, step, config)] = (rows, digest)
        for step, config, rows, digest in conn.execute(
                "SELECT c.step, m.config_hash, count(*), md5(string_agg(row(s.accuracy, "
                "s.faithfulness, s.heuristic_knockouts, s.prompt_knockouts, "
                "s.n_heuristic_neurons)::text, '|')) FROM checkpoint_summary s "
                "JOIN checkpoint c ON c.id = s.checkpoint_id "
                "JOIN measure_config m ON m.id = s.config_id GROUP BY 1, 2"):
            out[("checkpoint_summary", step, config)] = (rows, digest)
        for step, config, rows, layers in conn.execute(
                "SELECT c.step, m.config_hash, count(*), array_agg(r.layer ORDER BY r.layer) "
                "FROM layer_result r JOIN checkpoint c ON c.id = r.checkpoint_id "
                "JOIN measure_config m ON m.id = r.config_id GROUP BY 1, 2"):
            out[("layer_result", step, config)] = (rows, layers)
    return out


class Redis:
    """A private redis-server this test may kill and restart empty on the same port."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import redis

        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(data), "--save", "", "--appendonly", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def restart_empty(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder / "data")  # its append-only file too: everything is lost
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# the tests' database on a local Redis: db 0 is where a user's own queue lives
TEST_REDIS_DB = 15


def forget_queue(redis_url: str, queue: str) -> None:
    """Delete what a test's queue left in Redis: its message list, the bindings Celery
    declared for it and its deliveries still unacknowledged."""
    import json

    import redis

    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(match=f"*{queue}*"):
        r.delete(key)
    for tag, held in r.hgetall("unacked").items():
        if json.loads(held)[2] == queue:
            r.hdel("unacked", tag)
            r.zrem("unacked_index", tag)


def migration_module(filename: str):
    """A migration's module from migrations/versions (not a package: loaded by path)."""
    import importlib.util

    path = Path(__file__).parents[2] / "migrations" / "versions" / filename
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CuttableLink:
    """A TCP relay in front of a real PostgreSQL that a test can cut, as a network
    outage or a stopped server would: ``cut()`` closes every connection through it and
    refuses new ones (accepted, then closed at once: the client reads "server closed the
    connection unexpectedly") until ``restore()``. ``url(db_url)``: the same database
    through the relay."""

    def __init__(self, db_url: str) -> None:
        import socket
        import threading

        u = make_url(db_url)
        self.target = (u.host or "localhost", u.port or 5432)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.lock = threading.Lock()
        self.open: list = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db_url: str) -> str:
        return make_url(db_url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            if not self.up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:  # a cut while this connection was being made: it is cut too
                if not self.up.is_set():
                    client.close()
                    upstream.close()
                    continue
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        CuttableLink._hang_up((src, dst))

    @staticmethod
    def _hang_up(sockets) -> None:
        """Shut down, then close: a close() alone sends nothing while the other pump thread
        still waits in recv() on the socket (its call holds the socket open), so the server
        would never learn the connection ended and its session (and its advisory locks)
        would live on."""
        import socket

        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for s in sockets:
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        self.up.clear()
        self.cuts += 1
        with self.lock:
            self._hang_up(self.open)
            self.open = []

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.server.close()
