"""Jobs through a real Redis, a real PostgreSQL and real Celery worker processes."""

import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from catalog.config import ScienceConfig
from catalog.run.measurement import measure
from catalog.sources import load_model
from jobs import enqueue as enq
from schema import reads, store

from helpers import all_done, count, dump, statuses, wait_until
from tiny_model import TINY

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ScienceConfig(operand_hi=12, pairs_per_op=8, faithfulness_prompts=20)


def test_end_to_end_equals_direct_measure(queue, tiny_builtin):
    cfg, root = tiny_builtin
    jobs = enq.enqueue(queue.url, queue.name, "128,300", CONFIG)
    assert [j.created for j in jobs] == [True, True]
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="both jobs done")
    with store.connect(queue.url) as conn:
        # whichever summary ran first, step 128 has the final (step 300) circuit when both
        # jobs are done: in its own summary, or filled in after step 300's
        assert conn.execute(
            "SELECT c.step, f.step, count(*) FROM final_circuit_point p JOIN checkpoint c "
            "ON c.id = p.checkpoint_id JOIN checkpoint f ON f.id = p.final_checkpoint_id "
            "WHERE p.circuit = 'ranked' AND p.metric = 'nl' GROUP BY 1, 2").fetchall() == [
            (128, 300, len(CONFIG.operators) * len(
                {r[0] for r in conn.execute("SELECT k FROM circuit_point WHERE protocol = "
                                            "'paper' AND circuit = 'ranked'")}))]
        for step in (128, 300):
            lm = load_model("builtin", step, builtin_config=cfg, cache_root=root)
            direct = measure(lm.model, lm.tokenizer, CONFIG, progress=False)
            ck = conn.execute("SELECT id FROM checkpoint WHERE step = %s", (step,)).fetchone()[0]
            for layer, lr in direct.layers.items():
                rows = conn.execute(
                    "SELECT neuron, op, effect_exact, effect_attr FROM neuron_op "
                    "WHERE checkpoint_id = %s AND layer = %s", (ck, layer)).fetchall()
                assert len(rows) == lm.model.cfg.d_mlp * 4
                for neuron, op, exact, attr in rows:
                    o = CONFIG.operators.index(op)
                    for got, want in ((exact, lr.effect_exact[neuron, o]),
                                      (attr, lr.effect_attr[neuron, o])):
                        # REAL columns hold float32 exactly: compare at that precision
                        assert (got is None and np.isnan(want)) or np.float32(got) == want
                scores = conn.execute(
                    "SELECT s.neuron, s.op, h.key, s.score FROM neuron_score s JOIN heuristic h "
                    "ON h.id = s.heuristic_id WHERE s.checkpoint_id = %s AND s.layer = %s",
                    (ck, layer)).fetchall()
                m = lr.matches
                want = {(int(n), CONFIG.operators[o], m.heuristics[h].key, float(s))
                        for n, o, h, s in zip(m.neuron, m.op, m.heuristic, m.score, strict=True)}
                assert {(n, op, k, np.float32(s)) for n, op, k, s in scores} == {
                    (n, op, k, np.float32(s)) for n, op, k, s in want}
                ids = conn.execute("SELECT model_id, config_id FROM neuron_op "
                                   "WHERE checkpoint_id = %s LIMIT 1", (ck,)).fetchone()
                grid = reads.read_grid_values(conn, model_id=ids[0], checkpoint_id=ck,
                                              config_id=ids[1], layer=layer, neuron=7, op="*")
                exact_grid = direct.table.to_grid(
                    lr.acts[direct.table.op_index("*"), 7], "*")
                span = np.nanmax(exact_grid) - np.nanmin(exact_grid)
                assert np.nanmax(np.abs(grid - exact_grid)) <= span / 510 + 1e-6
            summary = conn.execute("SELECT accuracy FROM checkpoint_summary "
                                   "WHERE checkpoint_id = %s", (ck,)).fetchone()[0]
            assert summary["+"] == pytest.approx(direct.summary.accuracy["+"])
        workers = conn.execute("SELECT DISTINCT worker FROM job_layer").fetchall()
        assert all(w[0].startswith("w@") for w in workers)


def _filled(log: str) -> list[list[int]]:
    """The steps each "final circuit measured at steps [...]" line of a worker log names."""
    return [sorted(int(x) for x in m.split(",") if x.strip())
            for m in re.findall(r"final circuit measured at steps \[([^\]]*)\]", log)]


