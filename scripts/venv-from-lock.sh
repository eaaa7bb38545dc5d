#!/usr/bin/env bash
# scripts/venv-from-lock.sh LOCK VENV: create or refresh the environment VENV from the lock file LOCK
# (hashes required), for a tool that must stay out of .venv and the image. Idempotent: it installs
# again only when the lock changes (a stamp file names the lock's hash), with uv when it is on PATH,
# like scripts/venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=$1
VENV=$2
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.lock-$(sha256sum "$LOCK" | cut -c1-16)
if [ ! -f "$stamp" ]; then
    if command -v uv >/dev/null 2>&1; then
        uv pip install --quiet --python "$VENV/bin/python" --compile-bytecode --require-hashes -r "$LOCK"
    else
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes -r "$LOCK"
    fi
    rm -f "$VENV"/.lock-*
    touch "$stamp"
fi
