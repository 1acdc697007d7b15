"""Bytes per neuron and operator of the catalog's tables, on the demo's catalog.

Catalogs the built-in model's checkpoints (the demo's: all 14 by default, operands
[0, 100), the demo's config) twice, into two fresh databases on the same server: once
storing every score >= the floor (`--scores-per-family 0`, what the catalog stored
before 0.3.0) and once with the default (the best per family plus every label). For
each: rows and bytes (table, indexes and TOAST, pg_total_relation_size over the
partitions) per (checkpoint, neuron, operator) of neuron_score, neuron_grid and
neuron_op. Needs a PostgreSQL server (NCAT_DATABASE_URL or localhost).

Run: .venv/bin/python bench/storage.py [--checkpoints all|0,1000,3000]
"""

from __future__ import annotations

import argparse
import time
import uuid

from _common import save

TABLES = ("neuron_score", "neuron_grid", "neuron_op", "neuron_lens")


def catalog_into(url: str, checkpoints: str, extra: list[str]) -> dict:
    from catalog import builtin
    from jobs.cli import main as ncat
    from schema import store
    from schema.engine import migrate

    migrate(url)
    t = time.perf_counter()
    code = ncat(["catalog", builtin.model_name(builtin.TrainConfig()), "--checkpoints",
                 checkpoints, "--hi", "100", "--quiet", "--database-url", url, *extra])
    assert code == 0, code
    seconds = time.perf_counter() - t
    try:
        return _sizes(url, seconds)
    finally:
        store.drop_database(url)


def _sizes(url: str, seconds: float) -> dict:
    from schema import reads, store

    with store.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        n_op = conn.execute("SELECT count(*) FROM neuron_op").fetchone()[0]
        out = {"catalog_s": round(seconds, 1), "neuron_op_rows": n_op}
        for table in TABLES:
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            size = reads.table_bytes(conn, table)
            out[table] = {"rows": rows, "bytes": size,
                          "rows_per_neuron_op": round(rows / n_op, 2),
                          "bytes_per_neuron_op": round(size / n_op, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", default="all")
    args = parser.parse_args()

    from catalog import builtin
    from schema.database import resolve_database_url

    builtin.train(builtin.TrainConfig())  # cached after the first time
    server = resolve_database_url().rsplit("/", 1)[0]
    results = {}
    for name, extra in (("every score >= floor", ["--scores-per-family", "0"]),
                        ("default (best per family + labels)", [])):
        url = f"{server}/ncat_storage_{uuid.uuid4().hex[:8]}"
        results[name] = catalog_into(url, args.checkpoints, extra)
    before, after = results.values()
    save("storage", {
        "checkpoints": args.checkpoints, "results": results,
        "neuron_score_ratio": round(before["neuron_score"]["bytes"]
                                    / after["neuron_score"]["bytes"], 2),
    })


if __name__ == "__main__":
    main()