def test_one_request_queues_the_latest_checkpoint_first(queue, monkeypatch):
    """``enqueue`` sends the latest checkpoint's layers first, then the other jobs' first
    layers, then their second (the jobs come back in the order asked for): one worker
    summarizes step 300 first, and 256 and 128 each measure the final circuit in their
    own summaries, so nothing is loaded again afterwards. A process that computed a layer
    of 256 or 128 goes on with that job's other layer (layer affinity), so each of them
    is prepared once; 300's two layers run side by side. Visibility timeout 10 minutes:
    the affinity stops at half of it (the fixture's 3 s would stop it at once)."""
    monkeypatch.setenv("NCAT_VISIBILITY_TIMEOUT", "600")
    sent: list[tuple[int, int]] = []
    broker = enq._broker_send(queue.url)

    def send(job_id: int, layer: int) -> None:  # the broker's, watched
        sent.append((job_id, layer))
        broker(job_id, layer)
    jobs = enq.enqueue(queue.url, queue.name, "128,256,300", CONFIG, send=send)
    assert [j.step for j in jobs] == [128, 256, 300]
    layers = list(range(TINY.n_layers))
    latest, *rest = jobs[::-1]
    assert sent == [(latest.job_id, x) for x in layers] + [
        (j.job_id, x) for x in layers for j in rest]
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="the three jobs done")
    log = queue.worker_log()
    assert _filled(log) == [], log[-3000:]
    prepared = re.findall(r"job \d+: \S+ step (\d+) prepared in process", log)
    assert sorted(prepared.count(s) for s in ("128", "256")) == [1, 1], prepared
    for j in rest:  # its other layers taken on by the process that prepared it
        assert len(re.findall(rf"job {j.job_id} layer [1-9]\d*: computed \(taken on",
                              log)) == TINY.n_layers - 1, log[-3000:]
    with store.connect(queue.url) as conn:
        assert conn.execute(
            "SELECT DISTINCT c.step, f.step FROM final_circuit_point p JOIN checkpoint c "
            "ON c.id = p.checkpoint_id JOIN checkpoint f ON f.id = p.final_checkpoint_id "
            "ORDER BY 1").fetchall() == [(128, 300), (256, 300)]


def test_checkpoints_queued_in_training_order_fill_the_final_circuit_once(queue):
    """One worker, three checkpoints queued oldest first (three requests): each summary
    comes before the later checkpoints' circuits exist, so only the last one measures the
    final circuit at the earlier ones, each of them once (after every summary, the latest
    so far was taken as final and every earlier checkpoint measured again: step 128 twice
    here, 91 times a checkpoint for the demo's 14 before it was queued latest first)."""
    for step in ("128", "256", "300"):
        enq.enqueue(queue.url, queue.name, step, CONFIG)
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="the three jobs done")
    log = queue.worker_log()
    assert _filled(log) == [[128, 256]], log[-3000:]
    assert len(re.findall(r"a later checkpoint of \S+ is still to measure", log)) == 2
    with store.connect(queue.url) as conn:
        assert conn.execute(
            "SELECT DISTINCT c.step, f.step FROM final_circuit_point p JOIN checkpoint c "
            "ON c.id = p.checkpoint_id JOIN checkpoint f ON f.id = p.final_checkpoint_id "
            "ORDER BY 1").fetchall() == [(128, 300), (256, 300)]


def test_crash_mid_job_then_a_new_worker_completes_it(queue):
    config = ScienceConfig(operand_hi=20, pairs_per_op=20, faithfulness_prompts=30)
    (job,) = enq.enqueue(queue.url, queue.name, "300", config)
    worker = queue.start_worker("first")
    wait_until(lambda: count(queue.url, "SELECT count(*) FROM job_layer WHERE status = "
                                        "'running'") > 0, what="a layer to start")
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    # no partial layer: every layer has all of its rows or none
    d_mlp = TINY.d_mlp
    with store.connect(queue.url) as conn:
        for layer, n in conn.execute("SELECT layer, count(*) FROM neuron_op GROUP BY layer"):
            assert n == d_mlp * 4, (layer, n)
    assert statuses(queue.url)[job.job_id].status != "done"
    t0 = time.monotonic()
    queue.start_worker("second")
    wait_until(lambda: all_done(queue.url), timeout=180, what="the job to finish after a crash")
    # the killed worker's task comes back within the broker's sweep (every 10 s, each a
    # scan of Redis: jobs.celery_app) after its 3 s visibility timeout; with kombu's default
    # of a scan every 10th sweep it took 97 s in one run of the suite
    took = time.monotonic() - t0
    assert took < 75, f"the job finished {took:.0f} s after the second worker started"
    assert count(queue.url, "SELECT count(*) FROM neuron_op") == TINY.n_layers * d_mlp * 4
    assert count(queue.url, "SELECT count(*) FROM layer_result") == TINY.n_layers
    assert count(queue.url, "SELECT count(*) FROM (SELECT DISTINCT * FROM neuron_score) s") \
        == count(queue.url, "SELECT count(*) FROM neuron_score")
    assert count(queue.url, "SELECT count(*) FROM checkpoint_summary") == 1


