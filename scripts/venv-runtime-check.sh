#!/usr/bin/env bash
# Create or refresh .venv-runtime-check: LiteRT's interpreter, ONNX Runtime and numpy
# (requirements/runtime-check.lock, hashes required) and no TensorFlow, which is what a phone, an
# edge box or an ONNX server has. The export checks model.tflite and model.onnx in it, found by
# itself when EXPORT_CHECK_PYTHON is empty. Idempotent (scripts/venv-from-lock.sh).
exec "$(dirname "$0")/venv-from-lock.sh" requirements/runtime-check.lock .venv-runtime-check
