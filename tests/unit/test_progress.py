"""Progress where the output is not a terminal (CI logs, files): plain lines, a time left
taken from the average rate, no loss before the first step."""

import dataclasses
import io
import re

from catalog import builtin
from catalog.core import progress

from tiny_model import TINY


def test_lines_count_the_work_and_say_the_time_left():
    out = io.StringIO()
    bar = progress.LineProgress(10, "work", "item", interval=0, file=out)
    for _ in range(4):
        bar.update(1)
    bar.set_postfix(loss="0.500")
    bar.update(6)
    bar.close()
    bar.close()  # once only
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("work: 0/10 items (0%), 0m00s elapsed")
    assert "left" not in lines[0]  # nothing done yet: no rate
    assert lines[1].startswith("work: 1/10 items (10%)") and "left" in lines[1]
    assert lines[-1].startswith("work: 10/10 items (100%)") and "left" not in lines[-1]
    assert lines[-1].endswith("[loss=0.500]")
    batches = io.StringIO()
    progress.LineProgress(3, "grids", "batch", interval=0, file=batches).close()
    assert "0/3 batches" in batches.getvalue()
    assert len(lines) == 1 + 5 + 1  # start, five updates, close
    assert "\r" not in out.getvalue()


def test_lines_are_kept_to_one_per_interval():
    out = io.StringIO()
    bar = progress.LineProgress(1000, "work", "item", interval=3600, file=out)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert len(out.getvalue().splitlines()) == 2  # the start and the end


def test_the_time_left_is_the_average_rate_since_the_start(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    bar = progress.LineProgress(100, "work", "item", interval=0, file=out)
    now[0] = 10.0
    bar.update(25)
    assert "about 0m30s left" in out.getvalue().splitlines()[-1]  # 75 more at 2.5 a second


def test_training_in_a_log_prints_lines_not_a_redrawn_bar(tmp_path, capfd, monkeypatch):
    """The trainer's child writes to the same stderr; not a terminal here (captured)."""
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    cfg = dataclasses.replace(TINY, steps=20)
    builtin.train(cfg, root=tmp_path, progress=True)
    err = capfd.readouterr().err
    assert "\r" not in err
    lines = [x for x in err.splitlines() if x.startswith("training built-in model:")]
    assert len(lines) >= 20, err[-2000:]
    assert lines[-1].startswith("training built-in model: 20/20 steps (100%)")
    assert not any("nan" in x for x in lines), [x for x in lines if "nan" in x]
    assert re.search(r"about \d+m\d\ds left", "\n".join(lines))
    assert "loss=" in lines[-1] and "acc+=" in lines[-1]
