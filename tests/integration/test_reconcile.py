"""The reconciler's rules, pass by pass, against a real PostgreSQL (no worker: the test
plays the lost worker and the broker)."""

import pytest

from catalog.config.settings import Settings
from jobs import enqueue as enq
from jobs.locks import layer_lock_key, summary_lock_key
from jobs.reconcile import reconcile, stale_layers
from schema import store

from helpers import SEED_CONFIG
from tiny_model import TINY

SETTINGS = Settings(ncat_stale_seconds=60, ncat_max_attempts=3)


@pytest.fixture(autouse=True)
def _home(tiny_builtin, monkeypatch):
    monkeypatch.setenv("NCAT_HOME", str(tiny_builtin[1].parent))


def _job(url, queue_name):
    (job,) = enq.enqueue(url, queue_name, "300", SEED_CONFIG, send=lambda *a: None)
    return job.job_id


def _age(url, job_id, seconds, **cols):
    """Make the job's layers look quiet for ``seconds`` (and set ``cols``)."""
    sets = ", ".join([f"{k} = %s" for k in cols] + [
        f"{c} = now() - make_interval(secs => %s)" for c in ("sent_at", "started_at",
                                                             "heartbeat_at")])
    with store.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE job_layer SET {sets} WHERE job_id = %s",
                     (*cols.values(), seconds, seconds, seconds, job_id))
        conn.execute("UPDATE job SET status = 'running' WHERE id = %s", (job_id,))


def test_quiet_layers_without_holder_or_message_are_sent_again(db, tiny_builtin):
    from catalog.builtin import model_name

    job = _job(db, model_name(TINY))
    sent = []

    def send(j, layer):
        sent.append((j, layer))

    # fresh: nothing to do
    assert reconcile(db, send, set(), SETTINGS) == [] and sent == []
    _age(db, job, 120, status="running", worker="w@lost")
    with store.connect(db) as conn:
        assert [r[1] for r in stale_layers(conn, SETTINGS)] == list(range(TINY.n_layers))
    # layer 0's lock is held by a live session, layer 1's message waits in the broker
    with store.connect(db, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (layer_lock_key(job, 0),))
        acts = reconcile(db, send, {(job, 1)}, SETTINGS)
    assert [(a.layer, a.action) for a in acts] == [(x, "resent")
                                                   for x in range(2, TINY.n_layers)]
    assert sent == [(job, x) for x in range(2, TINY.n_layers)]
    # the bound doubles after a resend: quiet for 120 s is not enough a second time
    sent.clear()
    _age(db, job, 100, status="running")
    acts = reconcile(db, send, set(), SETTINGS)
    assert sorted(a.layer for a in acts) == [0, 1]  # resent for the first time
    _age(db, job, 130, status="running")
    assert {a.layer for a in reconcile(db, send, set(), SETTINGS)} == {0, 1}  # 130 > 120
    with store.connect(db) as conn:
        events = conn.execute("SELECT count(*) FROM reconcile_event WHERE job_id = %s",
                              (job,)).fetchone()[0]
    assert events == TINY.n_layers - 2 + 2 + 2


def test_a_layer_lost_too_often_fails_its_job_and_retry_starts_over(db, tiny_builtin):
    from catalog.builtin import model_name

    job = _job(db, model_name(TINY))
    for _ in range(SETTINGS.ncat_max_attempts - 1):
        _age(db, job, 10_000, status="running", worker="w@lost")
        acts = reconcile(db, lambda *a: None, set(), SETTINGS)
        assert {a.action for a in acts} == {"resent"}
    _age(db, job, 10_000, status="running", worker="w@lost")
    acts = reconcile(db, lambda *a: None, set(), SETTINGS)
    assert [a.action for a in acts] == ["failed"]
    st = enq.job_statuses(db, [job])[0]
    assert st.status == "failed" and "lost 3 times while running (no heartbeat 3 times)" \
        in st.error, st.error
    assert enq.retry(db, job, send=lambda *a: None) == list(range(TINY.n_layers))
    with store.connect(db) as conn:
        assert conn.execute("SELECT max(resends), max(cardinality(loss_kinds)) FROM job_layer "
                            "WHERE job_id = %s", (job,)).fetchone() == (0, 0)


