"""A login the server refuses is its own cause, with its own exit code (5, docs/cli.md),
said at once with the server's reason, in every command; a real PostgreSQL (and, in
tests/integration/test_reader_scram.py, a wrong password on a password server)."""

import pytest

from jobs.cli import LOGIN_REFUSED, main


@pytest.mark.parametrize("argv", [
    ["status"], ["cancel", "1"], ["retry", "1"], ["migrate"],
    ["enqueue", "builtin", "--checkpoints", "0"],
    ["export", "neuron_evolution", "--out", "{tmp}/out.csv"],
], ids=lambda a: a[0])
def test_a_refused_login_exits_5_at_once_with_the_servers_reason(argv, pg_server,
                                                                  monkeypatch, tmp_path,
                                                                  capsys):
    """Issue 80.6 and 80.7: a login the server refuses (here an unknown role; a wrong
    password takes the same path) made `enqueue` exit 2 ("not migrated"), `status`,
    `cancel` and `retry` exit 3, and `migrate` retry for 30 s and say the server "did not
    answer". Every command now exits 5 at once with the server's reason."""
    import time

    from sqlalchemy.engine import make_url

    monkeypatch.setenv("DATABASE_URL", make_url(pg_server).set(
        username="no_such_role", password=None, database="postgres").render_as_string(
        hide_password=False))
    t0 = time.monotonic()
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == LOGIN_REFUSED == 5
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the login" in err[0], err
    assert 'role "no_such_role" does not exist' in err[0] or "catalog databases" in err[0]
    assert not (tmp_path / "out.csv").exists()


def test_report_says_a_refused_login_before_its_heavy_imports(pg_server, tmp_path):
    """`ncat report` imported the report's plotting and science (8 s) before it asked the
    database, so a refused login took 8 s to say; the database is asked first: the
    refusal comes with nothing of the report imported (torch, plotly), exit 5."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from sqlalchemy.engine import make_url

    url = make_url(pg_server).set(username="no_such_role", password=None).render_as_string(
        hide_password=False)
    code = ("import sys\nfrom jobs.cli import main\n"
            f"rc = main(['report', 'builtin', '--out', {str(tmp_path / 'r')!r}, "
            f"'--database-url', {url!r}])\n"
            "print(rc, 'torch' in sys.modules, 'plotly' in sys.modules, "
            "'reports.report' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2],
                          env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"})
    assert done.stdout.split() == ["5", "False", "False", "False"], (done.stdout, done.stderr)
    assert "refused the login" in done.stderr and not (tmp_path / "r").exists()
