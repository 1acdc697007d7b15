"""The store against a real PostgreSQL: migrations, the bulk writer, grids, access, fallback."""

import socket
import time
import uuid

import numpy as np
import psycopg
import pytest
from alembic import command
from sqlalchemy.engine import make_url

from catalog.config import ScienceConfig
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model
from jobs.store_results import layer_rows, register, write_layouts
from schema import console, reads, store
from schema.database import Settings, resolve_database_url
from schema.engine import alembic_config, current_revision, head_revision, migrate
from schema.quantize import dequantize, max_error, quantize_rows

from helpers import (
    as_role,
    copy_database,
    drop_database,
    dump,
    new_database_url,
    reader_url,
)
from reference import sketch_reference

TABLES = {"model", "checkpoint", "measure_config", "grid_layout", "heuristic", "job",
          "layer_result", "checkpoint_summary", "neuron_op", "neuron_grid", "neuron_lens",
          "neuron_score", "catalog_setting"}


def tables(url):
    with store.connect(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}


def test_migrations_upgrade_downgrade_and_no_drift(empty_db):
    cfg = alembic_config(empty_db)
    server_default = _jit(empty_db)
    command.upgrade(cfg, "head")
    have = tables(empty_db)
    assert TABLES <= have
    assert {f"neuron_score_p{i}" for i in range(8)} <= have
    command.check(cfg)  # raises if the models and the migrations disagree
    assert _jit(empty_db) == _jit(reader_url(empty_db)) == "off"  # 0013, for new sessions
    command.downgrade(cfg, "base")
    assert tables(empty_db) == {"alembic_version"}
    assert _jit(empty_db) == server_default
    command.upgrade(cfg, "head")
    assert TABLES <= tables(empty_db)


def _jit(url) -> str:
    with store.connect(url) as conn:
        return store.scalar(conn.execute("SHOW jit"))


def _reader_makes_a_temp_table(url) -> bool:
    with store.connect(reader_url(url), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        try:
            conn.execute("CREATE TEMP TABLE probe (x int)")
        except psycopg.errors.InsufficientPrivilege:
            return False
        return True


def _settings_row_versions(url) -> tuple:
    """The xmin of the database's row in pg_database and of its pg_db_role_setting row:
    they change when either is written."""
    with store.connect(url) as conn:
        return conn.execute("SELECT d.xmin::text, s.xmin::text FROM pg_database d "
                            "JOIN pg_db_role_setting s ON s.setdatabase = d.oid "
                            "WHERE d.datname = current_database()").fetchone()


def test_migrate_puts_back_the_database_settings_a_copy_of_the_catalog_loses(db, pg_server):
    """CREATE DATABASE ... TEMPLATE (and pg_restore without --create) copies a catalog's
    tables and its Alembic revision but not what migrations 0013 and 0022 set on the
    database itself; migrating the copy to head sets them again, and writes nothing where
    they hold."""
    assert _jit(db) == "off" and not _reader_makes_a_temp_table(db)
    copy = new_database_url(pg_server)
    copy_database(db, copy)
    try:
        # the copy as PostgreSQL makes it: at head, but JIT as the server has it and
        # temporary tables allowed to every role; and not marked as a catalog, so that
        # where the server loads the reader guard, the reader cannot log in at all
        assert current_revision(copy) == head_revision()
        from schema.console import reader_guard_loaded

        with store.connect(copy) as conn:
            guarded = reader_guard_loaded(conn)
        if guarded:
            with pytest.raises(psycopg.OperationalError, match="catalog databases only"):
                _reader_makes_a_temp_table(copy)
        else:
            assert _reader_makes_a_temp_table(copy)
        with store.connect(copy) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d "
                "ON d.oid = s.setdatabase WHERE d.datname = current_database()"
            ).fetchone()[0] == 0
        migrate(copy)
        assert _jit(copy) == _jit(reader_url(copy)) == "off"
        assert not _reader_makes_a_temp_table(copy)
        before = _settings_row_versions(copy)
        migrate(copy)  # in place: no row of the server's catalogs is written again
        assert _settings_row_versions(copy) == before
    finally:
        drop_database(copy)


