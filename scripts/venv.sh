#!/usr/bin/env bash
# Create or refresh .venv from requirements.lock (CPU TensorFlow, hashes required) plus
# requirements-test.lock (pytest, invoke, ...), and install this package into it without
# re-resolving. Idempotent: skips the install when the locks are unchanged since the last run. Used
# by scripts/test and scripts/train; set PYTHON to choose the interpreter (TensorFlow 2.21 supports
# Python 3.10-3.13), LOCK for requirements-gpu.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=${LOCK:-requirements.lock}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.lock-$(cat "$LOCK" requirements-test.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r "$LOCK" -r requirements-test.lock
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
    rm -f .venv/.lock-*
    touch "$stamp"
fi
