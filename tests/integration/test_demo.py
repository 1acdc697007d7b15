"""The demo's non-interactive part, end to end on a small configuration."""

import time

import pytest

from catalog.builtin import model_name
from catalog.config import ScienceConfig
from jobs.demo import catalog_all
from schema import store

from tiny_model import TINY


@pytest.mark.serial  # the second run is bounded in seconds
def test_demo_catalogs_every_checkpoint_then_reuses_everything(db, redis_url, tiny_builtin,
                                                               monkeypatch):
    _, root = tiny_builtin
    monkeypatch.setenv("DATABASE_URL", db)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    monkeypatch.setenv("NCAT_QUEUE", f"demo-test-{time.time_ns()}")
    config = ScienceConfig(operand_hi=12, pairs_per_op=8, faithfulness_prompts=20)
    out = catalog_all(model_name(TINY), config, progress=False)
    steps = TINY.checkpoint_steps()
    assert out["jobs"] == len(steps) and out["failed"] == []
    assert out["layers"] == len(steps) * TINY.n_layers
    with store.connect(db) as conn:
        def one(sql):
            return conn.execute(sql).fetchone()[0]

        assert [r[0] for r in conn.execute("SELECT step FROM checkpoint ORDER BY step")] == steps
        assert one("SELECT count(*) FROM neuron_op") == len(steps) * TINY.n_layers * TINY.d_mlp * 4
        assert one("SELECT count(*) FROM checkpoint_summary") == len(steps)
        assert one("SELECT count(*) FROM heuristic") > 100
        assert one("SELECT count(DISTINCT step) FROM checkpoint_overlap") == len(steps)
        assert one("SELECT max(share) FROM checkpoint_overlap") == 1
        assert one("SELECT count(*) FROM heuristic_census") > 0
        assert one("SELECT count(*) FROM heuristic_emergence") > 0
        # issue 78: a result label and the comparison stored beside it never disagree
        assert one("SELECT count(*) FROM map_explanation") > 0
        assert one("SELECT count(*) FROM map_explanation WHERE result_label "
                   "AND best_explanation = 'rival'") == 0
    t0 = time.perf_counter()
    again = catalog_all(model_name(TINY), config, progress=False)
    assert again["jobs"] == len(steps) and time.perf_counter() - t0 < 15
    # `ncat demo --no-serve` (documented): the same catalog, found done; the command
    # returns 0 once it is ready and never starts the explorer
    from jobs.cli import main, serving

    def no_explorer(args):
        raise AssertionError("--no-serve started the explorer")

    monkeypatch.setattr(serving, "cmd_explore", no_explorer)
    t0 = time.perf_counter()
    assert main(["demo", "--model", model_name(TINY), "--no-serve", "--quiet", "--hi", "12",
                 "--pairs", "8", "--faithfulness-prompts", "20"]) == 0
    assert time.perf_counter() - t0 < 15  # everything was done: nothing computed again
    with store.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone()[0] == len(steps)
    # Issue 32.1: SIGTERM to the demo (after a browser visit) stops everything it started
    _sigterm_stops_the_demo_and_its_explorer(db, redis_url, root)


def _sigterm_stops_the_demo_and_its_explorer(db, redis_url, root) -> None:
    """`ncat demo` serving the catalog it found done, visited by Chromium, then SIGTERM to
    the demo's process: within 10 s no process it started is left and nothing listens on
    the explorer's port (its explorer used to be left running, re-parented to PID 1)."""
    import os
    import socket
    import subprocess
    import sys

    import psutil
    from playwright.sync_api import sync_playwright
    from test_browser import ROOT, launch

    from helpers import free_port, wait_for_port

    port = free_port()
    env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": redis_url,
           "NCAT_HOME": str(root.parent), "NCAT_QUEUE": f"demo-stop-{time.time_ns()}"}
    demo = subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "demo", "--model", model_name(TINY), "--quiet",
         "--hi", "12", "--pairs", "8", "--faithfulness-prompts", "20", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    started: list[psutil.Process] = []
    try:
        wait_for_port(port, demo, 120, "the demo's explorer")
        with sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/overview", wait_until="networkidle")
            page.get_by_text("Overview").first.wait_for(timeout=60_000)
            started = psutil.Process(demo.pid).children(recursive=True)
            assert started, "the demo started no explorer process"
            demo.send_signal(15)  # SIGTERM, with the browser session still open
            gone, alive = psutil.wait_procs([psutil.Process(demo.pid), *started], timeout=10)
            browser.close()
        assert alive == [], [(p.pid, p.name()) for p in alive]
        # psutil reaped the demo, so its exit status is psutil's to tell: 128 + SIGTERM
        assert [p.returncode for p in gone if p.pid == demo.pid] == [128 + 15], \
            demo.stdout.read().decode()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the explorer's port still answers"
    finally:
        for p in [*started]:
            if p.is_running():
                p.kill()
        if demo.poll() is None:
            demo.kill()
