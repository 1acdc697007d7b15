"""`--json` prints what the table or status line says, as one JSON object a program can
read (issue 81): each command's object checked against the library or the database, on
the tiny built-in model and a real PostgreSQL; notes and progress go to stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from catalog.builtin import available_steps, model_name
from schema import store
from schema.engine import head_revision

ROOT = Path(__file__).resolve().parents[2]


def ncat(home: Path, *argv: str) -> tuple[int, dict, str]:
    """Run ``ncat ARGV --json`` with ``home`` as NCAT_HOME: (exit code, the one JSON
    object on stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "jobs.cli", *argv, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NCAT_HOME": str(home)})
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    assert len(lines) == 1, done.stdout  # one object, nothing else on stdout
    return done.returncode, json.loads(lines[0]), done.stderr


def test_json_of_migrate_status_checkpoints_fetch_measure_catalog_and_plan(empty_db,
                                                                             tiny_builtin):
    cfg, root = tiny_builtin
    home, name = root.parent, model_name(cfg)
    rc, d, err = ncat(home, "migrate", "--database-url", empty_db)
    assert rc == 0 and d["revision"] == head_revision() and isinstance(d["reader_guard"], bool)
    assert d["url"].startswith("postgresql://") and "database migrated" in err
    rc, d, _ = ncat(home, "status", "--database-url", empty_db)
    assert rc == 0 and d == {"jobs": [], "stale": [], "reconciler": []}
    rc, d, _ = ncat(home, "checkpoints", name)
    assert rc == 0 and d["steps"] == available_steps(cfg, root)
    rc, d, _ = ncat(home, "fetch", "--list")
    from catalog.sources import registry

    assert rc == 0 and [m["name"] for m in d["models"]] == list(registry.KNOWN)
    flags = ["--ops", "+", "--hi", "12", "--pairs", "6", "--faithfulness-prompts", "30",
             "--quiet"]
    rc, measured, err = ncat(home, "measure", name, *flags)
    assert rc == 0, err
    assert "summary over layers" in err  # the table, as notes
    rc, d, err = ncat(home, "catalog", name, *flags, "--database-url", empty_db)
    assert rc == 0, err
    (stored,) = d["checkpoints"]
    assert stored["stored"] == "now" and stored["step"] == max(available_steps(cfg, root))
    with store.connect(empty_db) as conn:
        acc = store.scalar(conn.execute(
            "SELECT accuracy FROM checkpoint_summary WHERE checkpoint_id = %s",
            (stored["checkpoint_id"],)))
        labels = dict(conn.execute(
            "SELECT layer, count(*) FROM neuron_score WHERE checkpoint_id = %s AND "
            "implements GROUP BY layer", (stored["checkpoint_id"],)).fetchall())
    # measure's JSON is the catalogued checkpoint's summary and label counts
    assert measured["summary"]["accuracy"]["+"] == acc["+"]
    assert {int(k): v["labels"] for k, v in measured["layers"].items() if v["labels"]} \
        == labels
    for layer in measured["layers"].values():
        top = layer["top"]["+"]  # the five first by the layer's rank, as the table lists
        assert len({r["neuron"] for r in top}) == 5
        assert all(set(r) >= {"neuron", "effect", "exact", "label"} for r in top)
    # the bulk load left statistics on every table it wrote, the summary's too: without
    # them (autovacuum off, or not yet by) a documented query planned nested loops over
    # "empty" tables and took 13 s on the demo's catalog
    from schema.store import ANALYZED

    with store.connect(empty_db) as conn:
        unanalyzed = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(%s) AND "
            "last_analyze IS NULL AND last_autoanalyze IS NULL", (list(ANALYZED),))]
    assert unanalyzed == []
    rc, d, _ = ncat(home, "catalog", name, *flags, "--database-url", empty_db)
    assert rc == 0 and d["checkpoints"][0]["stored"] == "before"
    rc, d, err = ncat(home, "plan", name, *flags, "--database-url", empty_db)
    assert rc == 0, err
    assert d["model"] == name and d["seconds"] > 0 and d["bytes"] > 0
    assert d["seconds"] == sum(p["seconds"] for p in d["phases"]) * d["checkpoints"]
