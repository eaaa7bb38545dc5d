#!/usr/bin/env bash
# Create or refresh .venv-skypilot: SkyPilot (requirements-skypilot.lock, hashes required) in an
# environment of its own, for the test that reads deploy/skypilot/train.yaml with SkyPilot's parser.
# Kept apart from .venv: SkyPilot pins its own FastAPI, SQLAlchemy, pydantic ... and none of that may
# enter the training environment or the image. Idempotent, like scripts/venv-mlflow-server.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=requirements-skypilot.lock
VENV=.venv-skypilot
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.lock-$(sha256sum "$LOCK" | cut -c1-16)
if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes -r "$LOCK"
    rm -f "$VENV"/.lock-*
    touch "$stamp"
fi