def test_two_workers_compute_each_layer_once(queue):
    jobs = enq.enqueue(queue.url, queue.name, "64,128,256,300", CONFIG)
    queue.start_worker("a")
    queue.start_worker("b")
    wait_until(lambda: all_done(queue.url), timeout=180, what="four jobs done")
    with store.connect(queue.url) as conn:
        attempts = conn.execute("SELECT attempts, count(*) FROM job_layer GROUP BY attempts"
                                ).fetchall()
        workers = {r[0] for r in conn.execute("SELECT worker FROM job_layer").fetchall()}
    assert attempts == [(1, len(jobs) * TINY.n_layers)]
    assert len(workers) == 2  # both took part
    assert count(queue.url, "SELECT count(*) FROM layer_result") == len(jobs) * TINY.n_layers


def test_same_work_twice_is_one_job_and_force_gives_identical_rows(queue):
    first = enq.enqueue(queue.url, queue.name, "300", CONFIG)
    again = enq.enqueue(queue.url, "builtin-arith@" + TINY.key(), [300], CONFIG)
    assert again[0].job_id == first[0].job_id and not again[0].created
    assert count(queue.url, "SELECT count(*) FROM job") == 1
    assert queue.queued_messages() == TINY.n_layers  # the second call queued nothing
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="the job")
    before = dump(queue.url)
    forced = enq.enqueue(queue.url, queue.name, "300", CONFIG, force=True)
    assert forced[0].job_id == first[0].job_id
    wait_until(lambda: all_done(queue.url), what="the forced run")
    assert count(queue.url, "SELECT min(attempts) FROM job_layer") == 2
    assert dump(queue.url) == before


def test_work_already_in_the_catalog_is_not_computed_again(queue, capsys):
    """`ncat catalog` twice computes once; `ncat enqueue` of stored work queues nothing,
    but a layer set the catalog does not fully hold is queued."""
    args = ["--checkpoints", "128,300", "--hi", "12", "--pairs", "8", "--quiet",
            "--database-url", queue.url]
    from jobs.cli import main

    assert main(["catalog", queue.name, "--layers", "0"] + args) == 0
    written = "SELECT count(*), max(written_at) FROM layer_result"
    before = count(queue.url, written.replace("count(*), ", ""))
    assert main(["catalog", queue.name, "--layers", "0"] + args) == 0
    out = capsys.readouterr().out
    assert out.count("already in the catalog") == 2, out
    assert count(queue.url, written.replace("count(*), ", "")) == before
    assert count(queue.url, "SELECT count(*) FROM layer_result") == 2

    config = ScienceConfig(operand_hi=12, pairs_per_op=8)
    jobs = enq.enqueue(queue.url, queue.name, "128,300", config, layers=[0])
    assert [(j.created, j.stored) for j in jobs] == [(True, True), (True, True)]
    assert all(s.status == "done" and s.layers_done == 1 for s in statuses(queue.url).values())
    assert queue.queued_messages() == 0
    # all layers: layer 1 is missing, so the job is queued
    whole = enq.enqueue(queue.url, queue.name, "300", config)
    assert (whole[0].created, whole[0].stored) == (True, False)
    assert queue.queued_messages() == TINY.n_layers
    # --force recomputes even what is stored
    forced = enq.enqueue(queue.url, queue.name, "128", config, layers=[1, 0], force=True)
    assert (forced[0].created, forced[0].stored) == (True, False)
    assert queue.queued_messages() == TINY.n_layers + 2


