"""Jobs heal themselves: two real workers, a private Redis, PostgreSQL, and in turn a pool
child killed mid-layer, a pool child killed during the summary, a worker's parent
killed, a worker's database backend terminated, Redis restarted empty, and both workers
killed (parents and pool children) during a checkpoint's summary, two new ones started in
their place. After each,
with no manual command, every job reaches 'done' within a bound, and in the end the
stored rows equal a clean run's (checksums per checkpoint and config), with no
duplicate and no partial layer.

The workers are real ``ncat worker`` processes started through tests/integration/chaos/
chaos_worker.py, which only adds pauses (and marks who is working) so that each failure
lands at a known moment. The reconciler's timings are short here (stale after 4 s,
a pass every second); the broker's visibility timeout is an hour, so no recovery below
comes from Redis re-delivering on its own.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from catalog.builtin import model_name
from catalog.config import ScienceConfig
from catalog.sources import load_model
from jobs import enqueue as enq
from jobs.store_results import catalog_checkpoint
from schema import store
from schema.engine import migrate

from helpers import CuttableLink, Redis, checksums, drop_database, new_database_url, statuses
from tiny_model import TINY

# Not serial: the bounds below guard against a job that never heals, and the timings
# that matter are the reconciler's (a heartbeat every 0.5 s, stale after 4 s), which a
# busy machine does not come near; the test command starts this file first beside the
# other tests (tests/conftest.py), where its waits overlap their work. Alone on 2 idle
# cores the six recoveries took 8.5-27.9 s (2026-12-07).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHAOS = Path(__file__).resolve().parent / "chaos" / "chaos_worker.py"
RECOVERY_BOUND = 180  # seconds from the failure to every job done (a guard, see above)
STALE = 4.0

# one config per failure, so each failure has jobs of its own (and a clean reference)
CONFIGS = {name: ScienceConfig(operand_hi=12, pairs_per_op=pairs, faithfulness_prompts=30)
           for name, pairs in (("child mid-layer", 6), ("child in summary", 7),
                               ("worker parent", 8), ("database backend", 9),
                               ("redis restarted empty", 10),
                               ("both workers in summary", 11))}
STEPS = {"redis restarted empty": "64,128,300"}  # more messages than workers: some wait


@pytest.fixture
def chaos(db, tiny_builtin, tmp_path, monkeypatch):  # noqa: C901
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is missing: scripts/setup.sh installs it")
    _, root = tiny_builtin
    broker = Redis(tmp_path / "redis")
    broker.start()
    marks = tmp_path / "marks"
    marks.touch()
    env = {
        "DATABASE_URL": db, "REDIS_URL": broker.url, "NCAT_QUEUE": f"chaos-{uuid.uuid4().hex[:8]}",
        "NCAT_HOME": str(root.parent), "NCAT_VISIBILITY_TIMEOUT": "3600",
        "NCAT_HEARTBEAT_SECONDS": "0.5", "NCAT_STALE_SECONDS": str(STALE),
        "NCAT_RECONCILE_SECONDS": "1", "NCAT_BUSY_RETRY_SECONDS": "1",
        "CHAOS_MARKS": str(marks), "CHAOS_LAYER_SLEEP": "3", "CHAOS_SUMMARY_SLEEP": "3",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(enq, "_APP", None)
    workers: dict[str, subprocess.Popen] = {}

    class Chaos:
        url = db

        def start_worker(self, label: str) -> subprocess.Popen:
            log = open(tmp_path / f"worker-{label}.log", "w")
            proc = subprocess.Popen(
                [sys.executable, str(CHAOS), "--loglevel", "info",
                 "--hostname", f"{label}@{env['NCAT_QUEUE']}"],
                cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
            workers[label] = proc
            return proc

        def running(self) -> list[str]:
            return [label for label, proc in workers.items() if proc.poll() is None]

        def kill_worker(self, label: str) -> None:
            """SIGKILL a worker's parent and its pool children (its process group)."""
            proc = workers[label]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

        def marks(self) -> list[list[str]]:
            return [line.split() for line in marks.read_text().splitlines()]

        def wait_for_mark(self, kind: str, after: int, timeout: float = 120) -> list[str]:
            """The first mark of ``kind`` ('layer' or 'summary') after the first ``after``."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                found = [m for m in self.marks()[after:] if m[0] == kind]
                if found:
                    return found[0]
                time.sleep(0.05)
            raise AssertionError(f"no {kind} started within {timeout} s")

        def logs(self) -> str:
            return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                             for p in tmp_path.glob("worker-*.log"))

        broker_ = broker

    yield Chaos()
    for proc in workers.values():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    broker.stop()


def _wait_all_done(url: str, t0: float, what: str, logs) -> float:
    deadline = t0 + RECOVERY_BOUND
    while time.monotonic() < deadline:
        st = statuses(url)
        if st and all(s.status == "done" for s in st.values()):
            return time.monotonic() - t0
        bad = [s for s in st.values() if s.status in ("failed", "cancelled")]
        assert not bad, (what, bad, logs())
        time.sleep(0.2)
    raise AssertionError(f"{what}: jobs not done {RECOVERY_BOUND} s after the failure: "
                         f"{statuses(url)}\n{logs()}")


def _backend_holding_a_layer(url: str, job_ids: list[int]) -> int:
    from jobs.locks import layer_lock_key

    keys = [layer_lock_key(j, layer) for j in job_ids for layer in range(TINY.n_layers)]
    with store.connect(url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = ANY(%s)", (keys,)).fetchone()
    assert row, "no worker holds a layer lock"
    return row[0]


def test_every_job_finishes_after_each_failure_with_rows_equal_to_a_clean_run(
        chaos, pg_server, tiny_builtin, capsys):
    cfg, root = tiny_builtin
    chaos.start_worker("w1")
    chaos.start_worker("w2")
    recovery: dict[str, float] = {}
    name = model_name(TINY)

    def enqueue(what: str) -> list[int]:
        return [j.job_id for j in enq.enqueue(chaos.url, name, STEPS.get(what, "300"),
                                              CONFIGS[what])]

    # 1. a pool child SIGKILLed while it computes a layer
    seen = len(chaos.marks())
    enqueue("child mid-layer")
    mark = chaos.wait_for_mark("layer", seen)
    os.kill(int(mark[-1]), signal.SIGKILL)
    t0 = time.monotonic()
    recovery["child mid-layer"] = _wait_all_done(chaos.url, t0, "child mid-layer", chaos.logs)

    # 2. a pool child SIGKILLed during the job's final step (summary)
    seen = len(chaos.marks())
    enqueue("child in summary")
    mark = chaos.wait_for_mark("summary", seen)
    os.kill(int(mark[-1]), signal.SIGKILL)
    t0 = time.monotonic()
    recovery["child in summary"] = _wait_all_done(chaos.url, t0, "child in summary",
                                                  chaos.logs)

    # 3. a worker's parent process SIGKILLed while its child computes a layer
    seen = len(chaos.marks())
    enqueue("worker parent")
    mark = chaos.wait_for_mark("layer", seen)
    parent = psutil.Process(int(mark[-1])).ppid()
    os.kill(parent, signal.SIGKILL)
    t0 = time.monotonic()
    recovery["worker parent"] = _wait_all_done(chaos.url, t0, "worker parent", chaos.logs)
    chaos.start_worker("w3")  # back to two workers for what follows

    # 4. the database backend of a worker holding a layer terminated
    seen = len(chaos.marks())
    jobs = enqueue("database backend")
    chaos.wait_for_mark("layer", seen)
    with store.connect(chaos.url, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)",
                            (_backend_holding_a_layer(chaos.url, jobs),)).fetchone()[0]
    t0 = time.monotonic()
    recovery["database backend"] = _wait_all_done(chaos.url, t0, "database backend",
                                                  chaos.logs)

    # 5. Redis restarted empty while messages wait in it
    seen = len(chaos.marks())
    enqueue("redis restarted empty")
    chaos.wait_for_mark("layer", seen)
    chaos.broker_.restart_empty()
    t0 = time.monotonic()
    recovery["redis restarted empty"] = _wait_all_done(chaos.url, t0, "redis restarted empty",
                                                       chaos.logs)

    # 6. both workers killed, parents and children, during a checkpoint's summary; two
    # new workers are started (what a supervisor does) and nothing else
    seen = len(chaos.marks())
    enqueue("both workers in summary")
    chaos.wait_for_mark("summary", seen)
    for label in chaos.running():
        chaos.kill_worker(label)
    chaos.start_worker("w4")
    chaos.start_worker("w5")
    t0 = time.monotonic()
    recovery["both workers in summary"] = _wait_all_done(chaos.url, t0,
                                                         "both workers in summary", chaos.logs)

    with capsys.disabled():
        print("\nrecovery (failure -> every job done): " + ", ".join(
            f"{k} {v:.1f} s" for k, v in recovery.items()))

    # what the reconciler did is on record, and ncat status shows it
    with store.connect(chaos.url) as conn:
        actions = {r[0] for r in conn.execute("SELECT action FROM reconcile_event")}
    assert "resent" in actions, actions

    # the rows equal a clean run's: same checkpoints and configs, computed directly
    clean = new_database_url(pg_server)
    migrate(clean)
    try:
        for what, config in CONFIGS.items():
            for step in (int(s) for s in STEPS.get(what, "300").split(",")):
                lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
                catalog_checkpoint(clean, lm, config)
        want, got = checksums(clean), checksums(chaos.url)
    finally:
        drop_database(clean)
    assert want.keys() == got.keys()
    n_items = sum(len(STEPS.get(w, "300").split(",")) for w in CONFIGS)
    assert sum(k[0] == "layer_result" for k in want) == n_items
    for key in want:
        if key[0] == "layer_result":  # every layer once: no partial, no duplicate layer
            assert got[key] == (TINY.n_layers, list(range(TINY.n_layers))), key
        assert got[key] == want[key], key


def test_a_layer_whose_process_dies_every_time_fails_its_job_and_retry_finishes_it(
        chaos, tmp_path, monkeypatch):
    """A poison layer: its pool process is SIGKILLed on every start. Celery delivers the
    task again each time; it used to loop for ever (12 kills, 13 starts, never failed).
    Now the NCAT_MAX_ATTEMPTS-th loss fails the layer and its job with the cause, a job
    on the same workers finishes, and `ncat retry` after the fault is gone finishes it."""
    poison = tmp_path / "poison"
    poison.write_text("300 1")
    monkeypatch.setenv("CHAOS_POISON", str(poison))
    monkeypatch.setenv("NCAT_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("CHAOS_LAYER_SLEEP", "0")
    monkeypatch.setenv("NCAT_STALE_SECONDS", "600")  # Celery's redelivery alone, here
    chaos.start_worker("w1")
    chaos.start_worker("w2")
    config = ScienceConfig(operand_hi=12, pairs_per_op=5, faithfulness_prompts=20)
    name = model_name(TINY)
    bad = enq.enqueue(chaos.url, name, "300", config)[0].job_id
    good = enq.enqueue(chaos.url, name, "128", config)[0].job_id
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        st = statuses(chaos.url)
        if st[bad].status == "failed" and st[good].status == "done":
            break
        assert st[bad].status != "done" and st[good].status not in ("failed", "cancelled"), \
            (st, chaos.logs())
        time.sleep(0.5)
    else:
        raise AssertionError(f"no verdict in 300 s: {statuses(chaos.url)}\n{chaos.logs()}")
    st = statuses(chaos.url)[bad]
    assert st.failed_layer == 1
    assert "layer 1 was lost 3 times while running (process died 3 times)" in st.error, \
        st.error
    assert "died without an error" in st.error and "ncat retry" in st.error
    kills = [m for m in chaos.marks() if m[0] == "poison"]
    assert len(kills) == 3  # it ran (and died) NCAT_MAX_ATTEMPTS times, then no more
    with store.connect(chaos.url) as conn:
        assert conn.execute("SELECT status FROM job_layer WHERE job_id = %s AND layer = 1",
                            (bad,)).fetchone()[0] == "failed"
    # the fault removed, `ncat retry` finishes it, with rows for every layer
    poison.unlink()
    from jobs.cli import main

    assert main(["retry", str(bad)]) == 0
    t0 = time.monotonic()
    while statuses(chaos.url)[bad].status != "done":
        assert time.monotonic() - t0 < 180, (statuses(chaos.url), chaos.logs())
        time.sleep(0.5)
    with store.connect(chaos.url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM layer_result r JOIN checkpoint c ON c.id = r.checkpoint_id "
            "WHERE c.step = 300").fetchone()[0] == TINY.n_layers


def test_a_layer_whose_database_goes_away_each_time_fails_naming_the_database(
        chaos, monkeypatch, tmp_path):
    """The worker reaches PostgreSQL through a link the test cuts while a layer computes,
    and keeps cut until the worker has tried to record the loss: the database is gone
    when the loss happens, three times. The layer fails after NCAT_MAX_ATTEMPTS with
    "database unreachable 3 times", not as a process that died (its process never did:
    the loss rides on the task sent again, and the next delivery counts it)."""
    monkeypatch.setenv("NCAT_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("NCAT_STALE_SECONDS", "600")  # no reconciler verdict in between
    link = CuttableLink(chaos.url)
    monkeypatch.setenv("DATABASE_URL", link.url(chaos.url))
    try:
        chaos.start_worker("w1")
        config = ScienceConfig(operand_hi=12, pairs_per_op=5, faithfulness_prompts=20)
        job = enq.enqueue(chaos.url, model_name(TINY), "300", config, layers=[1])[0].job_id
        for lost in range(1, 4):
            _wait_for_starts(chaos, lost, tmp_path)
            link.cut()  # while the layer sleeps before computing: its writes will fail
            t0 = time.monotonic()
            while (tmp_path / "worker-w1.log").read_text().count(
                    "database still unreachable") < lost:
                assert time.monotonic() - t0 < 60, chaos.logs()
                time.sleep(0.2)
            link.restore()
        t0 = time.monotonic()
        while statuses(chaos.url)[job].status != "failed":
            assert time.monotonic() - t0 < 120, (statuses(chaos.url), chaos.logs())
            time.sleep(0.5)
    finally:
        link.close()
    st = statuses(chaos.url)[job]
    assert st.failed_layer == 1
    assert "layer 1 was lost 3 times while running (database unreachable 3 times)" in \
        st.error, st.error
    assert "died without an error" not in st.error
    assert "could not be reached to record it" in st.error
    assert len([m for m in chaos.marks() if m[0] == "layer"]) == 3  # three starts, no more


def _wait_for_starts(chaos, n: int, tmp_path, timeout: float = 120) -> None:
    """Until the layer has been started ``n`` times (its marks), or fail with who holds
    the catalog's advisory locks."""
    t0 = time.monotonic()
    while len([m for m in chaos.marks() if m[0] == "layer"]) < n:
        if time.monotonic() - t0 > timeout:
            with store.connect(chaos.url) as conn:
                holders = conn.execute(
                    "SELECT l.pid, a.datname, a.client_port, a.state, a.backend_start, "
                    "a.state_change, a.query FROM pg_locks l JOIN pg_stat_activity a "
                    "USING (pid) WHERE l.locktype = 'advisory'").fetchall()
            log = (tmp_path / "worker-w1.log").read_text().splitlines()
            said = [line for line in log if "jobs." in line and ": busy" not in line]
            raise AssertionError(f"start {n} never came; lock holders {holders}; "
                                 f"marks {chaos.marks()}; the worker said\n"
                                 + "\n".join(said[-40:]))
        time.sleep(0.1)
