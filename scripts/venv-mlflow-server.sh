#!/usr/bin/env bash
# Create or refresh .venv-mlflow-server: the MLflow tracking server (requirements-mlflow-server.lock,
# hashes required) in an environment of its own, for the tests that train against a real server.
# Kept apart from .venv: the full `mlflow` package pins its own numpy, pandas, SQLAlchemy ... and
# none of that may enter the training environment or the image. Idempotent, like scripts/venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=requirements-mlflow-server.lock
VENV=.venv-mlflow-server
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.lock-$(sha256sum "$LOCK" | cut -c1-16)
if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes -r "$LOCK"
    rm -f "$VENV"/.lock-*
    touch "$stamp"
fi
