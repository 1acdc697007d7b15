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
