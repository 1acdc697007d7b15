"""The README's worked example of `ncat plan`: a Pythia suite on the paper's grid.

The hub is unreachable here, so the model is the offline Pythia-14m-shaped stand-in
(random weights, Pythia-14m's shapes and tokenizer; tests/offline_models.py) at one
step, and the estimate is scaled to the 154 checkpoints Pythia publishes per model
(every checkpoint of a model has the same shapes). Calibrates on this machine's CPU.

Run: .venv/bin/python bench/plan_pythia.py [--hi 300] [--device cpu]
"""

from __future__ import annotations

import argparse
import dataclasses

from _common import offline_pythia, save

PYTHIA_CHECKPOINTS = 154


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hi", type=int, default=300)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import tempfile
    from pathlib import Path

    from catalog.config import ExecutionConfig, ScienceConfig
    from jobs.plan import plan_request
    from schema.database import resolve_database_url

    repo = offline_pythia()
    plan = plan_request(resolve_database_url(), repo, "1000", ScienceConfig(operand_hi=args.hi),
                        execution=ExecutionConfig(device=args.device),
                        home=Path(tempfile.mkdtemp(prefix="ncat-plan-")),
                        progress=lambda m: print(m, flush=True))
    assert plan is not None
    suite = dataclasses.replace(plan, checkpoints=PYTHIA_CHECKPOINTS)
    print(suite.render())
    save("plan_pythia", {
        "model": repo, "hi": args.hi, "device": args.device,
        "seconds_per_checkpoint": round(plan.seconds_per_checkpoint, 1),
        "bytes_per_checkpoint": round(plan.bytes_per_checkpoint),
        "phases": {p.name: round(p.seconds, 1) for p in plan.phases},
        "storage": {t: round(b) for t, b in plan.storage.items()},
        "suite_checkpoints": PYTHIA_CHECKPOINTS,
        "suite_hours": round(plan.seconds_per_checkpoint * PYTHIA_CHECKPOINTS / 3600, 1),
        "suite_gb": round(plan.bytes_per_checkpoint * PYTHIA_CHECKPOINTS / 1e9, 2),
        "calibration_s": plan.calibration.calibration_s,
    })


if __name__ == "__main__":
    main()
