"""The built-in arithmetic model: deterministic training, checkpoint cache, accuracy."""

import json
import os
from pathlib import Path

import pytest

from catalog import builtin
from catalog.core.arith import OPERATORS


def test_training_is_deterministic_and_cached(tiny_builtin, tmp_path):
    cfg, root = tiny_builtin
    builtin.train(cfg, root=tmp_path, progress=False)
    for step in cfg.checkpoint_steps():
        a = json.loads((root / cfg.key() / f"step{step}.json").read_text())
        b = json.loads((tmp_path / cfg.key() / f"step{step}.json").read_text())
        assert a["weights_hash"] == b["weights_hash"], step
    final = tmp_path / cfg.key() / f"step{cfg.steps}.pt"
    mtime = os.stat(final).st_mtime_ns
    builtin.train(cfg, root=tmp_path, progress=False)  # everything cached: nothing rewritten
    assert os.stat(final).st_mtime_ns == mtime


# The weights hash of TrainConfig(steps=2) from the pinned trainer with torch 2.13.0's
# CPU build, per CPU vendor (each measured with 1 and 2 threads): an AVX-512 Intel Xeon
# and an AVX-512 AMD EPYC give different bits even with every pin, so the cross-machine
# guarantee is per vendor. On other builds or CPUs only the in-machine guarantees hold.
STEP2_HASHES = {
    "GenuineIntel": "09a1c846f004f8fde9307a3ca1b1d9f9cbd48171a81d962d7fadc42aa0b4ec3f",
    "AuthenticAMD": "07887d302329830476cc5025b06380c446948eb5479453967b689dbec142205b",
}