def test_a_worker_over_its_activation_budget_holds_one_layer_grid_at_a_time(queue, monkeypatch):
    """With prompts x layers x d_mlp over NCAT_ACTIVATION_BUDGET, each layer's grid pass
    runs on its own and is dropped once the layer is stored; the rows are the same."""
    from jobs import runner

    monkeypatch.setenv("NCAT_ACTIVATION_BUDGET", "1")
    monkeypatch.setattr(runner, "_CURRENT", None)  # this process's cached run
    job = enq.enqueue(queue.url, queue.name, "300", CONFIG, send=lambda *a: None)[0]
    for layer in range(TINY.n_layers):
        runner.process_layer(queue.url, job.job_id, layer, "in-process")
        assert runner._CURRENT.run.held_layers == [], layer
    assert all_done(queue.url)
    with_budget = dump(queue.url)
    cfg_rows = count(queue.url, "SELECT count(*) FROM neuron_op")
    assert cfg_rows == TINY.n_layers * TINY.d_mlp * 4

    monkeypatch.setenv("NCAT_ACTIVATION_BUDGET", str(2 * 1024**3))
    monkeypatch.setattr(runner, "_CURRENT", None)
    forced = enq.enqueue(queue.url, queue.name, "300", CONFIG, force=True, send=lambda *a: None)
    for layer in range(TINY.n_layers):
        runner.process_layer(queue.url, forced[0].job_id, layer, "in-process")
    assert runner._CURRENT.run.held_layers == list(range(TINY.n_layers))  # all kept
    assert dump(queue.url) == with_budget


def test_a_worker_refuses_a_job_over_its_memory_budget_before_loading(queue, monkeypatch):
    """The worker's own budget decides (the enqueuing machine may be another): a job whose
    estimate is over NCAT_MEMORY_BUDGET fails with the need and the budget in its error,
    its model never loaded; under a budget that fits, the same job runs."""
    import catalog.sources
    from jobs import runner
    from schema import jobs as jobdb

    monkeypatch.setattr(runner, "_CURRENT", None)
    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "64M")
    # the process goes on with the job's other layers up to half the visibility timeout
    # (the fixture's 3 s would leave that to the machine's speed)
    monkeypatch.setenv("NCAT_VISIBILITY_TIMEOUT", "600")
    loads = []
    real_load = catalog.sources.load_model
    monkeypatch.setattr(catalog.sources, "load_model",
                        lambda *a, **k: loads.append(a) or real_load(*a, **k))
    job = enq.enqueue(queue.url, queue.name, "300", CONFIG, send=lambda *a: None)[0]
    assert runner.process_layer(queue.url, job.job_id, 0, "in-process") == \
        runner.Outcome.FAILED
    assert loads == []
    with store.connect(queue.url) as conn:
        row = jobdb.load_job(conn, job.job_id)
        error = conn.execute("SELECT error FROM job WHERE id = %s", (job.job_id,)).fetchone()[0]
    assert row.status == "failed"
    assert re.search(r"MemoryBudgetError: job \d+ .* needs about [0-9.]+ GiB of host memory "
                     r"at its peak, over the budget of 0\.06 GiB \(NCAT_MEMORY_BUDGET\); "
                     r"nothing was loaded", error), error
    assert count(queue.url, "SELECT count(*) FROM neuron_op") == 0

    monkeypatch.setenv("NCAT_MEMORY_BUDGET", "16G")
    again = enq.enqueue(queue.url, queue.name, "300", CONFIG, force=True,
                        send=lambda *a: None)[0]
    assert runner.process_layer(queue.url, again.job_id, 0, "in-process") == \
        runner.Outcome.COMPUTED
    assert len(loads) == 1 and all_done(queue.url)  # the other layers came with it
    for layer in range(1, TINY.n_layers):  # (layer affinity): their deliveries find it done
        assert runner.process_layer(queue.url, again.job_id, layer, "in-process") == \
            runner.Outcome.SKIPPED


BAD = [
    (dict(model="no-such-model"), "unknown model 'no-such-model'"),
    (dict(model=""), "model name is empty"),
    (dict(checkpoints="999"), "step 999 not found"),
    (dict(checkpoints="1:0:1"), "is empty"),
    (dict(checkpoints="a,b"), "checkpoints must be 'all'"),
    (dict(checkpoints="-5"), "must be >= 0"),
    (dict(layers=[]), "layer set is empty"),
    (dict(layers=[0, 7]), r"layers \[7\] do not exist"),
    (dict(config=ScienceConfig(operand_hi=1200)), "single-token limit 999"),
    (dict(model="./nowhere/model"), "does not exist"),
    (dict(model="/tmp/x.gguf"), "does not exist"),
    (dict(model="gpt2", checkpoints="100"), "has no training checkpoints"),
]


