#!/usr/bin/env bash
# Creates .venv and installs the project. torch is installed first and pinned,
# so that no dependency resolves an unpinned torch to a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "setup: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }

# System packages: Chromium for the explorer's browser test, redis-server for the embedded
# broker fallback, psql for the analysts (the README's psql line is run by a test).
# Installed with apt where we are root on Debian; otherwise say so.
missing=""
command -v chromium >/dev/null || missing="$missing chromium"
command -v redis-server >/dev/null || missing="$missing redis-server"
command -v psql >/dev/null || missing="$missing postgresql-client"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing$missing with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    echo "setup: please install$missing (Debian packages) for the browser test, the Redis" \
         "fallback and psql" >&2
  fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
stamp=.venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing torch 2.13.0 into .venv (a first install takes a few minutes)"
  pip install -q --disable-pip-version-check "torch==2.13.0"
  echo "setup: installing the project and its dependencies into .venv"
  pip install -q --disable-pip-version-check -e ".[dev]"
  # SAEDashboard's Neuronpedia batch classes, which the export tests read the batches with;
  # without its dependencies (it pins transformer-lens < 3): the classes need numpy only
  pip install -q --disable-pip-version-check --no-deps "sae-dashboard==0.8.0"
  rm -f .venv/.installed-*; touch "$stamp"
  echo "setup: .venv ready"
fi
# the reader guard: a PostgreSQL library for this machine's servers (migration 0033 loads
# it into the analysts' sessions); says why where it cannot be built, never fails set-up
bash scripts/reader-guard.sh