def _avx2_vendor() -> str | None:
    """The CPU vendor of an x86-64 machine with AVX2, else None."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() not in ("x86_64", "AMD64") or not cpuinfo.exists():
        return None
    text = cpuinfo.read_text()
    if " avx2" not in text:
        return None
    for line in text.splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return None


def test_training_is_bitwise_the_same_for_any_thread_count_and_cpu_kernel_choice(tmp_path):
    """MKL and oneDNN reductions depend on the thread count and the instruction set
    (1-thread and 2-thread runs of the default architecture differed, and so did AVX-512
    and AVX2 kernels). The trainer runs in a child process with those pinned, so what the
    calling process says about threads or kernels cannot change the weights."""
    import subprocess
    import sys

    import torch

    cfg = builtin.TrainConfig(steps=2)
    runs = {"one": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"},
            "two": {"OMP_NUM_THREADS": "2", "MKL_CBWR": "AUTO"}}
    for run, env in runs.items():
        code = ("from pathlib import Path; from catalog import builtin; "
                f"builtin.train(builtin.TrainConfig(steps=2), root=Path({str(tmp_path / run)!r}), "
                "progress=False)")
        subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                       check=True, env={**os.environ, **env})
    builtin.train(cfg, root=tmp_path / "here", progress=False)  # this process's threads
    hashes = {run: json.loads((tmp_path / run / cfg.key() / "step2.json").read_text())
              ["weights_hash"] for run in ("one", "two", "here")}
    assert len(set(hashes.values())) == 1, hashes
    vendor = _avx2_vendor()
    if vendor in STEP2_HASHES and torch.__version__ == "2.13.0+cpu":
        assert hashes["here"] == STEP2_HASHES[vendor], vendor


def test_a_second_trainer_waits_for_the_first_then_reuses_its_run(tiny_builtin, tmp_path):
    """Two demos (or a demo and a test) starting at once must not both train into one folder."""
    import fcntl
    import shutil
    import threading

    cfg, root = tiny_builtin
    folder = tmp_path / cfg.key()
    folder.mkdir()
    with open(folder / ".training.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is training
        waiter = threading.Thread(target=builtin.train, args=(cfg, tmp_path, False))
        waiter.start()
        waiter.join(2.0)
        assert waiter.is_alive()  # it waits for the lock instead of training alongside
        for f in (root / cfg.key()).iterdir():  # the other process finishes its run
            if not f.name.startswith("."):
                shutil.copy2(f, folder / f.name)
        mtimes = {f.name: os.stat(f).st_mtime_ns for f in folder.iterdir()}
    waiter.join(60)
    assert not waiter.is_alive()
    assert {f.name: os.stat(f).st_mtime_ns for f in folder.iterdir()} == mtimes  # nothing redone


def test_tiny_model_learns_something(tiny_builtin):
    cfg, root = tiny_builtin
    first = json.loads((root / cfg.key() / "step0.json").read_text())
    last = json.loads((root / cfg.key() / f"step{cfg.steps}.json").read_text())
    assert sum(last["train_accuracy"].values()) > sum(first["train_accuracy"].values()) + 1.0


def test_schedule_and_config_validation():
    assert builtin.TrainConfig(steps=100).checkpoint_steps() == [0, 1, 2, 4, 8, 16, 32, 64, 100]
    assert builtin.TrainConfig(steps=64).checkpoint_steps()[-1] == 64
    with pytest.raises(ValueError, match="steps must be >= 1"):
        builtin.TrainConfig(steps=0)
    with pytest.raises(ValueError, match="operand_hi must be in"):
        builtin.TrainConfig(operand_hi=2000)
    # the cache folder of a recipe is a hash of its fields: a known answer, so that a key
    # computed in another process or release finds the same checkpoints
    assert builtin.TrainConfig().key() == "0a72f420054a"
    assert builtin.TrainConfig(seed=1).key() == "1bf16bc4bc32"


@pytest.mark.slow
def test_default_training_reaches_95_percent_on_held_out_addition_and_subtraction():
    """Trains the default model (a few minutes on 2 cores) unless it is already cached.

    The default run's weights are the same bits on every x86-64 machine with AVX2 and
    this torch build (pinned trainer), where it scores + 0.9995, - 1.0, * 0.982, / 0.989
    held out. Other seeds of the recipe can fall short on + and - (README table), so
    this checks the default run, not the recipe in general."""
    cfg = builtin.TrainConfig()
    path = builtin.train(cfg, progress=False)
    acc = json.loads((path / f"step{cfg.steps}.json").read_text())["heldout_accuracy"]
    assert acc["+"] >= 0.95 and acc["-"] >= 0.95, acc
    assert acc["*"] >= 0.9 and acc["/"] >= 0.9, acc
    assert set(acc) == set(OPERATORS)


def test_the_trainer_child_stops_when_its_parent_dies(tmp_path):
    """The parent holds the folder's training lock; an orphaned child would keep writing
    checkpoints while another trainer takes the lock."""
    import signal
    import subprocess
    import sys
    import time

    code = ("from pathlib import Path; from catalog import builtin; "
            f"builtin.train(builtin.TrainConfig(steps=3000), root=Path({str(tmp_path)!r}), "
            "progress=False)")
    parent = subprocess.Popen([sys.executable, "-c", code],
                              cwd=Path(__file__).resolve().parents[2])

    def child_pids() -> list[int]:
        out = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split() if int(p) != parent.pid]

    deadline = time.monotonic() + 60
    while not child_pids():
        assert time.monotonic() < deadline, "the trainer's child process never started"
        time.sleep(0.2)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while child_pids():
        assert time.monotonic() < deadline, "the trainer's child outlived its parent"
        time.sleep(0.2)


def test_training_killed_part_way_resumes_from_its_last_checkpoint(tiny_builtin, tmp_path):
    """A run killed after some checkpoints used to start again from step 0. It now
    continues from the latest saved state (model, optimizer, batch generator): earlier
    checkpoint files are left as they were and every checkpoint has the bits of an
    uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    cfg, root = tiny_builtin
    folder = tmp_path / cfg.key()
    code = ("import sys; sys.path.insert(0, 'tests'); from pathlib import Path; "
            "from catalog import builtin; from tiny_model import TINY; "
            f"builtin.train(TINY, root=Path({str(tmp_path)!r}), progress=False)")
    parent = subprocess.Popen([sys.executable, "-c", code],
                              cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 120
    while not (folder / "step64.json").exists():
        assert time.monotonic() < deadline and parent.poll() is None, "no step 64 checkpoint"
        time.sleep(0.01)
    os.kill(parent.pid, signal.SIGKILL)  # the trainer child dies with it (pdeathsig)
    parent.wait()
    time.sleep(0.5)
    assert not (folder / f"step{cfg.steps}.json").exists(), "the run finished before the kill"
    import torch

    # the state is written just after each checkpoint: the kill may fall between the two
    resumed_at = torch.load(folder / builtin.training.STATE_FILE, weights_only=False)["step"]
    assert resumed_at >= 32
    early = {f"step{s}.pt": (folder / f"step{s}.pt").stat().st_mtime_ns
             for s in cfg.checkpoint_steps() if s <= resumed_at}
    builtin.train(cfg, root=tmp_path, progress=False)
    for step in cfg.checkpoint_steps():
        a = json.loads((root / cfg.key() / f"step{step}.json").read_text())
        b = json.loads((folder / f"step{step}.json").read_text())
        assert a["weights_hash"] == b["weights_hash"], step
    for name, mtime in early.items():  # not trained again
        assert (folder / name).stat().st_mtime_ns == mtime, name
    assert not (folder / builtin.training.STATE_FILE).exists()