def test_migrate_warns_and_goes_on_where_it_may_not_set_the_database_settings(db):
    """``migrate`` at head by a role that does not own the database, on a database that
    lacks its settings (a restored copy): it warns and goes on, as 0013 does."""
    from schema.engine import DATABASE_SETTINGS

    role = f"ncat_guest_{uuid.uuid4().hex[:8]}"
    with store.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON LANGUAGE plpgsql TO {role}")
        conn.execute(f"ALTER DATABASE {make_url(db).database} SET jit = on")
        conn.execute(f"GRANT TEMPORARY ON DATABASE {make_url(db).database} TO PUBLIC")
    try:
        notices: list[str] = []
        with store.connect(as_role(db, role), autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute(DATABASE_SETTINGS)
        assert any("not the owner of database" in n for n in notices), notices
        assert _jit(db) == "on" and _reader_makes_a_temp_table(db)
        migrate(db)  # its owner puts both back
        assert _jit(db) == "off" and not _reader_makes_a_temp_table(db)
    finally:
        with store.connect(db, autocommit=True) as conn:
            conn.execute(f"REVOKE USAGE ON LANGUAGE plpgsql FROM {role}")
            conn.execute(f"DROP ROLE {role}")


def test_jit_migration_warns_and_goes_on_where_it_may_not_alter_the_database(db):
    """Migration 0013 turns JIT off with ALTER DATABASE, which takes the database's owner:
    run by a role that is not, it warns and changes nothing rather than failing (the
    database is set to jit = on first, so "nothing changed" does not rest on the
    server's default)."""
    from helpers import migration_module

    block = migration_module("0013_jit_off.py").SET_FOR_DATABASE
    role = f"ncat_guest_{uuid.uuid4().hex[:8]}"
    with store.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        # a role that migrates runs DO blocks: 0022 gives plpgsql to the migrating role only
        conn.execute(f"GRANT USAGE ON LANGUAGE plpgsql TO {role}")
        conn.execute(f"ALTER DATABASE {make_url(db).database} SET jit = on")
    try:
        guest = as_role(db, role)
        notices: list[str] = []
        with store.connect(guest, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute(block.format(action="SET jit = off"))
        assert any("not the owner of database" in n for n in notices), notices
        assert _jit(db) == "on"
    finally:
        with store.connect(db, autocommit=True) as conn:
            conn.execute(f"REVOKE USAGE ON LANGUAGE plpgsql FROM {role}")
            conn.execute(f"DROP ROLE {role}")


def test_quantization_error_is_within_half_a_step():
    rng = np.random.default_rng(0)
    grids = rng.standard_normal((50, 777)).astype(np.float32) * rng.uniform(0.01, 10, (50, 1))
    grids[0] = 3.25  # constant grid: exact
    q, scale, vmin = quantize_rows(grids)
    for i in range(len(grids)):
        back = dequantize(q[i].tobytes(), scale[i], vmin[i])
        err = np.abs(back - grids[i]).max()
        assert err <= max_error(scale[i]) * (1 + 1e-5) + 1e-7
        assert err <= (grids[i].max() - grids[i].min()) / 510 * (1 + 1e-5) + 1e-7
    assert scale[0] == 0 and np.all(dequantize(q[0], scale[0], vmin[0]) == 3.25)


@pytest.fixture(scope="module")
def layer_data(tiny_builtin):
    cfg, root = tiny_builtin
    lm = load_model("builtin", builtin_config=cfg, cache_root=root)
    # [0, 40): two cells per sketch block (a side of 32 or less is always stored in full)
    config = ScienceConfig(operand_hi=40, pairs_per_op=10)
    prep = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    return lm, config, prep, prep.run_layer(1)


def write(url, lm, config, prep, result, rows=None):
    with store.connect(url) as conn:
        ids = register(conn, lm, config)
        write_layouts(conn, prep, ids)
        store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                          config_id=ids.config_id, rows=rows or layer_rows(result, prep,
                                                                          lm.tokenizer))
    return ids


def test_real_arrays_copy_back_the_same_bits_as_psycopgs_own_lists(empty_db):
    """``store.real_array`` (the lens's numbers and values, written as COPY text) reads
    back as the same float32 bits as psycopg's adaptation of the list it replaced, on
    values whose text is awkward: NaN, both infinities, -0.0, the smallest subnormal, the
    largest float32, values that round at float32's last bit, and float64 input."""
    rng = np.random.default_rng(3)
    f32 = np.finfo(np.float32)
    awkward = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, f32.max, -f32.max,
                        f32.tiny, 1 / 3, 0.1, 16777217.0], dtype=np.float32)
    arrays = [awkward, rng.standard_normal(1000).astype(np.float32),
              (rng.standard_normal(50) * 1e30).astype(np.float32), np.zeros(0, np.float32),
              rng.standard_normal(20)]  # float64: rounded to float32 either way
    with store.connect(empty_db) as conn:
        conn.execute("CREATE TEMP TABLE arr (i int, how text, x real[])")
        with conn.cursor().copy("COPY arr (i, how, x) FROM STDIN") as cp:
            for i, a in enumerate(arrays):
                cp.write_row((i, "ours", store.real_array(a)))
                cp.write_row((i, "psycopg", a.tolist()))
        got = {(i, how): np.asarray(x, dtype=np.float32) for i, how, x in
               conn.execute("SELECT i, how, x FROM arr").fetchall()}
    for i, a in enumerate(arrays):
        ours, theirs = got[(i, "ours")], got[(i, "psycopg")]
        assert ours.view(np.uint32).tolist() == theirs.view(np.uint32).tolist()
        want = np.asarray(a, dtype=np.float32)
        assert np.array_equal(ours, want, equal_nan=True)
        assert np.array_equal(np.signbit(ours), np.signbit(want))


