#!/usr/bin/env bash
# The README's demo command: set up, train the built-in model (cached), measure it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/ncat demo "$@"
