"""A new process's first demo checkpoint (the built-in model, `+ - * /` on [0, 100), the
demo's config, one thread), with the label rule's fits built in the process (the store
off: ``NCAT_FIT_CACHE_BYTES=0``, how every process started before the store) and read
from the store another process filled (``catalog.labels.fit_store``), each way in a new
process per run, taking turns. Every run loads the checkpoint first (not timed), then
times one ``measure`` and prints a digest of what it measured (the same digest as
bench/demo_checkpoint.py), so the report says whether both ways gave the same catalog.

Reported: each way's median and spread (min-max) over the runs and their ratio. The store
lives in a temporary home (filled by one untimed run first), never the user's. Run on an
idle machine:

    .venv/bin/python bench/cold_checkpoint.py [--runs 5] [--step 2048] [--record]

(bench/results/cold_checkpoint.json; --record: bench/recorded/cpu_cold_checkpoint.json)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, code_env, median_spread, save


def _child(step: int) -> None:
    import torch

    torch.set_num_threads(1)
    from catalog import load_model, measure
    from jobs.demo import DEMO_CONFIG

    sys.path.insert(0, str(Path(__file__).parent))
    from demo_checkpoint import _digest

    lm = load_model("builtin", step, progress=False)
    t0 = time.perf_counter()
    res = measure(lm.model, lm.tokenizer, DEMO_CONFIG, progress=False)
    print(f"{time.perf_counter() - t0:.3f} {_digest(res)}", flush=True)


def _run(step: int, store: Path, on: bool) -> tuple[float, str]:
    """One new process's first checkpoint: (seconds, digest)."""
    env = {**code_env(ROOT, 1), "NCAT_FIT_CACHE_BYTES": str(8 << 30) if on else "0"}
    # the model from the user's home, the fits from the bench's own store
    env["NCAT_HOME"] = str(store)
    done = subprocess.run([sys.executable, __file__, "--child", "--step", str(step)],
                          env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    seconds, digest = done.stdout.split()[-2:]
    return float(seconds), digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--step", type=int, default=2048)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.step)
        return
    from catalog.config.settings import get_settings

    with tempfile.TemporaryDirectory(prefix="ncat-bench-home-") as tmp:
        home = Path(tmp)
        # the built-in checkpoints of the user's home, linked in (nothing is trained)
        os.symlink(get_settings().builtin_root, home / "builtin")
        print("filling the store (one untimed run) ...", flush=True)
        _run(args.step, home, True)
        got: dict[str, list] = {"built": [], "stored": []}
        for r in range(args.runs):
            for way in (("built", "stored") if r % 2 == 0 else ("stored", "built")):
                got[way].append(_run(args.step, home, way == "stored"))
                print(way, got[way][-1], flush=True)
        size = sum(p.stat().st_size for p in (home / "fits").glob("*.pt"))

    out: dict = {"cores": 1, "step": args.step, "runs": args.runs, "store_bytes": size}
    for way, xs in got.items():
        med, spread = median_spread([s for s, _ in xs], 2)
        out[way] = {"median_s": med, "min_max_s": spread, "runs_s": [s for s, _ in xs],
                    "digests": sorted({d for _, d in xs})}
    out["speedup built / stored"] = out["built"]["median_s"] / out["stored"]["median_s"]
    out["equal catalogs"] = (out["built"]["digests"] == out["stored"]["digests"]
                             and len(out["built"]["digests"]) == 1)
    save("cold_checkpoint", out, "cpu_cold_checkpoint" if args.record else None)


if __name__ == "__main__":
    main()