def test_a_layer_failed_for_its_losses_names_each_kind_counted(db, tiny_builtin):
    """Each way a start is lost is counted under its own kind, and the failure names them
    all (not only the last): a process that died, then silence the reconciler judged,
    then a database that could not be reached."""
    from catalog.builtin import model_name
    from schema import jobs as jobdb

    job = _job(db, model_name(TINY))
    with store.connect(db, autocommit=True) as conn:
        jobdb.start_layer(conn, job, 1, "w@a")
        assert not jobdb.lose_layer(conn, job, 1, resends=0, limit=3, then="count",
                                    cause="the process died", kind="process died")
    _age(db, job, 10_000, status="running", worker="w@b")
    with store.connect(db, autocommit=True) as conn:  # layer 0 is not lost here
        conn.execute("UPDATE job_layer SET heartbeat_at = now(), sent_at = now() "
                     "WHERE job_id = %s AND layer = 0", (job,))
    assert [a.action for a in reconcile(db, lambda *a: None, set(), SETTINGS)] == ["resent"]
    with store.connect(db, autocommit=True) as conn:
        assert jobdb.start_layer(conn, job, 1, "w@c") == 2
        with pytest.raises(ValueError, match="kind must be one of"):
            jobdb.lose_layer(conn, job, 1, resends=2, limit=3, then="count", cause="x",
                             kind="gremlins")
        assert jobdb.lose_layer(conn, job, 1, resends=2, limit=3, then="count",
                                cause="the database was away", kind="database unreachable")
    st = enq.job_statuses(db, [job])[0]
    assert st.status == "failed"
    assert ("layer 1 was lost 3 times while running (process died once, no heartbeat once, "
            "database unreachable once); the last: the database was away") in st.error


def test_a_summary_nobody_holds_is_resumed(db, tiny_builtin):
    from catalog.builtin import model_name

    job = _job(db, model_name(TINY))
    with store.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE job_layer SET status = 'done' WHERE job_id = %s", (job,))
        conn.execute("UPDATE job SET status = 'summarizing', updated_at = now() - "
                     "interval '10 minutes' WHERE id = %s", (job,))
    sent = []
    with store.connect(db, autocommit=True) as holder:  # a live worker is at it
        holder.execute("SELECT pg_advisory_lock(%s)", (summary_lock_key(job),))
        assert reconcile(db, lambda *a: sent.append(a), set(), SETTINGS) == []
    acts = reconcile(db, lambda *a: sent.append(a), set(), SETTINGS)
    assert [(a.action, a.detail["was"]) for a in acts] == [("summary_resumed", "summarizing")]
    assert sent == [(job, 0)]
    assert enq.job_statuses(db, [job])[0].status == "running"


def test_status_lists_stale_layers_and_what_the_reconciler_did(db, capsys):
    from catalog.builtin import model_name
    from jobs.cli import main

    job = _job(db, model_name(TINY))
    _age(db, job, 10_000, status="running", worker="w@gone")
    assert main(["status", "--database-url", db]) == 0
    out = capsys.readouterr().out
    assert "stale (no live worker" in out and f"job {job} layer 0: running" in out
    assert "last worker w@gone" in out
    reconcile(db, lambda *a: None, set(), SETTINGS)
    assert main(["status", "--database-url", db]) == 0
    out = capsys.readouterr().out
    assert "reconciler, latest:" in out and f"job {job} layer 0: resent" in out
    assert "stale (no live worker" not in out  # just sent again: not quiet any more


def test_the_embedded_redis_keeps_an_append_only_file_and_ncat_stop_stops_it(tmp_path):
    import redis

    from jobs.broker import start_embedded_redis, stop_embedded_redis
    from schema.database import port_open

    url = start_embedded_redis(tmp_path)
    try:
        r = redis.Redis.from_url(url)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        port = r.connection_pool.connection_kwargs["port"]
    finally:
        assert stop_embedded_redis(tmp_path)
    assert not port_open("127.0.0.1", port)
    assert not stop_embedded_redis(tmp_path)  # nothing left to stop


def test_a_lock_in_another_catalog_on_the_same_server_is_not_this_ones(db, pg_server,
                                                                        tiny_builtin):
    """Advisory locks are per database: job 1 of another catalog holding its summary lock
    used to stop this catalog's reconciler from resuming its own job 1 (a flake of the
    suite, whose tests each have a database on one server)."""
    from catalog.builtin import model_name

    from helpers import drop_database, new_database_url

    job = _job(db, model_name(TINY))
    with store.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE job_layer SET status = 'done' WHERE job_id = %s", (job,))
        conn.execute("UPDATE job SET status = 'summarizing', updated_at = now() - "
                     "interval '10 minutes' WHERE id = %s", (job,))
    other = new_database_url(pg_server)
    from schema.engine import migrate

    migrate(other)
    try:
        with store.connect(other, autocommit=True) as holder:  # the same key, elsewhere
            holder.execute("SELECT pg_advisory_lock(%s)", (summary_lock_key(job),))
            acts = reconcile(db, lambda *a: None, set(), SETTINGS)
            assert [a.action for a in acts] == ["summary_resumed"]
    finally:
        drop_database(other)


