"""How close `ncat plan` comes: estimate, then catalog the same request and compare.

For each case, each run calibrates afresh (an empty cache), estimates, then catalogs the
request into a fresh database and measures the wall time and the four measurement
tables (pg_total_relation_size after VACUUM ANALYZE, less the empty tables'). Reports
per case the median and range over the runs of estimated / measured time and of the
storage error.

Cases: the built-in model (2 x 512 neurons) on the demo's config (operands [0, 100));
the Pythia-14m-shaped offline model (6 x 512) on [0, 70) with exact patching of the
top 64 per layer and operator.

Run: .venv/bin/python bench/plan_accuracy.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from _common import offline_pythia, save

TABLES = ("neuron_op", "neuron_grid", "neuron_lens", "neuron_score")


def _measure(server: str, lm, config) -> tuple[float, int]:
    from jobs.store_results import catalog_checkpoint
    from schema import reads, store
    from schema.engine import migrate, scratch_url

    url = scratch_url(server, f"ncat_acc_{uuid.uuid4().hex[:8]}")
    migrate(url)
    try:
        with store.connect(url) as conn:
            base = sum(reads.table_bytes(conn, t) for t in TABLES)
        t = time.perf_counter()
        catalog_checkpoint(url, lm, config)
        seconds = time.perf_counter() - t
        with store.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            return seconds, sum(reads.table_bytes(conn, t) for t in TABLES) - base
    finally:
        store.drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from catalog import builtin
    from catalog.config import ScienceConfig
    from catalog.sources import load_model
    from jobs.plan import plan_request
    from schema.database import resolve_database_url

    server = resolve_database_url()
    cfg = builtin.TrainConfig()
    builtin.train(cfg)
    pythia = offline_pythia()
    cases = {
        "built-in, [0, 100), demo config": (builtin.model_name(cfg), str(cfg.steps),
                                            ScienceConfig(operand_hi=100)),
        "Pythia-14m shape, [0, 70), exact top:64": (
            pythia, "1000", ScienceConfig(operand_hi=70, pairs_per_op=30,
                                          faithfulness_prompts=60, exact="top:64")),
    }
    out = {}
    for name, (model, step, config) in cases.items():
        lm = load_model(model, int(step))
        runs = []
        for _ in range(args.runs):
            plan = plan_request(server, model, step, config,
                                home=Path(tempfile.mkdtemp(prefix="ncat-acc-")))
            assert plan is not None
            seconds, size = _measure(server, lm, config)
            runs.append({"estimated_s": round(plan.seconds_per_checkpoint, 1),
                         "measured_s": round(seconds, 1),
                         "time_ratio": round(plan.seconds_per_checkpoint / seconds, 2),
                         "estimated_bytes": round(plan.bytes_per_checkpoint),
                         "measured_bytes": size,
                         "storage_error": round(plan.bytes_per_checkpoint / size - 1, 3),
                         "calibration_s": plan.calibration.calibration_s})
            print(name, runs[-1], flush=True)
        ratios = [r["time_ratio"] for r in runs]
        errors = [r["storage_error"] for r in runs]
        out[name] = {"runs": runs,
                     "time_ratio_median": statistics.median(ratios),
                     "time_ratio_range": [min(ratios), max(ratios)],
                     "storage_error_median": statistics.median(errors),
                     "storage_error_range": [min(errors), max(errors)]}
    save("plan_accuracy", out)


if __name__ == "__main__":
    main()
