#!/usr/bin/env bash
# Create or refresh .venv-runtime-check: LiteRT's interpreter, ONNX Runtime and numpy
# (requirements-runtime-check.lock, hashes required) and no TensorFlow, which is what a phone, an
# edge box or an ONNX server has. The export checks model.tflite and model.onnx in it
# (EXPORT_CHECK_PYTHON=.venv-runtime-check/bin/python). Idempotent, like scripts/venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=requirements-runtime-check.lock
VENV=.venv-runtime-check
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.lock-$(sha256sum "$LOCK" | cut -c1-16)
if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes -r "$LOCK"
    rm -f "$VENV"/.lock-*
    touch "$stamp"
fi
