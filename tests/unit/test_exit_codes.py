"""Every command that needs the catalog database exits 3 when no server answers at
DATABASE_URL (docs/cli.md's exit codes), with one line naming the URL; nothing else runs
first (no model is loaded, nothing is written)."""

import pytest

from jobs.cli import UNREACHABLE, main

CLOSED = "postgresql://postgres@127.0.0.1:1/ncat"  # nothing listens on port 1


@pytest.mark.parametrize("argv", [
    ["status"],
    ["cancel", "1"],
    ["retry", "1"],
    ["enqueue", "builtin", "--checkpoints", "0"],
    ["catalog", "builtin", "--checkpoints", "0", "--hi", "10"],
    ["export", "neuron_evolution", "--out", "{tmp}/out.csv"],
    ["report", "builtin"],
    ["plan", "builtin", "--checkpoints", "0"],
], ids=lambda a: a[0])
def test_an_unreachable_database_exits_3(argv, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DATABASE_URL", CLOSED)
    assert UNREACHABLE == 3
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == UNREACHABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "127.0.0.1:1" in err[0], err
    assert not (tmp_path / "out.csv").exists()


def test_a_demo_whose_job_failed_exits_1_and_names_the_job(monkeypatch, capsys):
    """Exit code 1 (docs/cli.md): the command ran but work failed. `ncat demo --no-serve`
    lists each failed job with its step and error on stderr and exits 1; with every job
    done it exits 0. (The catalog run itself is replaced here: what is tested is how the
    command reports its outcome; tests/integration/test_readme_commands.py runs the real
    one on a catalog it found done.)"""
    import jobs.demo

    outcome = {"jobs": 2, "layers": 4, "database_url": "postgresql://x/ncat",
               "failed": [(7, 512, "layer 1 was lost 3 time(s) while running")]}
    monkeypatch.setattr(jobs.demo, "catalog_all", lambda *a, **k: outcome)
    assert main(["demo", "--no-serve", "--quiet"]) == 1
    out = capsys.readouterr()
    assert "catalog ready" in out.out
    assert "job 7 (step 512) failed: layer 1 was lost 3 time(s) while running" in out.err
    outcome["failed"] = []
    assert main(["demo", "--no-serve", "--quiet"]) == 0
