"""The rows a catalog holds do not change when the code is restructured.

``tests/data/golden`` holds one fixed checkpoint of the tiny built-in model (step 300)
and ``rows.json.gz``: every measurement row that ``ncat catalog`` of commit 6a8a4f8
(before the run object, the settings object and the split configs) wrote for it with
``CONFIG`` below. Both ways of filling a catalog (``ncat catalog``, and a job through
Redis and a real Celery worker) must reproduce those rows. Measured numbers are
compared at float32 precision with a small tolerance (another CPU may round a
reduction differently); grids byte for byte up to one quantisation step; heuristic
keys, ranks and counts exactly.
"""

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from catalog import builtin
from catalog.config import MeasureConfig
from jobs import enqueue as enq
from jobs.cli import main

from golden_rows import dump_rows
from helpers import all_done, wait_until
from tiny_model import TINY

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
CONFIG = MeasureConfig(operand_hi=12, pairs_per_op=8)  # what `--hi 12 --pairs 8` asks for
STEP = 300


@pytest.fixture
def golden_home(tmp_path):
    """An NCAT_HOME whose built-in cache holds exactly the golden checkpoint."""
    folder = tmp_path / "builtin" / TINY.key()
    folder.mkdir(parents=True)
    for name in ("step300.pt", "step300.json", "train_config.json"):
        shutil.copy(GOLDEN / name, folder / name)
    return tmp_path


def _close(a, b, rel=1e-4, abs_=1e-6) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    return a == b


def _grid_close(got: list, want: list) -> bool:
    """Same key, scale and minimum; each 8-bit code at most one step apart."""
    if got[:4] != want[:4] or not _close(got[5:], want[5:]):
        return False
    a, b = bytes.fromhex(got[4]), bytes.fromhex(want[4])
    return len(a) == len(b) and all(abs(x - y) <= 1 for x, y in zip(a, b, strict=True))


def assert_golden(url: str) -> None:
    want = json.loads(gzip.decompress((GOLDEN / "rows.json.gz").read_bytes()))
    got = json.loads(json.dumps(dump_rows(url)))  # the same JSON types as the golden file
    for table, rows in want.items():
        assert len(got[table]) == len(rows), (table, len(got[table]), len(rows))
        close = _grid_close if table == "neuron_grid" else _close
        bad = [(g, w) for g, w in zip(got[table], rows, strict=True) if not close(g, w)]
        assert not bad, (table, len(bad), bad[:2])


def test_ncat_catalog_writes_the_golden_rows(db, golden_home, monkeypatch):
    monkeypatch.setenv("NCAT_HOME", str(golden_home))
    assert main(["catalog", builtin.model_name(TINY), "--checkpoints", str(STEP), "--hi", "12",
                 "--pairs", "8", "--quiet", "--database-url", db]) == 0
    assert_golden(db)


def test_a_job_through_the_queue_writes_the_golden_rows(queue, golden_home, monkeypatch):
    monkeypatch.setenv("NCAT_HOME", str(golden_home))
    (job,) = enq.enqueue(queue.url, queue.name, str(STEP), CONFIG)
    queue.start_worker()
    wait_until(lambda: all_done(queue.url), what="the golden job")
    assert_golden(queue.url)

