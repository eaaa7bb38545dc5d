#!/usr/bin/env bash
# Create or refresh .venv from requirements.lock (CPU TensorFlow, hashes required) and install this
# package into it without re-resolving: what training needs. With --test, also requirements-test.lock
# (pytest, invoke, ...). Each lock installed leaves a stamp named by its hash, so an unchanged lock is
# not installed again, and a .venv made by scripts/train gets the test tools the first time
# scripts/test (--test) uses it. Set PYTHON to choose the interpreter (TensorFlow 2.21 supports
# Python 3.10-3.13), LOCK for requirements-gpu.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=${LOCK:-requirements.lock}
TEST_LOCK=requirements-test.lock
case "${1:-}" in
    "") test_tools=false ;;
    --test) test_tools=true ;;
    *)
        echo "scripts/venv.sh: unknown argument '$1': give none (training's packages) or --test (and the test tools)" >&2
        exit 2
        ;;
esac
hash16() { cat "$@" | sha256sum | cut -c1-16; }
count() { grep -c '^[A-Za-z0-9].*==' "$1" || true; }
runtime_stamp=.venv/.lock-runtime-$(hash16 "$LOCK")
test_stamp=.venv/.lock-test-$(hash16 "$LOCK" "$TEST_LOCK")  # the runtime lock's pins constrain the test lock's
pip=(.venv/bin/python -m pip install --disable-pip-version-check --require-hashes)

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if [ ! -f "$runtime_stamp" ]; then
    # pip prints nothing for minutes while it downloads TensorFlow unless told: say what and why first.
    echo "scripts/venv.sh: installing the $(count "$LOCK") pinned packages of $LOCK into .venv" \
        "(TensorFlow alone is hundreds of MB: a few minutes the first time, then only when the lock changes)" >&2
    "${pip[@]}" -r "$LOCK"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
    rm -f .venv/.lock-*  # every older stamp, the test tools' too: they were installed against the old pins
    touch "$runtime_stamp"
fi
if $test_tools && [ ! -f "$test_stamp" ]; then
    echo "scripts/venv.sh: installing the test tools, the $(count "$TEST_LOCK") pinned packages of $TEST_LOCK, into .venv" >&2
    "${pip[@]}" -r "$TEST_LOCK"
    rm -f .venv/.lock-test-*
    touch "$test_stamp"
fi
