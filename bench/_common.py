"""Helpers shared by the benchmarks: timing, the offline Pythia model, result files."""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Read once by huggingface_hub at import: set before anything imports catalog.
_HF_CACHE = Path(tempfile.mkdtemp(prefix="ncat-bench-hf-"))
os.environ["HF_HUB_CACHE"] = str(_HF_CACHE)
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the slow reference implementations live there
RESULTS = ROOT / "bench" / "results"


def offline_pythia():
    """Write the Pythia-14m-shaped model into the benchmark's offline cache; return the repo."""
    from offline_models import PYTHIA_REPO, write_pythia_cache

    write_pythia_cache(_HF_CACHE, [1000])
    return PYTHIA_REPO


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(best wall time in seconds over ``repeat`` runs, last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def median_spread(values, digits: int = 1) -> tuple[float, list[float]]:
    """(median, [min, max]) of repeated measurements, rounded: how the README reports them."""
    import statistics

    return (round(statistics.median(values), digits),
            [round(min(values), digits), round(max(values), digits)])


def save(name: str, data: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(json.dumps(data, indent=2))
