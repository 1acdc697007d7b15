#!/usr/bin/env bash
# The test command of the README (and of .ci/run): set up, then run the whole suite.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
. .venv/bin/activate
# lint and types first: they take seconds and name the line that is wrong
ruff check . || exit 1
mypy || exit 1
python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"
