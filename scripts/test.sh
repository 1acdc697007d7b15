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
  ruff check . || exit 1
  mypy || exit 1
  run_pytest "$@"
  exit $?
fi
# The default built-in model, trained once per checkout (cached in the test home), in the
# background with one math thread while lint, types and the first tests run: the tests
# that need it (the README's demo and Python example, `ncat explain builtin`, the reuse and
# accuracy tests) wait for it on the training lock (catalog.builtin.training.training_lock). With two threads it trained 1.48x faster, so one
# thread beside the other work keeps both cores busy where two threads alone left part
# of them idle, and lint and types (about 45 s on one core) run beside it too. After the
# demo the user's home holds the same model (same settings, same bits): it is taken from
# there (linked, each checkpoint checked against its record) and not trained again.
user_home=$(python -c 'from catalog.config.settings import get_settings; print(get_settings().ncat_home)')
test_home="${NCAT_TEST_HOME:-$PWD/.cache/test-home}"
mkdir -p "$test_home"
train_log="$test_home/train-builtin.log"
echo "test.sh: the default built-in model in the background (trained once per checkout, cached in the test home; taken from $user_home when it holds it; its log: $train_log)"
NCAT_HOME="$test_home" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  ncat train-builtin --reuse-from "$user_home" > "$train_log" 2>&1 &
trainer=$!
trap 'kill "$trainer" 2>/dev/null' EXIT
trained() {  # the background training's exit code, its last lines printed
  wait "$trainer"
  local rc=$?
  trap - EXIT
  tail -n 3 "$train_log"
  [ "$rc" -eq 0 ] || echo "test.sh: training the default built-in model failed (exit code $rc): $train_log" >&2
  return "$rc"
}
# lint and types first: they take seconds and name the line that is wrong
ruff check . || exit 1
mypy || exit 1
# -m replaces pyproject's addopts marker expression, so it repeats "not real_model".
# --no-loadscope-reorder: files are handed out in collection order, which
# tests/conftest.py sets (the longest and the most waiting files first).
# One math thread per process (and its workers and trainers) in the parallel part: two
# processes with a thread per core each made the demo's worker 4x slower, its threads
# spinning while the other process held the cores (the trained bits and the stored rows
# do not depend on the thread count: tests/unit/test_builtin.py, the golden rows).
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  run_pytest -n "${NCAT_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=25 -m "not real_model and not serial"
parallel=$?
trained
training=$?
run_pytest --durations=11 -m "not real_model and serial"
serial=$?
echo "test.sh: training exit code $training, parallel part exit code $parallel, serial part exit code $serial"
[ "$training" -eq 0 ] && [ "$parallel" -eq 0 ] && [ "$serial" -eq 0 ]