@pytest.mark.parametrize("request_, message", BAD)
def test_bad_requests_are_refused_with_nothing_queued(queue, request_, message):
    args = {"model": queue.name, "checkpoints": "300", "config": CONFIG, "layers": None,
            **request_}
    with pytest.raises(enq.EnqueueError, match=message):
        enq.enqueue(queue.url, args["model"], args["checkpoints"], args["config"],
                    layers=args["layers"])
    assert count(queue.url, "SELECT count(*) FROM job") == 0
    assert count(queue.url, "SELECT count(*) FROM measure_config") == 0
    assert queue.queued_messages() == 0


def test_unknown_operator_is_refused_by_the_command_line(queue, capsys):
    from jobs.cli import main

    assert main(["enqueue", queue.name, "--ops", "+%", "--database-url", queue.url]) == 2
    assert "unknown operator(s) '%'" in capsys.readouterr().err
    assert main(["enqueue", "nothing-here", "--database-url", queue.url]) == 2
    assert "unknown model 'nothing-here'" in capsys.readouterr().err
    assert count(queue.url, "SELECT count(*) FROM job") == 0


def test_broken_checkpoint_fails_its_job_and_the_next_job_completes(queue, tiny_builtin,
                                                                     tmp_path, monkeypatch):
    _, root = tiny_builtin
    home = tmp_path / "home"
    shutil.copytree(root, home / "builtin")
    (home / "builtin" / TINY.key() / "step64.pt").write_bytes(b"truncated")
    monkeypatch.setenv("NCAT_HOME", str(home))  # the enqueuing side and the worker read it
    broken, good = (enq.enqueue(queue.url, queue.name, step, CONFIG)[0] for step in ("64", "128"))
    queue.start_worker()
    wait_until(lambda: statuses(queue.url)[good.job_id].status == "done", what="the good job")
    st = statuses(queue.url)[broken.job_id]
    assert st.status == "failed"
    assert "step64.pt cannot be read" in st.error and st.failed_layer in (0, 1)


def test_cancel_and_retry(queue):
    (job,) = enq.enqueue(queue.url, queue.name, "300", CONFIG)
    assert enq.cancel(queue.url, job.job_id) == "cancelled"
    with pytest.raises(enq.EnqueueError, match="only queued or running jobs"):
        enq.cancel(queue.url, job.job_id)
    assert queue.queued_messages() == TINY.n_layers
    queue.start_worker()
    # the worker takes every message, skips the cancelled layers and acknowledges them
    wait_until(lambda: queue.queued_messages() == 0 and queue.unacked_messages() == 0,
               what="the worker to consume and acknowledge the cancelled job's messages")
    assert count(queue.url, "SELECT count(*) FROM layer_result") == 0
    assert statuses(queue.url)[job.job_id].status == "cancelled"
    assert enq.retry(queue.url, job.job_id) == list(range(TINY.n_layers))
    wait_until(lambda: all_done(queue.url), what="the retried job")
    with pytest.raises(enq.EnqueueError, match="there is no job 999"):
        enq.retry(queue.url, 999)


def test_status_command_shows_progress(queue, capsys):
    from jobs.cli import main

    enq.enqueue(queue.url, queue.name, "300", CONFIG)
    assert main(["status", "--database-url", queue.url]) == 0
    out = capsys.readouterr().out
    assert f"{queue.name} step 300" in out and "0/2" in out and "queued" in out



def test_a_layer_locked_by_another_session_is_tried_again_not_dropped(queue, monkeypatch):
    """A delivery that finds its layer's lock taken used to be acknowledged as 'busy' and
    dropped, leaving the job queued forever. It is now sent again until the lock frees."""
    from jobs import runner

    monkeypatch.setenv("NCAT_BUSY_RETRY_SECONDS", "1")
    (job,) = enq.enqueue(queue.url, queue.name, "300", CONFIG, layers=[0])
    with store.connect(queue.url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (runner.layer_lock_key(job.job_id, 0),))
        holder.execute("SELECT pg_advisory_lock(%s, %s)", (job.job_id, 0))  # an analyst's pair
        queue.start_worker()
        wait_until(lambda: queue.worker_log().count("Retry in") >= 2, timeout=180,
                   what="the worker to meet the lock and send the layer again, twice")
        st = statuses(queue.url)[job.job_id]
        assert st.status == "queued" and st.layers_done == 0
        # the layer's own lock freed; the analyst still holds (job, layer), which is not it
        holder.execute("SELECT pg_advisory_unlock(%s)", (runner.layer_lock_key(job.job_id, 0),))
        wait_until(lambda: all_done(queue.url), what="the layer once its lock was released")
    assert count(queue.url, "SELECT count(*) FROM layer_result") == 1


