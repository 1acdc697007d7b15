"""A finished built-in run taken from another home (the user's, after the demo) instead of
trained again: only whole, unaltered runs of the same settings are taken."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from catalog import builtin
from catalog.builtin import training

REPO = Path(__file__).resolve().parents[2]


def _copy_run(cfg, root, dest_root):
    shutil.copytree(root / cfg.key(), dest_root / cfg.key())
    return dest_root / cfg.key()


def _no_training(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("trained although a finished run was taken")

    monkeypatch.setattr(training, "_train_in_child", refuse)


def test_a_finished_run_is_taken_whole_and_not_trained_again(tiny_builtin, tmp_path,
                                                              monkeypatch):
    cfg, root = tiny_builtin
    target = tmp_path / "tests-home" / "builtin"
    assert builtin.adopt(cfg, root, target) is True
    src, out = root / cfg.key(), target / cfg.key()
    names = sorted(p.name for p in src.iterdir() if not p.name.startswith("."))
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == names
    for name in names:
        assert (out / name).read_bytes() == (src / name).read_bytes(), name
    _no_training(monkeypatch)
    assert builtin.train(cfg, root=target, progress=False) == out
    model, meta = builtin.load_checkpoint(cfg, cfg.steps, root=target)
    recorded = json.loads((src / f"step{cfg.steps}.json").read_text())["weights_hash"]
    assert meta["weights_hash"] == recorded
    # held already: nothing taken, nothing rewritten
    mtime = os.stat(out / f"step{cfg.steps}.pt").st_mtime_ns
    assert builtin.adopt(cfg, root, target) is False
    assert os.stat(out / f"step{cfg.steps}.pt").st_mtime_ns == mtime


def test_adoption_holds_the_training_lock_so_a_train_started_meanwhile_trains_nothing(
        tiny_builtin, tmp_path, monkeypatch):
    """The test command adopts (or trains) the default model in the background while the
    first tests start; a test's ``train`` of the same run must wait for the adoption and
    find the run whole, not start training it beside the links being made."""
    import fcntl
    import threading

    cfg, root = tiny_builtin
    target = tmp_path / "tests-home" / "builtin"
    out = target / cfg.key()
    out.mkdir(parents=True)
    took: list[bool] = []
    with open(out / ".training.lock", "w") as held:  # a trainer holds the run's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        adopting = threading.Thread(target=lambda: took.append(builtin.adopt(cfg, root, target)))
        adopting.start()
        adopting.join(timeout=2)
        assert adopting.is_alive() and not took  # waiting on the lock
        assert not any(out.glob("step*")), "adopted while another held the lock"
    adopting.join(timeout=60)
    assert took == [True]
    # and the other way round: a train that finds the lock taken by an adoption waits for
    # it and then trains nothing
    target2 = tmp_path / "tests-home-2" / "builtin"
    out2 = target2 / cfg.key()
    out2.mkdir(parents=True)
    _no_training(monkeypatch)
    trained: list = []
    with open(out2 / ".training.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        training_thread = threading.Thread(
            target=lambda: trained.append(builtin.train(cfg, root=target2, progress=False)))
        training_thread.start()
        training_thread.join(timeout=2)
        assert training_thread.is_alive() and not trained
        # what the adoption does under its lock: the run's files, settings first
        assert training._adopt_locked(cfg, root / cfg.key(), out2, cfg.checkpoint_steps())
    training_thread.join(timeout=60)
    assert trained == [out2]


@pytest.mark.parametrize("damage", ["missing checkpoint", "missing metrics", "altered weights",
                                    "other settings", "unfinished run"])
def test_a_run_that_is_not_whole_or_not_this_one_is_left_alone(tiny_builtin, tmp_path, damage):
    cfg, root = tiny_builtin
    source = tmp_path / "user" / "builtin"
    run = _copy_run(cfg, root, source)
    steps = cfg.checkpoint_steps()
    if damage == "missing checkpoint":
        (run / f"step{steps[1]}.pt").unlink()
    elif damage == "missing metrics":
        (run / f"step{steps[-1]}.json").unlink()
    elif damage == "altered weights":
        blob = training.torch.load(run / f"step{steps[-1]}.pt", weights_only=True)
        first = next(iter(blob["state_dict"]))
        blob["state_dict"][first] = blob["state_dict"][first] + 1e-3
        training.torch.save(blob, run / f"step{steps[-1]}.pt")
    elif damage == "other settings":
        settings = json.loads((run / "train_config.json").read_text())
        settings["lr"] = settings["lr"] * 2
        (run / "train_config.json").write_text(json.dumps(settings))
    else:
        (run / training.STATE_FILE).write_bytes(b"a run still going")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    target = tmp_path / "tests-home" / "builtin"
    assert builtin.adopt(cfg, source, target) is False
    assert not any(target.rglob("step*")), damage
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@pytest.mark.slow
def test_the_command_takes_the_users_run(tmp_path):
    """What the test command runs after a demo: ``ncat train-builtin --reuse-from HOME`` with
    the tests' own home takes the default model from HOME's cache, linked, and trains
    nothing. HOME here is the tests' cache, where the test command trained the model."""
    cfg = builtin.TrainConfig()
    builtin.train(cfg, progress=False)  # cached by the test command before the suite
    user_home = builtin.default_cache_root().parent
    tests_home = tmp_path / "tests"
    env = dict(os.environ, NCAT_HOME=str(tests_home))
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "train-builtin",
                           "--reuse-from", str(user_home)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "taken" in done.stdout and "no training" in done.stdout, done.stdout
    assert "training built-in model" not in done.stderr
    for step in cfg.checkpoint_steps():
        name = f"step{step}.pt"
        assert (os.stat(tests_home / "builtin" / cfg.key() / name).st_ino
                == os.stat(user_home / "builtin" / cfg.key() / name).st_ino), name