def test_writer_is_idempotent_and_grids_round_trip(db, layer_data):
    lm, config, prep, result = layer_data
    ids = write(db, lm, config, prep, result)
    first = dump(db)
    d_mlp = lm.model.cfg.d_mlp
    assert len(first["neuron_op"]) == len(first["neuron_grid"]) == 4 * d_mlp
    assert len(first["neuron_lens"]) == d_mlp
    assert len(first["neuron_score"]) == len(result.matches)
    m = result.matches
    with store.connect(db) as conn:
        stored = conn.execute("SELECT count(base_rate), count(p_value), min(p_value), "
                              "max(p_value), max(base_rate) FROM neuron_score").fetchone()
    assert stored[0] == int(np.isfinite(m.base_rate).sum()) > 0
    assert stored[1] == int(np.isfinite(m.p_value).sum()) > 0
    assert 0 <= stored[2] <= stored[3] <= 1 and 0 < stored[4] < 1
    write(db, lm, config, prep, result)
    assert dump(db) == first
    table = prep.table
    with store.connect(db) as conn:
        assert reads.stored_layers(conn, checkpoint_id=ids.checkpoint_id,
                                   config_id=ids.config_id) == [1]
        # tiers: the top 20 per operator by rank in full, the rest as sketches
        tiers = dict(((r[0], r[1]), r[2]) for r in conn.execute(
            "SELECT neuron, op, sketch FROM neuron_grid").fetchall())
        top = config.full_grid_top()
        assert top == 20 < d_mlp
        for o, op in enumerate(config.operators):
            full = {n for n in range(d_mlp) if not tiers[(n, op)]}
            assert full == set(np.nonzero(result.rank[:, o] < top)[0].tolist())
            assert len(full) == top
        for op in ("+", "/", "*"):
            o = config.operators.index(op)
            order = np.argsort(result.rank[:, o])
            for neuron, sketch in ((int(order[3]), False), (int(order[top + 5]), True)):
                got = reads.read_stored_grid(conn, model_id=ids.model_id,
                                      checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                      layer=1, neuron=neuron, op=op)
                assert got.sketch == sketch
                want = table.to_grid(result.acts[table.op_index(op), neuron], op)
                span = np.nanmax(want) - np.nanmin(want)
                step = span / 510 + 1e-6  # half a code step: the reconstruction bound
                if sketch:  # the slow reference's block, row and column means
                    want, rows, cols = sketch_reference(want.astype(np.float64), got.block)
                    for mine, ref in ((got.row_means, rows), (got.col_means, cols)):
                        ok = np.isfinite(ref)
                        assert mine is not None
                        assert np.array_equal(np.isfinite(mine), ok)
                        assert np.abs(mine[ok] - ref[ok]).max() <= step
                grid = got.values
                assert np.array_equal(np.isnan(grid), np.isnan(want))
                assert np.nanmax(np.abs(grid - want)) <= step
                if sketch:
                    continue
                kv = reads.read_grid_values(conn, model_id=ids.model_id,
                                    checkpoint_id=ids.checkpoint_id, config_id=ids.config_id,
                                    layer=1, neuron=neuron, op=op, kv=True)
                want_kv = table.to_grid(result.kv(table.op_index(op))[neuron], op)
                lens_max = np.abs(result.answer_lens[neuron]).max()
                assert np.nanmax(np.abs(kv - want_kv)) <= step * lens_max + 1e-6
        # the best heuristic column agrees with the score rows
        n, op, best, score = conn.execute(
            "SELECT n.neuron, n.op, h.key, n.best_score FROM neuron_op n "
            "JOIN heuristic h ON h.id = n.best_heuristic_id ORDER BY n.best_score DESC, "
            "n.neuron LIMIT 1").fetchone()
        top = conn.execute("SELECT max(score) FROM neuron_score WHERE neuron = %s AND op = %s",
                           (n, op)).fetchone()[0]
        assert top == pytest.approx(score)


def test_failure_mid_layer_leaves_nothing_partial(db, layer_data):
    lm, config, prep, result = layer_data
    write(db, lm, config, prep, result)
    before = dump(db)
    rows = layer_rows(result, prep, lm.tokenizer)
    rows.stats["max_act"] = rows.stats["max_act"] + 1.0  # would change every neuron_op row
    rows.matches.heuristic = rows.matches.heuristic.copy()
    rows.matches.heuristic[-1] = 10**6  # the last score row names no heuristic: fails late
    with pytest.raises(IndexError):
        write(db, lm, config, prep, result, rows=rows)
    assert dump(db) == before


def test_checkpoint_with_identical_weights_is_flagged(db):
    with store.connect(db) as conn:
        model_id = store.upsert_model(conn, info={
            "name": "m", "source": "hub", "n_layers": 1, "d_model": 4, "d_mlp": 8,
            "d_vocab": 10, "act_fn": "gelu", "gated_mlp": False, "number_limit": 9,
            "digit_level": False})
        store.upsert_checkpoint(conn, model_id=model_id, step=1000, revision="step1000",
                                weights_hash="a" * 64)
        store.upsert_checkpoint(conn, model_id=model_id, step=2000, revision="step2000",
                                weights_hash="a" * 64)
        store.upsert_checkpoint(conn, model_id=model_id, step=3000, revision="step3000",
                                weights_hash="b" * 64)
        rows = conn.execute("SELECT step, duplicate_of_step FROM checkpoint ORDER BY step"
                            ).fetchall()
    assert rows == [(1000, None), (2000, 1000), (3000, None)]


