"""Every shell command that README.md and docs/queries.md show, run for real and in the
order a reader meets them, in one environment: a fresh database on the test server, the
test Redis with a queue of its own, and the offline hub cache, which holds a small
stand-in for EleutherAI/pythia-70m at the README's 15 steps.

Each documented line has a runner in RUNNERS; a line without one fails the first test,
so a new command in the docs needs a check before it lands. Lines run through bash as
written, with four exceptions, each for a reason:
- the explorer's port comes from NCAT_EXPLORER_PORT (a free port; 8501 may be taken);
- psql gets this test's database in its URL and reads its query from stdin;
- the Pythia lines run with `--hi 30` instead of `--hi 300`: the [0, 300) grid has
  about 230,000 prompts, which takes one to two minutes per checkpoint on 2 CPU cores
  even for the small stand-in, and the lines name 15 checkpoints;
- `bash scripts/test.sh` is not run: it is this test suite (.ci/run calls it, see
  tests/unit/test_readme.py).

The demo trains the default built-in model unless the tests' NCAT_HOME holds it (a folder
of the checkout, tests/conftest.py; about 6 minutes on 2 cores, once per checkout:
tests/unit/test_builtin.py uses the same cache), then catalogs its 14 checkpoints
through the queue (a few minutes).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pandas as pd
import pytest
import redis
from sqlalchemy.engine import make_url

from catalog import builtin
from catalog.config.settings import Settings
from schema import store

from helpers import drop_database, forget_queue, new_database_url, reader_url
from offline_models import write_pythia_cache
from shell_docs import ROOT, documented_lines

pytestmark = pytest.mark.slow

PYTHIA_70M = "EleutherAI/pythia-70m"
PYTHIA_70M_STEPS = list(range(1000, 143001, 10000))  # the README's 1000:143000:10000
STAND_IN = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64)
PYTHIA_HI = ("--hi 300", "--hi 30")  # see the module docstring
DEMO_STEPS = builtin.TrainConfig().checkpoint_steps()
BUILTIN = builtin.model_name(builtin.TrainConfig())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _test_home(work: Path) -> Path:
    """NCAT_HOME for the commands: a folder of this test (the demo's worker log, embedded
    servers' data and fetched files land there), whose trained built-in model is the test
    session's cached one (a link: training it takes minutes, and a cache keyed by its
    training config is the same model wherever it lives)."""
    from catalog.config.settings import get_settings

    home = work / "ncat-home"
    home.mkdir(parents=True, exist_ok=True)
    shared = get_settings().builtin_root
    shared.mkdir(parents=True, exist_ok=True)
    link = home / "builtin"
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return home


class Env:
    """The shared environment, and the processes started in it (stopped at the end)."""

    def __init__(self, url: str, redis_url: str, work: Path):
        self.url = url
        self.redis_url = redis_url
        self.queue = f"readme-{uuid.uuid4().hex[:8]}"
        self.work = work
        self.vars = dict(os.environ, DATABASE_URL=url, REDIS_URL=redis_url, NCAT_QUEUE=self.queue,
                         NCAT_FIT_CACHE_BYTES=str(Settings.model_fields[
                             "ncat_fit_cache_bytes"].default),  # a user's default
                         PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                         NCAT_HOME=str(_test_home(work)))
        self.procs: list[subprocess.Popen] = []
        self.worker: Served | None = None
        self.outputs: dict[str, str] = {}

    def run(self, line: str, timeout: float = 900, stdin: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", line], cwd=cwd or self.work, env=self.vars,
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        self.outputs[line] = done.stdout + done.stderr
        return done

    def start(self, line: str, cwd: Path | None = None, port: int | None = None) -> Served:
        env = dict(self.vars)
        if port is not None:
            env["NCAT_EXPLORER_PORT"] = str(port)
        proc = subprocess.Popen(["bash", "-c", line], cwd=cwd or self.work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        return Served(proc)

    def rows(self, sql: str, args=()) -> list[tuple]:
        with store.connect(self.url) as conn:
            return conn.execute(sql, args).fetchall()

    def one(self, sql: str, args=()):
        return self.rows(sql, args)[0][0]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


class Served:
    """A long-running command whose merged output is collected by a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the reader finish
                raise AssertionError(f"exited with {self.proc.returncode} before printing "
                                     f"{pattern!r}:\n{self.text[-4000:]}")
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} after {timeout} s:\n{self.text[-4000:]}")

    def stop(self) -> int:
        os.killpg(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(30)


def healthy(port: int, timeout: float = 60) -> str:
    """The Streamlit server's health answer and its page, once it is up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2) as r:
                health = r.read().decode()
            with urllib.request.urlopen(f"http://localhost:{port}/", timeout=2) as r:
                assert r.status == 200 and b"<noscript>" in r.read()
            return health
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def env(pg_server, redis_url, tmp_path_factory):
    hub = Path(os.environ["HF_HUB_CACHE"])
    write_pythia_cache(hub, PYTHIA_70M_STEPS, repo=PYTHIA_70M, shape=STAND_IN)
    url = new_database_url(pg_server)  # the demo creates and migrates it
    e = Env(url, redis_url, tmp_path_factory.mktemp("readme-cwd"))
    yield e
    e.stop_all()
    forget_queue(redis_url, e.queue)
    drop_database(url)


def layer_writes(env: Env) -> list[tuple]:
    return env.rows("SELECT checkpoint_id, config_id, layer, written_at FROM layer_result "
                    "ORDER BY 1, 2, 3")


# ---------------------------------------------------------------- the runners, in doc order


def demo(env: Env, line: str) -> None:
    port = _free_port()
    served = env.start(line, cwd=ROOT, port=port)
    # a guard against a hang, not a bound on time: the demo catalogs 14 checkpoints through
    # the queue on one math thread beside the suite's other process (1,555 s on
    # 2026-12-01's machine; on 2026-12-02's, slower in float work, 36 of 42 steps at 29 min)
    m = served.wait_for(r"catalog ready in (\d+) s: (\d+) checkpoints, (\d+) layers", 3600)
    assert (int(m[2]), int(m[3])) == (len(DEMO_STEPS), 2 * len(DEMO_STEPS)), served.text
    # it said which services it found before any work (issue 32.2), passwords hidden
    assert re.search(r"demo: catalog database postgresql\S*; job broker redis://",
                     served.text), served.text[:2000]
    assert served.text.index("demo: catalog database") < served.text.index("catalog ready")
    served.wait_for(rf"explorer: http://localhost:{port}", 60)
    assert healthy(port) == "ok"
    assert served.stop() in (0, -signal.SIGTERM, 143)
    n = env.one("SELECT count(*) FROM neuron_op o JOIN model m ON m.id = o.model_id "
                "WHERE m.name = %s", (BUILTIN,))
    assert n == len(DEMO_STEPS) * 2 * 512 * 4
    assert [r[0] for r in env.rows("SELECT step FROM checkpoint ORDER BY step")] == DEMO_STEPS
    assert env.one("SELECT count(*) FROM checkpoint_summary") == len(DEMO_STEPS)
    assert env.one("SELECT count(DISTINCT step) FROM checkpoint_overlap") == len(DEMO_STEPS)
    assert env.one("SELECT count(*) FROM heuristic_census") > 0
    assert "failed:" not in served.text, served.text[-4000:]
    # (these were tests/integration/test_demo.py's, on a tiny model's demo of its own)
    assert env.one("SELECT max(share) FROM checkpoint_overlap") == 1
    assert env.one("SELECT count(*) FROM heuristic") > 100
    assert env.one("SELECT count(*) FROM heuristic_emergence") > 0
    # issue 78: a result label and the comparison stored beside it never disagree
    assert env.one("SELECT count(*) FROM map_explanation") > 0
    assert env.one("SELECT count(*) FROM map_explanation WHERE result_label "
                   "AND best_explanation = 'rival'") == 0

    # A second run reuses everything: no job, no layer is computed again, and it serves;
    # SIGTERM to it after a browser's visit stops everything it started (issue 32.1)
    before, jobs = layer_writes(env), env.one("SELECT count(*) FROM job")
    port = _free_port()
    again = env.start(line, cwd=ROOT, port=port)
    again.wait_for(rf"explorer: http://localhost:{port}", 300)
    assert healthy(port) == "ok"
    _sigterm_after_a_visit(again.proc, port)
    assert layer_writes(env) == before and env.one("SELECT count(*) FROM job") == jobs
    assert "cataloging checkpoints" in again.text  # the progress bar, already full
    # `ncat demo --no-serve` (documented) finds the same catalog done and returns 0 once it
    # is ready, never starting the explorer
    done = env.run("ncat demo --no-serve --quiet", cwd=ROOT, timeout=600)
    assert done.returncode == 0, env.outputs["ncat demo --no-serve --quiet"]
    assert "explorer:" not in done.stdout + done.stderr
    assert layer_writes(env) == before and env.one("SELECT count(*) FROM job") == jobs


def _sigterm_after_a_visit(proc: subprocess.Popen, port: int) -> None:
    """SIGTERM to the demo's own process (not its group), its explorer visited by Chromium
    with the session still open: within 10 s no process it started is left and nothing
    listens on the explorer's port (its explorer used to be left running, re-parented to
    PID 1)."""
    import psutil
    from playwright.sync_api import sync_playwright
    from test_browser import launch

    started: list[psutil.Process] = []
    try:
        with sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/overview", wait_until="networkidle")
            page.get_by_text("Overview").first.wait_for(timeout=60_000)
            started = psutil.Process(proc.pid).children(recursive=True)
            assert started, "the demo started no explorer process"
            proc.send_signal(signal.SIGTERM)
            gone, alive = psutil.wait_procs([psutil.Process(proc.pid), *started], timeout=10)
            browser.close()
        assert alive == [], [(p.pid, p.name()) for p in alive]
        # psutil reaped the demo, so its exit status is psutil's to tell: 128 + SIGTERM
        assert [p.returncode for p in gone if p.pid == proc.pid] == [128 + signal.SIGTERM]
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "the explorer's port still answers"
    finally:
        for p in started:
            if p.is_running():
                p.kill()


def migrate(env: Env, line: str) -> None:
    done = env.run(line)
    assert done.returncode == 0 and "migrated to head" in done.stdout, done.stderr


def catalog_builtin(env: Env, line: str) -> None:
    before = layer_writes(env)
    done = env.run(line)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("already in the catalog") == len(DEMO_STEPS), done.stdout
    assert layer_writes(env) == before


def catalog_pythia(env: Env, line: str) -> None:
    done = env.run(line.replace(*PYTHIA_HI), timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    got = env.rows("SELECT c.step, c.revision, count(lr.layer), count(DISTINCT s.config_id) "
                   "FROM checkpoint c JOIN model m ON m.id = c.model_id "
                   "JOIN layer_result lr ON lr.checkpoint_id = c.id "
                   "LEFT JOIN checkpoint_summary s ON s.checkpoint_id = c.id "
                   "WHERE m.name = %s GROUP BY 1, 2 ORDER BY 1", (PYTHIA_70M,))
    assert got == [(s, f"step{s}", 2, 1) for s in PYTHIA_70M_STEPS]
    assert env.one("SELECT operand_hi FROM measure_config c JOIN checkpoint_summary s ON "
                   "s.config_id = c.id JOIN checkpoint k ON k.id = s.checkpoint_id JOIN model m "
                   "ON m.id = k.model_id WHERE m.name = %s LIMIT 1", (PYTHIA_70M,)) == 30
    assert env.one("SELECT count(DISTINCT weights_hash) FROM checkpoint c JOIN model m ON "
                   "m.id = c.model_id WHERE m.name = %s", (PYTHIA_70M,)) == 15


def export(env: Env, line: str) -> None:
    args = shlex.split(line)
    out = env.work / args[args.index("--out") + 1]
    out.unlink(missing_ok=True)
    done = env.run(line)
    assert done.returncode == 0, done.stderr
    what = args[2]
    sql = what if what.upper().startswith("SELECT") else f"SELECT * FROM {what}"
    expected = env.one(f"SELECT count(*) FROM ({sql}) q")
    frame = pd.read_parquet(out) if out.suffix == ".parquet" else pd.read_csv(out)
    assert len(frame) == expected > 0
    assert f"{expected} rows written" in done.stdout


def psql(env: Env, line: str) -> None:
    documented = shlex.split(line)[1]
    assert make_url(documented).username == "catalog_reader"
    url = make_url(reader_url(env.url)).set(drivername="postgresql")
    ours = line.replace(documented, url.render_as_string(hide_password=False))
    done = env.run(ours, stdin="SELECT count(*) FROM neuron_evolution;\n")
    assert done.returncode == 0, done.stderr
    assert str(env.one("SELECT count(*) FROM neuron_evolution")) in done.stdout
    refused = env.run(ours, stdin="\\set ON_ERROR_STOP on\nDELETE FROM model;\n")
    assert refused.returncode != 0
    assert re.search(r"read-only transaction|permission denied", refused.stderr), refused.stderr
    assert env.one("SELECT count(*) FROM model") == 2


def explain(env: Env, line: str) -> None:
    """docs/explain.md's example, on the demo's catalog: the labels come from it. The
    answer line says what the model does, read here from a plain forward of the prompt as
    the catalog writes it (the top token and the answer's probability): whether the
    trained model gets 21+17 right is its own business (near a tie on some machines:
    '34' at p 0.482 against '38' at 0.445 on one)."""
    import torch

    from catalog import ScienceConfig, load_model
    from catalog.explain.prompt import build

    done = env.run(line)
    assert done.returncode == 0, done.stderr
    lm = load_model("builtin")
    p = build(lm.model, lm.tokenizer, "21+17=", ScienceConfig(operand_hi=100))
    with torch.no_grad():
        logits = lm.model(torch.as_tensor(p.tokens, dtype=torch.long)[None])[0, -1]
    top = lm.tokenizer.decode([int(logits.argmax())])
    prob = float(logits.double().softmax(-1)[p.answer])
    rank = int((logits > logits[p.answer]).sum()) + 1
    verdict = "correct" if top == "38" else "wrong"
    want = (f"answer 38: the model writes {top!r} ({verdict}); the answer's first token "
            f"'38': p = {prob:.3f}, rank {rank} (1 = top)")
    assert want in done.stdout, (want, done.stdout)
    # no flag given: the demo's config, the one the catalog holds, with its labels
    assert re.search(r"labels of \d+ neurons from the catalog; config [0-9a-f]{12} \(id \d+\)",
                     done.stdout), done.stdout
    assert "T (the answer's logit minus the competing numbers' mean)" in done.stdout


def worker(env: Env, line: str) -> None:
    served = env.start(line)
    served.wait_for(r"ready\.|celery@\S+ ready", 120)
    env.worker = served


def enqueue_builtin(env: Env, line: str) -> None:
    done = env.run(line)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("exists already") == len(DEMO_STEPS), done.stdout
    assert redis.Redis.from_url(env.redis_url).llen(env.queue) == 0


def enqueue_pythia(env: Env, line: str) -> None:
    jobs = env.one("SELECT count(*) FROM job")
    done = env.run(line.replace(*PYTHIA_HI))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("already in the catalog, nothing queued") == 15, done.stdout
    assert env.one("SELECT count(*) FROM job WHERE status = 'done'") == jobs + 15
    assert redis.Redis.from_url(env.redis_url).llen(env.queue) == 0


def status(env: Env, line: str) -> None:
    done = env.run(line, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(" done") == len(DEMO_STEPS) + 15, done.stdout


def cancel(env: Env, line: str) -> None:
    done = env.run(line)
    assert done.returncode == 2
    assert "job 3 is done; only queued or running jobs can be cancelled" in done.stderr


def retry(env: Env, line: str) -> None:
    done = env.run(line)
    assert done.returncode == 2
    assert "job 3 is done; only failed or cancelled jobs can be retried" in done.stderr


def explore(env: Env, line: str) -> None:
    port = _free_port()
    served = env.start(line, port=port)
    served.wait_for(rf"explorer: http://localhost:{port}", 60)
    assert healthy(port) == "ok"
    try:
        _readme_picture(env, port)
    finally:
        served.stop()
    # the worker started above is still serving its queue, then shuts down warmly
    assert env.worker.proc.poll() is None, env.worker.text[-2000:]
    assert env.worker.stop() == 0, env.worker.text[-2000:]


def _readme_picture(env: Env, port: int) -> None:
    """The README's picture: the neuron page as a reader who ran the demo sees it (the
    default built-in model at its last step, the top neuron of its last layer on +),
    opened by its stable link. NCAT_UPDATE_DOCS=1 copies it to docs/neuron-page.png."""
    import shutil
    from urllib.parse import urlencode

    from playwright.sync_api import sync_playwright
    from test_browser import ARTIFACTS, chart_titles, launch

    # the README's other commands catalog other models (Pythia's steps run further)
    step = env.one("SELECT max(c.step) FROM checkpoint c JOIN model m ON m.id = c.model_id "
                   "WHERE m.name = %s", (BUILTIN,))
    layer, neuron = env.rows(
        "SELECT o.layer, o.neuron FROM neuron_op o JOIN checkpoint c ON c.id = o.checkpoint_id "
        "JOIN model m ON m.id = o.model_id WHERE m.name = %s AND c.step = %s AND o.op = '+' "
        "AND o.rank = 0 ORDER BY o.layer DESC LIMIT 1", (BUILTIN, step))[0]
    query = urlencode({"model": BUILTIN, "step": step, "layer": layer, "neuron": neuron,
                       "op": "+"})
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "neuron-page-demo.png"
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(f"http://127.0.0.1:{port}/neuron?{query}", wait_until="networkidle")
        page.get_by_text(f"Layer {layer}, neuron {neuron}").wait_for(timeout=60_000)
        chart_titles(page, ["K map, +", "K map, -"])
        page.evaluate("document.querySelector(\"[data-testid='stMain']\").scrollTo(0, 0)")
        page.wait_for_timeout(500)
        page.screenshot(path=str(shot))
        browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("NCAT_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "neuron-page.png")


RUNNERS = {  # in the order a reader meets them (shell_docs.documented_lines)
    "bash scripts/demo.sh": demo,
    "bash scripts/test.sh": None,  # this suite; .ci/run calls it (tests/unit/test_readme.py)
    "ncat migrate": migrate,
    "ncat catalog EleutherAI/pythia-70m --checkpoints 1000:143000:10000 --hi 300": catalog_pythia,
    'psql "postgresql://catalog_reader@localhost:5432/ncat"': psql,
    "ncat catalog builtin --checkpoints all --hi 100": catalog_builtin,
    "ncat export neuron_evolution --out evolution.parquet": export,
    "ncat worker": worker,
    "ncat enqueue builtin --checkpoints all --hi 100": enqueue_builtin,
    "ncat enqueue EleutherAI/pythia-70m --checkpoints 1000:143000:10000 --hi 300 --device cuda":
        enqueue_pythia,
    "ncat status --watch": status,
    "ncat cancel 3": cancel,
    "ncat retry 3": retry,
    "ncat explore": explore,
    "ncat export \"SELECT * FROM heuristic_census WHERE op = '+'\" --out census.csv": export,
    'ncat explain builtin "21+17="': explain,
}


def test_every_documented_line_has_a_runner():
    assert documented_lines() == list(RUNNERS)


@pytest.mark.parametrize("line", [line for line, fn in RUNNERS.items() if fn is not None])
def test_documented_line(env, line):
    RUNNERS[line](env, line)