def _quiet(url, job_id, layer, seconds, **cols):
    sets = ", ".join([f"{k} = %s" for k in cols] + [
        f"{c} = now() - make_interval(secs => %s)" for c in ("sent_at", "started_at",
                                                             "heartbeat_at")])
    with store.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE job_layer SET {sets} WHERE job_id = %s AND layer = %s",
                     (*cols.values(), seconds, seconds, seconds, job_id, layer))


def test_resending_a_queued_layer_is_not_a_loss(db, tiny_builtin):
    """A queued layer whose message waits in a worker's prefetch (not in the broker's
    queue, so the reconciler sends it again) is re-sent, not lost: after many re-sends it
    starts, dies once and is sent again, never failed; the layer that dies on every start
    is the one failed, after NCAT_MAX_ATTEMPTS losses. (The poison rule counted re-sends:
    a layer started once failed as "lost 4 times".)"""
    from catalog.builtin import model_name
    from schema import jobs as jobdb

    job = _job(db, model_name(TINY))
    with store.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE job SET status = 'running' WHERE id = %s", (job,))
        conn.execute("UPDATE job_layer SET status = 'done' WHERE job_id = %s AND layer > 1",
                     (job,))
    healthy, poison = 0, 1
    for _ in range(5):  # five stale periods in the prefetch: five re-sends
        _quiet(db, job, healthy, 10_000, status="queued")
        _quiet(db, job, poison, 0)  # not quiet: left alone
        acts = reconcile(db, lambda *a: None, set(), SETTINGS)
        assert [(a.layer, a.action, a.detail.get("sends")) for a in acts][:1] == [
            (healthy, "resent", acts[0].detail["sends"])]
    with store.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT resends, sends FROM job_layer WHERE job_id = %s AND "
                            "layer = %s", (job, healthy)).fetchone() == (0, 5)
        jobdb.start_layer(conn, job, healthy, "w@slow")  # it starts at last, then dies
    _quiet(db, job, healthy, 10_000, worker="w@slow")
    acts = reconcile(db, lambda *a: None, set(), SETTINGS)
    assert [(a.layer, a.action, a.detail["lost"]) for a in acts] == [(healthy, "resent", 1)]
    # the poison layer dies on every start
    for lost in range(1, SETTINGS.ncat_max_attempts + 1):
        with store.connect(db, autocommit=True) as conn:
            jobdb.start_layer(conn, job, poison, "w@dies")
        _quiet(db, job, poison, 10_000, worker="w@dies")
        _quiet(db, job, healthy, 0)
        acts = reconcile(db, lambda *a: None, set(), SETTINGS)
        want = "failed" if lost == SETTINGS.ncat_max_attempts else "resent"
        assert [(a.layer, a.action) for a in acts] == [(poison, want)], (lost, acts)
    st = enq.job_statuses(db, [job])[0]
    assert st.status == "failed" and f"layer {poison} was lost 3 times" in st.error


def test_a_summary_no_worker_takes_is_resumed_less_and_less_often(db, tiny_builtin):
    """While no worker takes a resumed summary (every worker stopped), each resume doubles
    the quiet time the next one needs (up to 8x the stale bound): it was sent every stale
    period (4-6 messages, then one spare worker's 332 busy retries)."""
    from catalog.builtin import model_name

    job = _job(db, model_name(TINY))
    stale = SETTINGS.ncat_stale_seconds

    def quiet_for(seconds):
        with store.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE job_layer SET status = 'done', finished_at = now() - "
                         "interval '1 day' WHERE job_id = %s", (job,))
            conn.execute("UPDATE job SET updated_at = now() - make_interval(secs => %s) "
                         "WHERE id = %s", (seconds, job))
        return [a.detail["times"] for a in reconcile(db, lambda *a: None, set(), SETTINGS)
                if a.action == "summary_resumed"]

    assert quiet_for(stale + 5) == [1]
    for times, bound in ((2, 2 * stale), (3, 4 * stale), (4, 8 * stale), (5, 8 * stale)):
        assert quiet_for(bound - 10) == [], (times, bound)  # not yet
        assert quiet_for(bound + 5) == [times], (times, bound)
