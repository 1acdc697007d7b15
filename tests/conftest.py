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
# the label rule's fits are not kept on disk between test processes (tests count what is
# built); the README's commands run with the store as a user's do, and
# tests/unit/test_fit_store.py turns it on where it tests it
os.environ["NCAT_FIT_CACHE_BYTES"] = "0"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from catalog import builtin  # noqa: E402

from offline_models import PYTHIA_REPO, write_pythia_cache  # noqa: E402

PYTHIA_STEPS = [1000, 2000]

# A built-in model small enough to train in a few seconds, used wherever a trained
# checkpoint is needed but the default model's accuracy is not.
from tiny_model import TINY  # noqa: E402

# The order in which the test command's parallel part hands out files (scripts/test.sh
# passes --no-loadscope-reorder, so pytest-xdist follows the collection order set here).
# The default built-in model trains beside the first tests (one math thread, about 5.5
# minutes): the README's commands, the longest file (the demo), start first and wait for
# it; the other process meanwhile runs numeric files that need no trained default model,
# so both cores work. The chaos tests mostly wait on workers (about 3 minutes of wall
# time, a core's work): they come next, beside the demo's workers, where their waits
# overlap work. Then the other files that need the default model (short), then the rest
# by their number of tests, most first (pytest-xdist's own order).
ORDER = (
    "test_readme_commands.py",
    # numeric, no default model: beside its training
    "test_value_null.py", "test_labels.py", "test_operand_labels.py", "test_patching.py",
    "test_streaming.py",
    "test_chaos.py",
    # need the default model: after its training
    "test_readme.py", "test_builtin.py", "test_builtin_reuse.py", "test_untrained_labels.py",
    "test_explain_cli.py",
)


def pytest_collection_modifyitems(config, items):
    per_file: dict = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + 1

    def order(item) -> tuple[int, int]:
        name = item.path.name
        if name in ORDER:
            return (ORDER.index(name), 0)
        return (len(ORDER), -per_file[item.path])

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
