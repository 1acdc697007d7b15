#!/usr/bin/env bash
# The test command of the README (and of .ci/run): set up, then run the whole suite.
#
# With no arguments the suite runs in two parts: every test not marked `serial` in
# NCAT_TEST_WORKERS processes (default 2; pytest-xdist, each file's tests in one process
# and in order), then the `serial` tests alone on the machine: they compare a measured
# time with a bound, which a second process running beside them would skew, or take
# away for a moment what the whole server holds (the reader role's settings). With
# arguments, one plain pytest run with those arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
# lint and types first: they take seconds and name the line that is wrong
ruff check . || exit 1
mypy || exit 1

run_pytest() {
  python -m pytest "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests ($*); that is a failure here" >&2
    return 1
  fi
  return "$rc"
}

if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit $?
fi
# The default built-in model, trained once per checkout before the suite, with every core:
# two tests need it (the README's Python example and its demo command), and inside the
# parallel part one trained it on one thread while the other's process waited for the
# training lock, a core idle for the whole training. Cached: seconds when it exists.
# After the demo the user's home holds the same model (same settings, same bits): it is
# taken from there (linked, each checkpoint checked against its record) and not trained
# again.
user_home=$(python -c 'from catalog.config.settings import get_settings; print(get_settings().ncat_home)')
echo "test.sh: the default built-in model (trained once per checkout, cached in the test home; taken from $user_home when it holds it)"
NCAT_HOME="${NCAT_TEST_HOME:-$PWD/.cache/test-home}" ncat train-builtin --reuse-from "$user_home" || exit 1
# -m replaces pyproject's addopts marker expression, so it repeats "not real_model".
# One math thread per process (and its workers and trainers) in the parallel part: two
# processes with a thread per core each made the demo's worker 4x slower, its threads
# spinning while the other process held the cores (the trained bits and the stored rows
# do not depend on the thread count: tests/unit/test_builtin.py, the golden rows).
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  run_pytest -n "${NCAT_TEST_WORKERS:-2}" --dist loadfile --durations=25 -m "not real_model and not serial"
parallel=$?
run_pytest --durations=11 -m "not real_model and serial"
serial=$?
echo "test.sh: parallel part exit code $parallel, serial part exit code $serial"
[ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
