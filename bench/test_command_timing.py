"""Two runs of the test command compared test by test (issue 46: the refactor must keep
the command's time within 5%). Each log is the output of
``CI=true PYTEST_ADDOPTS=--durations=0 bash .ci/run``, run back to back on one machine;
the script sums each test's setup, call and teardown over the tests both runs have and
pass (a test that fails in either, or exists in one, is left out and counted), and
writes the ratio with the whole commands' wall times given on the command line.

    python bench/test_command_timing.py BEFORE.log AFTER.log --before-s 1370 --after-s 1367
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

DURATION = re.compile(r"\s*([\d.]+)s (call|setup|teardown)\s+(\S+)")
FAILED = re.compile(r"FAILED (\S+)")


def durations(text: str) -> tuple[dict[str, float], set[str]]:
    """Seconds per test id (setup + call + teardown, those pytest printed) and the failed ids."""
    seconds: dict[str, float] = {}
    failed: set[str] = set()
    for line in text.splitlines():
        if m := DURATION.match(line):
            seconds[m.group(3)] = seconds.get(m.group(3), 0.0) + float(m.group(1))
        elif m := FAILED.match(line):
            failed.add(m.group(1))
    return seconds, failed


def compare(before: str, after: str) -> dict:
    b, fb = durations(before)
    a, fa = durations(after)
    common = sorted((set(a) & set(b)) - fb - fa)
    sb, sa = sum(b[t] for t in common), sum(a[t] for t in common)
    moved = sorted(common, key=lambda t: a[t] - b[t])
    return {"tests_compared": len(common), "before_s": round(sb, 1), "after_s": round(sa, 1),
            "ratio": round(sa / sb, 4) if sb else None,
            "failed_before": sorted(fb), "failed_after": sorted(fa),
            "only_before": len(set(b) - set(a)), "only_after": len(set(a) - set(b)),
            "most_slower": [(t, round(b[t], 2), round(a[t], 2)) for t in moved[-5:][::-1]],
            "most_faster": [(t, round(b[t], 2), round(a[t], 2)) for t in moved[:5]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--before-s", type=float, help="the whole command's wall time, before")
    p.add_argument("--after-s", type=float, help="the whole command's wall time, after")
    p.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = p.parse_args()
    out = compare(args.before.read_text(), args.after.read_text())
    if args.before_s and args.after_s:
        out["whole_command_s"] = [args.before_s, args.after_s]
        out["whole_command_ratio"] = round(args.after_s / args.before_s, 4)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
