"""Shared fixtures. Model hubs are unreachable: every hub load reads a local cache."""

import os
import random
import tempfile
from pathlib import Path

# Must precede any import of huggingface_hub / transformers, which read these once.
_HF_CACHE = Path(tempfile.mkdtemp(prefix="ncat-test-hf-"))
os.environ["HF_HUB_CACHE"] = str(_HF_CACHE)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never write to the user's home: NCAT_HOME (built-in checkpoints, embedded servers,
# worker logs, fetched models) is a folder of this checkout, kept between runs so that the
# default built-in model is trained once per checkout; NCAT_TEST_HOME moves it.
TEST_HOME = Path(os.environ.get("NCAT_TEST_HOME")
                 or Path(__file__).resolve().parents[1] / ".cache" / "test-home")
os.environ["NCAT_HOME"] = str(TEST_HOME)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from catalog import builtin  # noqa: E402

from offline_models import PYTHIA_REPO, write_pythia_cache  # noqa: E402

PYTHIA_STEPS = [1000, 2000]

# A built-in model small enough to train in a few seconds, used wherever a trained
# checkpoint is needed but the default model's accuracy is not.
from tiny_model import TINY  # noqa: E402

# Files whose tests start first in the test command's parallel part (scripts/test.sh
# passes --no-loadscope-reorder, so pytest-xdist hands out files in this order; the rest
# follow by their number of tests, most first, which is xdist's own order). The README's
# commands are the longest file by far (the demo, 7-10 min) and wait for the default
# model, which the test command trains beside the first tests; the chaos tests mostly
# wait on workers (3-4 min of wall time, about one core's work): started early, their
# waits overlap the other process's work instead of lengthening the part's end.
FIRST_FILES = ("test_readme_commands.py", "test_chaos.py")


def pytest_collection_modifyitems(config, items):
    def order(item) -> tuple[int, int]:
        name = item.path.name
        if name in FIRST_FILES:
            return (FIRST_FILES.index(name), 0)
        return (len(FIRST_FILES), -per_file[item.path])

    per_file: dict = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + 1
    items.sort(key=order)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_builtin(tmp_path_factory):
    """(TrainConfig, cache root) of a trained tiny built-in model.

    The cache root is ``<NCAT_HOME>/builtin``, so a worker process started with
    ``NCAT_HOME=root.parent`` finds the model as ``builtin.model_name(TINY)``.
    """
    root = tmp_path_factory.mktemp("home") / "builtin"
    builtin.train(TINY, root=root, progress=False)
    return TINY, root


@pytest.fixture(scope="session")
def pythia_hub():
    """The Pythia-14m-shaped offline hub cache at two step revisions; returns the repo name."""
    write_pythia_cache(_HF_CACHE, PYTHIA_STEPS)
    return PYTHIA_REPO
