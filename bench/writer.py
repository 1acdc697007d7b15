"""Bulk writer throughput: write_layer (COPY to staging + upsert, one transaction) against a
plain COPY of the same rows into tables with the same columns, in the same run.

Run: .venv/bin/python bench/writer.py [--runs N]   (target: >= 50% of plain COPY)
Each run writes the layer both ways back to back, then once more through the writer with
the lens's arrays adapted by psycopg as Python lists (the writer before ``store.real_array``,
restored for that write only); the report gives medians over the runs and the spread
(min-max) of each time and of the per-run shares.
"""

import time
import uuid

import numpy as np
import torch

from catalog import builtin
from catalog.config import ScienceConfig
from catalog.run.checkpoint import CheckpointRun
from catalog.sources import load_model
from jobs.store_results import layer_rows, register, write_layouts
from schema import store
from schema.database import resolve_database_url
from schema.engine import migrate

from _common import over_runs, runs_option, save


def plain_copy(conn, ids, rows):
    """The same rows, COPYed into unindexed tables of the same columns (the floor)."""
    plain = {t: f"plain_{t}" for t in store.STAGING}
    with conn.transaction(), conn.cursor() as cur:
        for table, name in plain.items():
            cur.execute(f"CREATE TEMP TABLE {name} (LIKE {table}) ON COMMIT DROP")
        store.copy_layer_rows(conn, cur, key=(ids.model_id, ids.checkpoint_id, ids.config_id,
                                              rows.layer), rows=rows, into=plain)


def main(runs: int = 5):
    builtin.train(builtin.TrainConfig())
    lm = load_model("builtin")
    config = ScienceConfig(operand_hi=100)
    prep = CheckpointRun(lm.model, lm.tokenizer, config).prepare()
    layer = prep.run_layer(1)
    rows = layer_rows(layer, prep, lm.tokenizer)
    n_rows = 2 * rows.d_mlp * len(rows.ops) + rows.d_mlp + len(rows.matches.score)
    server = resolve_database_url()
    url = server.rsplit("/", 1)[0] + f"/ncat_bench_{uuid.uuid4().hex[:8]}"
    migrate(url)
    per_run = []
    with store.connect(url) as conn:
        ids = register(conn, lm, config)
        write_layouts(conn, prep, ids)
        for _ in range(runs):
            t = time.perf_counter()
            plain_copy(conn, ids, rows)
            p = time.perf_counter() - t
            t = time.perf_counter()
            store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                              config_id=ids.config_id, rows=rows)
            w = time.perf_counter() - t
            lists = store.real_array
            store.real_array = lambda v: np.asarray(v, dtype=np.float32).tolist()
            try:
                t = time.perf_counter()
                store.write_layer(conn, model_id=ids.model_id, checkpoint_id=ids.checkpoint_id,
                                  config_id=ids.config_id, rows=rows)
                before = time.perf_counter() - t
            finally:
                store.real_array = lists
            per_run.append({"writer_s": w, "plain_copy_s": p, "writer_share_of_plain_copy": p / w,
                            "writer_with_lists_s": before, "lists_over_writer": before / w,
                            "writer_rows_per_s": n_rows / w, "plain_copy_rows_per_s": n_rows / p})
    with store.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    save("writer", {"rows_per_layer": n_rows, "runs": runs,
                    **over_runs(per_run, tuple(per_run[0])), "threads": torch.get_num_threads()})


if __name__ == "__main__":
    main(runs_option())
