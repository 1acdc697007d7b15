"""Command-line export of views and queries, and cataloging through the CLI."""

import pandas as pd

from jobs.cli import main
from schema import store


def count(url, sql):
    with store.connect(url) as conn:
        return conn.execute(sql).fetchone()[0]


def test_export_view_to_parquet_and_query_to_csv(seeded, tmp_path, capsys):
    out = tmp_path / "evolution.parquet"
    assert main(["export", "neuron_evolution", "--out", str(out), "--database-url", seeded]) == 0
    df = pd.read_parquet(out)
    assert len(df) == count(seeded, "SELECT count(*) FROM neuron_evolution") > 0
    assert {"model", "step", "layer", "neuron", "op", "effect_exact"} <= set(df.columns)
    csv = tmp_path / "census.csv"
    query = "SELECT step, family, circuit_neurons FROM heuristic_census WHERE op = '+'"
    assert main(["export", query, "--out", str(csv), "--database-url", seeded]) == 0
    back = pd.read_csv(csv)
    assert len(back) == count(seeded, "SELECT count(*) FROM heuristic_census WHERE op = '+'")
    assert f"{len(back)} rows written" in capsys.readouterr().out


def test_export_refuses_bad_format_and_writes(seeded, tmp_path, capsys):
    assert main(["export", "neuron_op", "--out", str(tmp_path / "x.xlsx"),
                 "--database-url", seeded]) == 2
    assert "unknown export format 'xlsx'" in capsys.readouterr().err
    before = count(seeded, "SELECT count(*) FROM heuristic")
    assert main(["export", "DELETE FROM heuristic RETURNING id", "--out",
                 str(tmp_path / "x.csv"), "--database-url", seeded]) == 2
    assert "read-only transaction" in capsys.readouterr().err
    assert count(seeded, "SELECT count(*) FROM heuristic") == before
    # a view that does not exist: one line (the server's caret lines were printed too)
    assert main(["export", "neuron_summary", "--out", str(tmp_path / "y.csv"),
                 "--database-url", seeded]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: export of 'neuron_summary' failed: relation \"neuron_summary\" "
                   "does not exist"), err


def test_catalog_command_stores_checkpoints(db, tiny_builtin, capsys, monkeypatch):
    from catalog.builtin import model_name

    cfg, root = tiny_builtin
    # the tiny built-in model (by its variant name, from its cache folder): the real path
    monkeypatch.setenv("NCAT_HOME", str(root.parent))
    code = main(["catalog", model_name(cfg), "--checkpoints", "128,300", "--hi", "12",
                 "--pairs", "5", "--quiet", "--database-url", db])
    assert code == 0, capsys.readouterr().err
    assert count(db, "SELECT count(*) FROM layer_result") == 2 * 2
    assert count(db, "SELECT count(*) FROM checkpoint_summary") == 2
    assert count(db, "SELECT count(DISTINCT step) FROM neuron_evolution") == 2
    assert main(["catalog", "builtin", "--checkpoints", "1:0:0", "--database-url", db]) == 2
    assert "start:stop:step" in capsys.readouterr().err


def test_commands_that_write_ask_for_a_migration_instead_of_migrating(empty_db, capsys):
    """Only `ncat migrate` (and the demo) change the schema; catalog and enqueue say what
    to run, with exit code 2, and write nothing."""
    for argv in (["catalog", "builtin", "--hi", "12"], ["enqueue", "builtin", "--hi", "12"]):
        assert main(argv + ["--database-url", empty_db]) == 2
        err = capsys.readouterr().err
        assert "is not migrated" in err and "run `ncat migrate`" in err, err
    assert count(empty_db, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    # a URL with a password (the test server trusts local connections and ignores it):
    # `ncat migrate` says where it migrated and never prints the password
    from sqlalchemy.engine import make_url

    secret = make_url(empty_db).set(password="s3cr3t-pw").render_as_string(hide_password=False)
    assert main(["migrate", "--database-url", secret]) == 0
    out = capsys.readouterr().out
    assert "database migrated to head" in out and "s3cr3t-pw" not in out, out
    # the password in the query string, as libpq also takes it: migrate and status say
    # where, with the password starred
    in_query = f"{empty_db}?sslmode=disable&password=s3cr3t-qs"
    for argv in (["migrate"], ["status"]):
        assert main(argv + ["--database-url", in_query]) == 0
        said = capsys.readouterr()
        assert "s3cr3t-qs" not in said.out + said.err, said
        if argv == ["migrate"]:
            assert "?sslmode=disable&password=***\n" in said.out, said.out
    with store.connect(empty_db, autocommit=True) as conn:  # an older schema
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    assert main(["catalog", "builtin", "--hi", "12", "--database-url", empty_db]) == 2
    assert "is at revision 0001" in capsys.readouterr().err