def test_retry_finishes_jobs_whose_messages_were_lost_or_whose_summary_died(queue):
    """Jobs the database says are queued but the broker lost, and jobs left in
    'summarizing' by a worker killed during the final step, used to be refused by retry."""
    (job,) = enq.enqueue(queue.url, queue.name, "300", CONFIG, send=lambda *a: None)
    assert queue.queued_messages() == 0  # the broker lost every message
    assert enq.retry(queue.url, job.job_id) == list(range(TINY.n_layers))
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="the job whose messages were lost")
    with store.connect(queue.url, autocommit=True) as conn:  # a worker died in the summary
        conn.execute("UPDATE job SET status = 'summarizing', finished_at = NULL WHERE id = %s",
                     (job.job_id,))
        conn.execute("DELETE FROM checkpoint_summary")
    assert enq.retry(queue.url, job.job_id) == []  # every layer is stored: only the summary
    wait_until(lambda: all_done(queue.url)
               and count(queue.url, "SELECT count(*) FROM checkpoint_summary") == 1,
               what="the summary of the stuck job")
    with pytest.raises(enq.EnqueueError, match=f"job {job.job_id} is done"):
        enq.retry(queue.url, job.job_id)


def test_full_grid_requests_are_checked_and_a_full_grid_is_asked_for_once(queue, capsys):
    """--full-grid names what is wrong (format, layer not stored, neurons the layer lacks)
    and queues nothing then; a valid request queues one message, the same request again
    none, and grids that are full already make a job that is done at once."""
    from jobs.cli import main

    base = ["enqueue", queue.name, "--checkpoints", "300", "--hi", "40", "--ops", "+",
            "--pairs", "8", "--patching", "attribution", "--full-grids", "top:3",
            "--database-url", queue.url]
    for flag, message in (("1", "--full-grid takes LAYER:NEURON"),
                          ("1:", "--full-grid takes LAYER:NEURON"),
                          ("1:4", "layer 1 of .* is not stored under this config")):
        assert main(base + ["--full-grid", flag]) == 2
        assert re.search(message, capsys.readouterr().err)
    assert count(queue.url, "SELECT count(*) FROM job") == 0
    assert main(["catalog", *base[1:], "--layers", "1", "--quiet"]) == 0
    assert main(base + ["--full-grid", "1:4,64"]) == 2
    assert "neurons [64] have no grids in layer 1" in capsys.readouterr().err
    assert count(queue.url, "SELECT count(*) FROM job") == 0
    with store.connect(queue.url) as conn:
        sketch, full = (conn.execute(
            "SELECT neuron FROM neuron_grid WHERE layer = 1 AND sketch = %s ORDER BY neuron "
            "LIMIT 1", (s,)).fetchone()[0] for s in (True, False))
    assert main(base + ["--full-grid", f"1:{sketch}"]) == 0
    assert "queued" in capsys.readouterr().out
    assert queue.queued_messages() == 1
    assert main(base + ["--full-grid", f"1:{sketch}"]) == 0
    assert "queued already" in capsys.readouterr().out
    assert queue.queued_messages() == 1
    assert main(base + ["--full-grid", f"1:{full}"]) == 0
    assert "already full, nothing queued" in capsys.readouterr().out
    assert queue.queued_messages() == 1
    assert count(queue.url, "SELECT count(*) FROM job WHERE status = 'done'") == 1