def test_checkpoints_registered_at_once_are_one_row_and_duplicates_point_back(db):
    """20 processes registering the same checkpoints at once (a step, and a model without
    steps) get one row each and the same id; re-registering an earlier step never makes
    it a duplicate of a later one."""
    from concurrent.futures import ThreadPoolExecutor

    info = {"name": "m", "source": "hub", "n_layers": 1, "d_model": 4, "d_mlp": 8,
            "d_vocab": 10, "act_fn": "gelu", "gated_mlp": False, "number_limit": 9,
            "digit_level": False}

    def register(step):
        with store.connect(db) as conn, conn.transaction():
            model_id = store.upsert_model(conn, info=info)
            return store.upsert_checkpoint(conn, model_id=model_id, step=step,
                                           revision=None, weights_hash="c" * 64)

    for step in (500, None):
        with ThreadPoolExecutor(20) as pool:
            ids = list(pool.map(register, [step] * 20))
        assert len(set(ids)) == 1, (step, ids)
    with store.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoint").fetchone()[0] == 2
        model_id = store.upsert_model(conn, info=info)
        store.upsert_checkpoint(conn, model_id=model_id, step=100, revision=None,
                                weights_hash="c" * 64)
        store.upsert_checkpoint(conn, model_id=model_id, step=500, revision=None,
                                weights_hash="c" * 64)  # re-cataloged later
        rows = conn.execute("SELECT step, duplicate_of_step FROM checkpoint ORDER BY step"
                            ).fetchall()
    assert rows == [(100, None), (500, 100), (None, None)]


@pytest.mark.parametrize("sql", [
    "INSERT INTO catalog_setting VALUES ('x', 1)",
    "UPDATE catalog_setting SET value = 0",
    "DELETE FROM catalog_setting",
    "DROP TABLE catalog_setting",
    "CREATE TABLE evil (x int)",
])
def test_reader_role_cannot_write(db, sql):
    with store.connect(reader_url(db)) as conn:
        assert conn.execute("SELECT count(*) FROM catalog_setting").fetchone()[0] == 2
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "10s"
        with pytest.raises(psycopg.Error):
            conn.execute(sql)
    with store.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM catalog_setting").fetchone()[0] == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_embedded_fallback_when_no_server_answers(tmp_path, monkeypatch, capsys):
    from jobs.cli import main
    from schema.database import embedded_running

    monkeypatch.setenv("NCAT_HOME", str(tmp_path))
    port = free_port()  # nothing listens here
    url = resolve_database_url(Settings(database_url=None, ncat_home=tmp_path,
                                        local_pg_port=port))
    assert "host=" in url and str(tmp_path) in url  # a unix socket in our own data dir
    try:
        migrate(url)
        with store.connect(url) as conn:
            assert conn.execute("SELECT value FROM catalog_setting WHERE key = "
                                "'match_threshold'").fetchone()[0] == pytest.approx(0.6)
        assert embedded_running(tmp_path / "pgdata")
        assert main(["stop"]) == 0  # what a user runs: stops it whichever process started it
        assert "embedded PostgreSQL in" in capsys.readouterr().out
        assert embedded_running(tmp_path / "pgdata") is None
    finally:  # tests stop what they start: no server outlives the suite
        from schema.database import stop_embedded

        stop_embedded()
    assert embedded_running(tmp_path / "pgdata") is None
    with pytest.raises(psycopg.OperationalError):
        store.connect(url, connect_timeout=3)

