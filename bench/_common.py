"""Helpers shared by the benchmarks: timing, the offline Pythia model, result files."""

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
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


def runs_option(default: int = 5) -> int:
    """The ``--runs N`` of a benchmark's command line (how many times it repeats the whole
    measurement, fast path and reference alike); removed from ``sys.argv``."""
    runs = default
    if "--runs" in sys.argv:
        i = sys.argv.index("--runs")
        try:
            runs = int(sys.argv[i + 1])
        except (IndexError, ValueError):
            sys.exit("--runs needs a whole number of runs, for example --runs 5")
        if runs < 1:
            sys.exit(f"--runs must be at least 1, not {runs}")
        del sys.argv[i:i + 2]
    return runs


def over_runs(runs: list[dict], keys: tuple[str, ...], digits: int = 3) -> dict:
    """Each of ``keys`` across repeated runs: {"median", "spread": [min, max], "runs": [...]}.
    A ratio is taken within each run (fast and reference timed back to back) and then its
    median, never as a ratio of medians."""
    out = {}
    for key in keys:
        values = [r[key] for r in runs]
        median, spread = median_spread(values, digits)
        out[key] = {"median": median, "spread": spread,
                    "runs": [round(v, digits) for v in values]}
    return out


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def matmul_rate(m: int, k: int, n: int, device: str = "cpu", dtype=None,
                repeat: int = 10) -> float:
    """FLOP/s of an (m, k) @ (k, n) matrix product in ``dtype`` (default float32) on
    ``device``: the best of ``repeat`` timed products after three untimed ones."""
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype or torch.float32)
    b = torch.randn(k, n, device=device, dtype=dtype or torch.float32)
    best = float("inf")
    for i in range(repeat + 3):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        if i >= 3:
            best = min(best, time.perf_counter() - t)
    return 2.0 * m * k * n / best


def matmul_peak(device: str = "cpu", dtype=None, n: int | None = None,
                repeat: int = 10) -> float:
    """FLOP/s of a square matrix product (n = 8192 on a GPU, 2048 on the CPU)."""
    n = n or (8192 if str(device).startswith("cuda") else 2048)
    return matmul_rate(n, n, n, device, dtype, repeat)


def flop_per_row(model) -> tuple[float, float]:
    """Multiply-add FLOPs of one position through one block (2 x its matrix weights:
    attention and MLP; the attention over cached keys is left out) and through the final
    unembedding: what one exactly patched row costs per block it crosses."""
    block = model.blocks[0]
    weights = sum(p.numel() for name, p in block.named_parameters()
                  if p.dim() >= 2 and not name.rsplit(".", 1)[-1].lstrip("_").startswith("b_"))
    return 2.0 * weights, 2.0 * model.cfg.d_model * model.cfg.d_vocab


def plain(o):
    """json's ``default`` for numpy values (a numpy int64 count stopped a 12-layer run at
    its very end)."""
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def save(name: str, data: dict, record: str | None = None) -> None:
    """Print ``data`` and write it to bench/results/<name>.json; with ``record``, to
    bench/recorded/<record>.json too (the raw output the docs cite)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, default=plain)
    (RESULTS / f"{name}.json").write_text(text)
    if record:
        (ROOT / "bench" / "recorded" / f"{record}.json").write_text(text + "\n")
    print(text)


def git(*argv: str) -> str:
    """A git command's output in this checkout."""
    return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


@contextmanager
def revision_tree(rev: str):
    """(a temporary git worktree of revision ``rev``, its full sha, this checkout's HEAD
    sha, noted when uncommitted changes of tracked files are in it): the code a
    ``--against REV`` benchmark runs beside this checkout's. Removed on exit."""
    sha, here = git("rev-parse", rev), git("rev-parse", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        here += " + uncommitted changes"
    tree = Path(tempfile.mkdtemp(prefix="ncat-bench-rev-")) / "tree"
    git("worktree", "add", "--detach", str(tree), sha)
    try:
        yield tree, sha, here
    finally:
        git("worktree", "remove", "--force", str(tree))


def code_env(code: Path, threads: int) -> dict[str, str]:
    """The environment of a child importing the code under ``code`` (a checkout or a
    ``revision_tree``) with ``threads`` math threads."""
    return {**os.environ, **{k: str(threads) for k in
                             ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
            "PYTHONPATH": str(code)}


def against_ready(procs: dict, tree: Path) -> None:
    """Each child of an ``--against`` run ({"old": ..., "new": ...}, each printing "ready
    <catalog's __file__>" when ready) imported the code it was meant to: the revision's
    worktree for "old", this checkout for "new"."""
    for name, p in procs.items():
        ready, path = p.stdout.readline().split()
        assert ready == "ready", ready
        assert path.startswith(str(tree if name == "old" else ROOT)), (name, path)


def take_turns(procs: dict, runs: int, turn) -> dict[str, list]:
    """``turn(child)`` of the "old" and "new" children ``runs`` times each, one at a time
    so that neither runs beside the other, the order alternating per round."""
    got: dict[str, list] = {"old": [], "new": []}
    for r in range(runs):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            got[name].append(turn(procs[name]))
    return got