def test_prompts_longer_than_the_model_reads_are_refused_before_anything_is_written(
        queue, capsys):
    """The built-in model reads 8 positions: one solved example makes its prompts 11 tokens.
    measure, catalog and enqueue used to fail with an IndexError deep in a forward pass
    (catalog after writing model, checkpoint and config rows; enqueue not at all, leaving
    the worker to fail the job). Each now exits 2 naming the length, n_ctx and the shots,
    and the database holds no row of any kind."""
    from jobs.cli import main

    for command in (["measure", queue.name, "--checkpoint", "300"],
                    ["catalog", queue.name, "--checkpoints", "300"],
                    ["enqueue", queue.name, "--checkpoints", "300"],
                    ["plan", queue.name, "--checkpoints", "300"]):
        argv = command + ["--shots", "1", "--hi", "10", "--database-url", queue.url]
        if command[0] == "measure":
            argv = argv[:-2] + ["--quiet"]
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        assert "the longest prompt is 11 tokens" in err and "at most 8 positions" in err, err
        assert "1 solved example(s) (--shots)" in err
    for table in ("model", "checkpoint", "measure_config", "job", "job_layer"):
        assert count(queue.url, f"SELECT count(*) FROM {table}") == 0, table


def test_enqueue_writes_nothing_when_the_broker_is_closed(queue, monkeypatch, capsys):
    """A closed REDIS_URL used to exit 3 with the job rows written anyway."""
    from jobs.cli import main

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    monkeypatch.setattr(enq, "_APP", None)
    assert main(["enqueue", queue.name, "--checkpoints", "300", "--hi", "10",
                 "--database-url", queue.url]) == 3
    assert "cannot reach the job broker at redis://127.0.0.1:1/0" in capsys.readouterr().err
    for table in ("job", "job_layer", "measure_config"):
        assert count(queue.url, f"SELECT count(*) FROM {table}") == 0, table


def test_a_broker_lost_after_the_rows_commit_is_said_with_its_own_exit_code(
        queue, tmp_path, monkeypatch, capsys):
    """Redis killed between the job rows and their messages: enqueue used to say "cannot
    reach the job broker" (exit 3) while the jobs were committed and later ran. It now
    lists the jobs, says they are queued in the database and that the reconciler will send
    them, and exits 4; `ncat retry` once the broker is back sends them (exit 0)."""
    from jobs import enqueue as enqueue_module
    from jobs.cli import main

    from helpers import Redis

    broker = Redis(tmp_path / "redis")
    broker.start()
    monkeypatch.setenv("REDIS_URL", broker.url)
    monkeypatch.setattr(enq, "_APP", None)
    real = enqueue_module.jobdb.insert_job

    def insert_then_lose_the_broker(*args, **kwargs):
        job_id = real(*args, **kwargs)
        broker.stop()  # a real redis-server killed while the transaction is still open
        return job_id

    monkeypatch.setattr(enqueue_module.jobdb, "insert_job", insert_then_lose_the_broker)
    try:
        assert main(["enqueue", queue.name, "--checkpoints", "300", "--hi", "10",
                     "--database-url", queue.url]) == 4
        out = capsys.readouterr()
        assert "step 300, 2 layers: queued" in out.out
        assert "queued in the database, but the job broker failed" in out.err
        assert "reconciler sends them" in out.err
        job_id = count(queue.url, "SELECT id FROM job")
        assert count(queue.url, "SELECT count(*) FROM job_layer WHERE status = 'queued'") == \
            TINY.n_layers
        monkeypatch.setattr(enqueue_module.jobdb, "insert_job", real)
        broker.start()
        monkeypatch.setattr(enq, "_APP", None)
        assert main(["retry", str(job_id), "--database-url", queue.url]) == 0
        import redis

        assert redis.Redis.from_url(broker.url).llen(os.environ["NCAT_QUEUE"]) == TINY.n_layers
    finally:
        broker.stop()