def test_database_url_wins(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://someone@db.example:5433/cat")
    assert resolve_database_url() == "postgresql+psycopg://someone@db.example:5433/cat"
    monkeypatch.delenv("DATABASE_URL")
    with socket.socket() as listener:  # something answers on this port: it is used
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        url = resolve_database_url(Settings(database_url=None, local_pg_host="127.0.0.1",
                                            local_pg_port=port))
    assert url == f"postgresql+psycopg://postgres@127.0.0.1:{port}/ncat"


def test_ncat_catalog_validates_every_checkpoint_before_writing(db, tiny_builtin, monkeypatch,
                                                                 capsys):
    """A bad second checkpoint, a bad layer or operand range used to be found after the
    first checkpoint's rows were written."""
    from catalog.builtin import model_name
    from jobs.cli import main

    from tiny_model import TINY

    _, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    name = model_name(TINY)
    for extra, message in (
            (["--checkpoints", "300,77777"], "77777"),
            (["--checkpoints", "300", "--layers", "0,9"], "layers [9] do not exist"),
            (["--checkpoints", "300", "--layers", ""], "--layers is empty"),
            (["--checkpoints", "300", "--hi", "5000"], "5000")):
        assert main(["catalog", name, *extra, "--quiet", "--database-url", db]) == 2, extra
        assert message in capsys.readouterr().err, extra
    with store.connect(db) as conn:
        for table in ("checkpoint", "measure_config", "layer_result", "model"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table


def test_ncat_catalog_resumes_an_interrupted_checkpoint_layer_by_layer(db, tiny_builtin,
                                                                       monkeypatch, capsys):
    """Layers stored by an interrupted run are not computed again; the summary covers
    them all, and the rows equal those of a run that was never interrupted."""
    from catalog.builtin import model_name
    from jobs import store_results
    from jobs.cli import main

    from tiny_model import TINY

    _, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    name = model_name(TINY)
    args = ["catalog", name, "--checkpoints", "300", "--hi", "10", "--pairs", "6", "--quiet",
            "--database-url", db]
    real = store_results.store_layer
    computed: list[int] = []

    def interrupted(conn, run, ids, layer, *a, **kw):
        if layer == TINY.n_layers - 1:
            raise KeyboardInterrupt  # the run is stopped before its last layer
        computed.append(layer)
        return real(conn, run, ids, layer, *a, **kw)

    monkeypatch.setattr(store_results, "store_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(args)
    with store.connect(db) as conn:
        first = conn.execute("SELECT layer, written_at FROM layer_result ORDER BY layer"
                             ).fetchall()
    assert [r[0] for r in first] == list(range(TINY.n_layers - 1))

    def counting(conn, run, ids, layer, *a, **kw):
        computed.append(layer)
        return real(conn, run, ids, layer, *a, **kw)

    computed.clear()
    monkeypatch.setattr(store_results, "store_layer", counting)
    assert main(args) == 0
    assert computed == [TINY.n_layers - 1]  # only the missing layer
    assert "are stored already" in capsys.readouterr().out
    with store.connect(db) as conn:
        again = conn.execute("SELECT layer, written_at FROM layer_result ORDER BY layer"
                             ).fetchall()
        assert again[:-1] == first  # the stored layers were not rewritten
        assert conn.execute("SELECT layers FROM checkpoint_summary").fetchone()[0] == \
            list(range(TINY.n_layers))
        resumed = conn.execute("SELECT md5(string_agg(row(layer, neuron, op, effect_exact, "
                               "rank, best_score)::text, '|' ORDER BY layer, neuron, op)) "
                               "FROM neuron_op").fetchone()[0]
        summary = conn.execute("SELECT faithfulness::text, n_heuristic_neurons::text "
                               "FROM checkpoint_summary").fetchone()
    # the same checkpoint computed in one go, into a fresh database
    from schema.engine import migrate

    from helpers import drop_database, new_database_url

    fresh = new_database_url(db)
    migrate(fresh)
    try:
        assert main([*args[:-1], fresh]) == 0
        with store.connect(fresh) as conn:
            assert conn.execute("SELECT md5(string_agg(row(layer, neuron, op, effect_exact, "
                                "rank, best_score)::text, '|' ORDER BY layer, neuron, op)) "
                                "FROM neuron_op").fetchone()[0] == resumed
            assert conn.execute("SELECT faithfulness::text, n_heuristic_neurons::text "
                                "FROM checkpoint_summary").fetchone() == summary
    finally:
        drop_database(fresh)


def test_compact_scores_keep_every_label_and_the_best_per_family(db, tiny_builtin, monkeypatch):
    """The same checkpoint with every score stored (--scores-per-family 0) and with 2 (the
    default is 1): neuron rows, labels, summaries and docs/queries.md's label queries are
    equal; the compact one stores at most 2 unlabelled scores per (neuron, op, family),
    the best of its group, and far fewer rows."""
    from catalog.builtin import model_name
    from jobs.cli import main

    from tiny_model import TINY

    _, root = tiny_builtin
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    base = ["catalog", model_name(TINY), "--checkpoints", "300", "--hi", "16", "--pairs", "6",
            "--quiet", "--database-url", db]
    assert main([*base, "--scores-per-family", "0"]) == 0
    assert main([*base, "--scores-per-family", "2"]) == 0
    with store.connect(db) as conn:
        ids = dict(conn.execute("SELECT (config->>'scores_per_family')::int, id "
                                "FROM measure_config").fetchall())
        assert set(ids) == {0, 2}

        def q(sql: str, cfg: int) -> list:
            return conn.execute(sql, {"c": ids[cfg]}).fetchall()

        op_rows = ("SELECT layer, neuron, op, effect_exact, rank, best_heuristic_id, "
                   "best_score, labelled FROM neuron_op WHERE config_id = %(c)s ORDER BY 1, 2, 3")
        assert q(op_rows, 0) == q(op_rows, 2)
        labels = ("SELECT layer, neuron, op, heuristic_id, score, p_value FROM neuron_score "
                  "WHERE config_id = %(c)s AND implements ORDER BY 1, 2, 3, 4")
        assert len(q(labels, 0)) > 10 and q(labels, 0) == q(labels, 2)
        summ = ("SELECT accuracy::text, faithfulness::text, n_heuristic_neurons::text, "
                "heuristic_knockouts::text FROM checkpoint_summary WHERE config_id = %(c)s")
        assert q(summ, 0) == q(summ, 2)
        # per (neuron, op, family): the compact rows are the 2 best of the full rows
        # (testable heuristics first, then score), plus labels
        full = q("SELECT s.layer, s.neuron, s.op, h.family, s.heuristic_id, s.score, "
                 "s.implements, s.testable FROM neuron_score s "
                 "JOIN heuristic h ON h.id = s.heuristic_id WHERE s.config_id = %(c)s", 0)
        # the tiny grid has heuristics it cannot test (both kinds present: the ranking is
        # exercised), and a label is never on one
        assert {r[7] for r in full} == {True, False}
        assert all(r[7] for r in full if r[6])
        kept = {tuple(r) for r in q(
            "SELECT layer, neuron, op, heuristic_id FROM neuron_score WHERE config_id = %(c)s",
            2)}
        groups: dict = {}
        for r in full:
            groups.setdefault(r[:4], []).append(r)
        for rows in groups.values():
            rows.sort(key=lambda r: (not r[7], -r[5], r[4]))
            for j, r in enumerate(rows):
                assert ((r[:3] + (r[4],)) in kept) == (j < 2 or r[6]), (r, rows)
        assert len(kept) < 0.5 * len(full), (len(kept), len(full))


READER_SETTINGS = {"default_transaction_read_only": "on", "statement_timeout": "10s",
                   "temp_file_limit": "1GB"}


@pytest.mark.serial  # other tests read the reader's settings, which this one takes away
@pytest.mark.parametrize("held", [("default_transaction_read_only", "statement_timeout"),
                                  ("temp_file_limit",)], ids=["migration 0002", "0022"])
def test_a_migration_that_waits_on_the_readers_settings_goes_on_when_they_commit(
        pg_server, held):
    """The race of the test below made certain: another session (another catalog's
    migration) has set the reader's settings in a transaction still open while a new
    catalog migrates. The migration must wait for it (observed: its backend waits on a
    lock), then, once the other side commits, reach head instead of failing with "tuple
    concurrently updated" (the CI failure of migration 0022's temp_file_limit)."""
    import subprocess
    import sys
    from pathlib import Path

    from schema.engine import current_revision, head_revision

    server = make_url(pg_server).set(drivername="postgresql", database="postgres") \
        .render_as_string(hide_password=False)
    migrate(scratch := new_database_url(pg_server))  # the role exists with its settings
    drop_database(scratch)
    url = new_database_url(pg_server)
    name = make_url(url).database
    holder = psycopg.connect(server)
    proc = None
    try:
        with psycopg.connect(server, autocommit=True) as admin:
            for k in held:
                admin.execute(f"ALTER ROLE catalog_reader RESET {k}")
        for k in held:
            holder.execute(f"ALTER ROLE catalog_reader SET {k} = '{READER_SETTINGS[k]}'")
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from schema.engine import migrate; "
             "migrate(sys.argv[1])", url],
            cwd=Path(__file__).parents[2], stderr=subprocess.PIPE, text=True)
        waited = False
        deadline = time.monotonic() + 180
        with psycopg.connect(server, autocommit=True) as watch:
            while proc.poll() is None and time.monotonic() < deadline and not waited:
                waited = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND wait_event_type = 'Lock'", (name,)).fetchone()[0] > 0
                time.sleep(0.05)
        assert waited, ("the migration never waited on the held settings", proc.poll())
        time.sleep(0.5)  # it stays blocked while the other transaction is open
        assert proc.poll() is None
        holder.commit()
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
        assert current_revision(url) == head_revision()
        with psycopg.connect(server) as conn:
            settings = conn.execute(
                "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r "
                "ON r.oid = s.setrole WHERE r.rolname = 'catalog_reader' "
                "AND s.setdatabase = 0").fetchone()[0]
        assert {f"{k}={v}" for k, v in READER_SETTINGS.items()} <= set(settings)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        holder.rollback()
        holder.close()
        with psycopg.connect(server, autocommit=True) as admin:  # the server as it was
            for k in held:
                admin.execute(f"ALTER ROLE catalog_reader SET {k} = '{READER_SETTINGS[k]}'")
        drop_database(url)


def test_catalogs_on_one_server_migrate_at_the_same_time(pg_server):
    """The analysts' role and its settings belong to the whole server, so two catalogs
    migrated at once both create and configure it. Alembic runs a database's migrations in
    one transaction, so the second ALTER ROLE waited for the first migration to commit and
    then failed with "tuple concurrently updated" (seen in CI, two test processes): three
    databases migrated by three processes at the same moment must all reach head, and the
    role must keep its read-only default and its timeout."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from schema.engine import current_revision, head_revision

    urls = [new_database_url(pg_server) for _ in range(3)]
    go = time.time() + 8  # every process imported and connected before it starts
    script = ("import sys, time; from schema.engine import migrate, make_engine; "
              "make_engine(sys.argv[1]).dispose(); "
              "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); migrate(sys.argv[1])")
    try:
        procs = [subprocess.Popen([sys.executable, "-c", script, u, str(go)],
                                  cwd=Path(__file__).parents[2], stderr=subprocess.PIPE,
                                  text=True) for u in urls]
        failed = [(u, p.stderr.read()[-2000:]) for u, p in zip(urls, procs, strict=True)
                  if p.wait(timeout=300) != 0]
        assert not failed, failed
        assert [current_revision(u) for u in urls] == [head_revision()] * len(urls)
        with store.connect(urls[0]) as conn:
            settings = store.scalar(conn.execute(
                "SELECT s.setconfig FROM pg_db_role_setting s JOIN pg_roles r "
                "ON r.oid = s.setrole WHERE r.rolname = 'catalog_reader' "
                "AND s.setdatabase = 0"))
        assert {"default_transaction_read_only=on", "statement_timeout=10s"} <= set(settings)
    finally:
        for u in urls:
            drop_database(u)


def test_reader_through_psql_cannot_escape_its_limits(db):
    """Issue 31.5: what a catalog_reader session could do through psql, now refused: turn
    read-only off and create a temporary table, raise temp_file_limit, run a DO block,
    end or cancel another analyst's session, read other sessions' query text; and a
    statement whose session raised its own timeout is cancelled by the reconciler's guard."""
    import threading

    from schema.console import cancel_overdue_readers, reader_timeout

    with store.connect(reader_url(db), autocommit=True) as other, \
            store.connect(reader_url(db), autocommit=True) as conn:
        other.execute("SELECT 'secret text of another analyst'")
        other_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert conn.execute("SHOW temp_file_limit").fetchone()[0] == "1GB"
        refused = [
            ["SET default_transaction_read_only = off", "CREATE TEMP TABLE t (x int)"],
            ["SET temp_file_limit = -1"],
            ["DO $$ BEGIN PERFORM 1; END $$"],
            [f"SELECT pg_terminate_backend({other_pid})"],
            [f"SELECT pg_cancel_backend({other_pid})"],
            ["SELECT query FROM pg_stat_activity"],
            ["SELECT * FROM pg_stat_get_activity(NULL)"],
        ]
        for statements in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                for sql in statements:
                    conn.execute(sql)
            conn.execute("RESET ALL")
        assert conn.execute("SELECT current_query()").fetchone()[0]  # its own, still
        assert other.execute("SELECT 1").fetchone()[0] == 1  # the other session lives
        # a session may raise its own statement_timeout; the guard cancels it anyway
        conn.execute("SET statement_timeout = 0")
        caught: list = []

        def long_query():
            try:
                conn.execute("SELECT pg_sleep(60)")
            except psycopg.Error as exc:
                caught.append(exc)

        worker = threading.Thread(target=long_query)
        worker.start()
        time.sleep(1.5)
        with store.connect(db, autocommit=True) as owner:
            assert reader_timeout(owner) == 10.0
            assert cancel_overdue_readers(owner) == []  # within 10 s + grace: left alone
            assert len(cancel_overdue_readers(owner, limit_s=1.0)) == 1
        worker.join(10)
        assert not worker.is_alive()
        assert caught and isinstance(caught[0], psycopg.errors.QueryCanceled)


def test_idle_reader_sessions_and_long_transactions_are_ended(db):
    """Issue 80.8: 24 idle psql sessions kept every analyst out for ever, and a cursor ran
    one query for 63 s in fetches each under the statement timeout. The role's defaults
    (migration 0038) end them on the server itself, and the reader guard keeps a session
    from turning its own off (tests/integration/test_reader_guard.py); where a server has
    no guard a session may, so the reconciler's pass (bound_readers) ends them too. Such
    a server is stood for here by the database's own settings for the role, which turn
    the timeouts off (an administrator's setting: the guard does not hold it): an idle
    session and a cursor held open past their bounds (shortened here) are ended, a busy
    fresh session and the owner's are not."""
    from schema.console import bound_readers, reader_setting_s

    with store.connect(db, autocommit=True) as owner:
        version = owner.execute("SHOW server_version_num").fetchone()[0]
        assert reader_setting_s(owner, "idle_session_timeout", "0") == 600.0
        assert reader_setting_s(owner, "idle_in_transaction_session_timeout", "0") == 60.0
        if int(version) >= 170000:
            assert reader_setting_s(owner, "transaction_timeout", "0") == 300.0
        name = owner.execute("SELECT current_database()").fetchone()[0]
        for setting in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
            owner.execute(f'ALTER ROLE catalog_reader IN DATABASE "{name}" SET {setting} = 0')
    with store.connect(reader_url(db), autocommit=True) as idle, \
            store.connect(reader_url(db)) as cursor_holder, \
            store.connect(reader_url(db), autocommit=True) as fresh, \
            store.connect(db, autocommit=True) as owner:
        assert idle.execute("SHOW idle_session_timeout").fetchone()[0] == "0"
        assert cursor_holder.execute("SHOW idle_in_transaction_session_timeout"
                                     ).fetchone()[0] == "0"
        cursor_holder.rollback()
        cur = cursor_holder.cursor(name="pieces")
        cur.execute("SELECT g FROM generate_series(1, 100000) g")
        for _ in range(4):  # each fetch well under the statement timeout
            assert len(cur.fetchmany(10)) == 10
            time.sleep(0.5)
        nothing = bound_readers(owner, idle_s=30, transaction_s=30)  # none past 30 s
        assert (nothing.idle, nothing.long) == ([], [])
        time.sleep(1.0)
        fresh.execute("SELECT 1")
        done = bound_readers(owner, idle_s=1.5, transaction_s=2.0)
        pids = {name: c.info.backend_pid for name, c in (("idle", idle),
                                                         ("cursor", cursor_holder),
                                                         ("fresh", fresh))}
        assert pids["idle"] in done.idle and pids["fresh"] not in done.idle
        assert done.long == [pids["cursor"]]
        with pytest.raises(psycopg.OperationalError):
            cur.fetchmany(10)
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
        assert fresh.execute("SELECT 2").fetchone()[0] == 2
        assert owner.execute("SELECT 3").fetchone()[0] == 3


def test_reader_limits_hold_in_the_psql_binary(db):
    """The documented access: psql as catalog_reader. Each escape of issue 31.5 is refused
    there too (permission denied), and an ordinary query still answers."""
    import shutil
    import subprocess

    psql = shutil.which("psql")
    assert psql, "psql is missing: scripts/setup.sh installs postgresql-client"
    url = reader_url(db).replace("postgresql+psycopg://", "postgresql://")
    script = "\n".join([
        "SELECT count(*) AS settings FROM catalog_setting;",
        "SET default_transaction_read_only = off;",
        "CREATE TEMP TABLE t (x int);",
        "SET temp_file_limit = -1;",
        "DO $$ BEGIN PERFORM 1; END $$;",
        "SELECT pg_terminate_backend(pg_backend_pid());",
        "SELECT query FROM pg_stat_activity;",
    ])
    out = subprocess.run([psql, url, "-X", "-A", "-t"], input=script, capture_output=True,
                         text=True, timeout=60)
    # the ordinary query answers; turning read-only off is allowed, and gains nothing
    assert out.stdout.split() == ["2", "SET"], out
    denied = [line for line in out.stderr.splitlines() if "permission denied" in line]
    assert len(denied) == 5, out.stderr


@pytest.mark.serial  # holds every reader slot of the server while it runs
def test_readers_cannot_take_the_workers_connections_nor_read_other_queries(db):
    """Issue 49.5: 89 idle reader connections took every slot of the server and the
    workers' heartbeats failed. The role's connection limit (migration 0028: a quarter of
    the non-superuser slots) refuses the next reader, and a worker still connects and
    beats; a reader cannot read another session's query text by backend slot either."""
    with store.connect(db) as conn:
        limit = conn.execute("SELECT rolconnlimit FROM pg_roles "
                             "WHERE rolname = 'catalog_reader'").fetchone()[0]
        slots = conn.execute("SELECT current_setting('max_connections')::int - "
                             "current_setting('superuser_reserved_connections')::int"
                             ).fetchone()[0]
    assert limit == max(1, slots // 4), (limit, slots)
    readers: list = []
    try:
        # other tests' readers may hold some slots: connect until refused
        with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
            for _ in range(limit + 1):
                readers.append(store.connect(reader_url(db), autocommit=True))
        assert 0 < len(readers) <= limit
        # the console says why, not a driver's traceback
        with pytest.raises(console.ConsoleError, match="connection limit"):
            console.run(db, "SELECT 1")
        readers[0].execute("SELECT 'secret text of another analyst'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            readers[1].execute("SELECT pg_stat_get_backend_activity(s) "
                               "FROM pg_stat_get_backend_idset() s")
        # a worker's heartbeat: its own connection, an update
        with store.connect(db, autocommit=True, connect_timeout=10) as worker:
            worker.execute("UPDATE job_layer SET heartbeat_at = now() WHERE job_id = -1")
            assert worker.execute("SELECT 1").fetchone()[0] == 1
    finally:
        for r in readers:
            r.close()


def test_the_url_the_demo_prints_is_one_psql_connects_with(db):
    """``psql_url`` (what the demo and ``ncat demo`` print) of the catalog database's
    SQLAlchemy URL: psql accepts it as written (it rejected ``postgresql+psycopg://``)."""
    import shutil
    import subprocess

    from schema.database import psql_url, with_driver

    psql = shutil.which("psql")
    assert psql, "psql (postgresql-client) is installed with the project's services"
    shown = psql_url(with_driver(db))
    assert shown.startswith("postgresql://") and "+psycopg" not in shown
    import os

    secret = make_url(db).password  # hidden in the URL: the user gives it as libpq reads it
    env = {**os.environ, **({"PGPASSWORD": str(secret)} if secret else {})}
    shown = shown.replace(":***@", "@")
    out = subprocess.run([psql, shown, "-At", "-c", "SELECT 40 + 2"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42"
    rejected = subprocess.run([psql, with_driver(db), "-At", "-c", "SELECT 1"],
                              capture_output=True, text=True, timeout=60, env=env)
    assert rejected.returncode != 0  # what the demo printed before


def test_each_checkpoint_keeps_its_check_against_transformers(db, pythia_hub, tiny_builtin):
    """Issue 50: the load's difference from transformers was computed and dropped. A hub
    checkpoint's row keeps it (small, under the 0.01 nats the load allows); the built-in
    model, which has no transformers counterpart, has none; a later registration that
    compared nothing keeps the stored value."""
    cfg, root = tiny_builtin
    hub = load_model(pythia_hub, 1000, progress=False)
    own = load_model("builtin", cfg.steps, builtin_config=cfg, cache_root=root)
    assert hub.info.transformers_nats is not None and 0 <= hub.info.transformers_nats < 1e-2
    assert own.info.transformers_nats is None
    # what `ncat measure` and `ncat catalog` print after each load
    assert hub.info.check.startswith(f"next-token log-probabilities within "
                                     f"{hub.info.transformers_nats:.2g} nats")
    assert own.info.check == "not compared with transformers (no counterpart there)"
    config = ScienceConfig(operand_hi=10)
    with store.connect(db, autocommit=True) as conn:
        ids = register(conn, hub, config)
        mine = register(conn, own, config)
        got = dict(conn.execute("SELECT id, transformers_nats FROM checkpoint").fetchall())
        assert got[ids.checkpoint_id] == pytest.approx(hub.info.transformers_nats, rel=1e-6)
        assert got[mine.checkpoint_id] is None
        store.upsert_checkpoint(conn, model_id=ids.model_id, step=1000, revision="step1000",
                                weights_hash=hub.info.weights_hash)
        kept = conn.execute("SELECT transformers_nats FROM checkpoint WHERE id = %s",
                            (ids.checkpoint_id,)).fetchone()[0]
        assert kept == got[ids.checkpoint_id]