def test_a_broker_restarted_empty_while_messages_go_out_is_not_called_queued(
        queue, tmp_path, monkeypatch, capsys):
    """Redis restarted empty between two messages of one enqueue: the first message is
    lost with the old server's memory while the second reaches the new one. enqueue used
    to exit 0 and say "queued"; it now sees the broker's run id change, exits 4 and says
    that messages may be lost and who sends them. A restart before anything is sent, or
    none, is not reported."""
    import redis

    from jobs import enqueue as enqueue_module
    from jobs.cli import main

    from helpers import Redis

    broker = Redis(tmp_path / "redis")
    broker.start()
    monkeypatch.setenv("REDIS_URL", broker.url)
    monkeypatch.setattr(enq, "_APP", None)
    real = enqueue_module._celery_send
    sent = []

    def send_then_restart(job_id, layer, catalog):
        real(job_id, layer, catalog)
        sent.append(layer)
        if len(sent) == 1:
            broker.restart_empty()  # a restarted Redis without its data
            monkeypatch.setattr(enq, "_APP", None)  # a fresh connection to the new server

    monkeypatch.setattr(enqueue_module, "_celery_send", send_then_restart)
    try:
        assert main(["enqueue", queue.name, "--checkpoints", "300", "--hi", "10",
                     "--database-url", queue.url]) == 4
        out = capsys.readouterr()
        assert "step 300, 2 layers: queued" in out.out
        assert "BrokerRestarted: the broker restarted while the messages were sent" in out.err
        assert "reconciler sends them" in out.err
        assert len(sent) == TINY.n_layers
        # what the new server holds: only the messages sent after the restart
        assert redis.Redis.from_url(broker.url).llen(os.environ["NCAT_QUEUE"]) == \
            TINY.n_layers - 1
        monkeypatch.setattr(enqueue_module, "_celery_send", real)
        monkeypatch.setattr(enq, "_APP", None)
        # nothing restarted: the next enqueue (another checkpoint) is plainly queued
        assert main(["enqueue", queue.name, "--checkpoints", "128", "--hi", "10",
                     "--database-url", queue.url]) == 0
        assert "restarted" not in capsys.readouterr().err
    finally:
        broker.stop()


def test_workers_are_counted_on_their_own_queue_only(queue):
    """The explorer's hint that queued jobs wait for a worker (issue 32.6) asks the broker
    which workers consume this catalog's queue: none before one starts, one after, and a
    worker of this queue is not counted for another queue on the same broker."""
    from catalog.config.settings import get_settings
    from jobs.celery_app import workers_on_queue

    assert workers_on_queue(timeout=1.0) == 0
    queue.start_worker()
    wait_until(lambda: workers_on_queue(timeout=1.0) == 1, timeout=120,
               what="the worker to answer on its queue")
    assert workers_on_queue(get_settings(ncat_queue="another-queue"), timeout=1.0) == 0


def test_a_worker_at_a_broker_that_never_answers_says_so_and_stops_on_sigterm(
        queue, monkeypatch):
    """A REDIS_URL whose port accepts and never answers (another server, a hung Redis)
    kept a worker silent for ever (nothing logged in 2 minutes when tried), and its
    SIGTERM took nearly 3 minutes more. Broker reads and connects are now bounded
    (NCAT_BROKER_TIMEOUT_SECONDS, shortened to 2 s here): the worker logs that it cannot
    connect and tries again, and SIGTERM ends it within the bound."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        monkeypatch.setenv("NCAT_BROKER_TIMEOUT_SECONDS", "2")
        worker = queue.start_worker("silent")
        wait_until(lambda: "Cannot connect to redis" in queue.worker_log("silent"),
                   timeout=90, what="the worker to say it cannot reach the broker")
        assert worker.poll() is None  # it goes on trying
        assert "Timeout reading from socket" in queue.worker_log("silent")
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        assert time.monotonic() - t0 < 30, queue.worker_log("silent")[-2000:]


def test_a_tests_queue_leaves_nothing_in_redis(redis_url):
    """Issue 50: every run left `test-*` queues and their bindings in Redis db 0. The tests
    use a database of their own on a local Redis, and each queue fixture deletes its keys
    and its unacknowledged deliveries, leaving other queues' alone."""
    import json
    import uuid

    import redis

    from helpers import TEST_REDIS_DB, forget_queue

    if redis_url.startswith("redis://localhost:6379/"):
        assert redis_url.endswith(f"/{TEST_REDIS_DB}") and TEST_REDIS_DB != 0
    r = redis.Redis.from_url(redis_url)
    mine, other = f"test-{uuid.uuid4().hex[:8]}", f"test-{uuid.uuid4().hex[:8]}"
    for q in (mine, other):
        r.rpush(q, "message")
        r.sadd(f"_kombu.binding.{q}", "binding")
        r.hset("unacked", f"tag-{q}", json.dumps([{}, "", q]))
        r.zadd("unacked_index", {f"tag-{q}": 1.0})
    forget_queue(redis_url, mine)
    assert list(r.scan_iter(match=f"*{mine}*")) == []
    assert not r.hexists("unacked", f"tag-{mine}")
    assert r.zscore("unacked_index", f"tag-{mine}") is None
    assert r.llen(other) == 1 and r.hexists("unacked", f"tag-{other}")
    forget_queue(redis_url, other)
    assert list(r.scan_iter(match=f"*{other}*")) == []
