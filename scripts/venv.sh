#!/usr/bin/env bash
# Create or refresh .venv from requirements/cpu.lock (CPU TensorFlow and the core, hashes required)
# and install this package into it without re-resolving: what training needs. Options, any order:
#   --extra NAME  also an extra's packages, requirements/NAME.lock (serve, mlflow, sweep, store,
#                 onnx); repeat it, or give all; onnx also makes .venv-runtime-check (the LiteRT and
#                 ONNX runtimes the export checks its files with)
#   --test        also the test tools (requirements/test.lock) and every extra: the whole suite runs
# Each lock installed leaves a stamp named by its hash, so an unchanged lock is not installed again,
# and a .venv made by scripts/train gets the rest the first time it is asked for. Set PYTHON to
# choose the interpreter of a new .venv (TensorFlow 2.21 supports Python 3.10-3.13), LOCK for requirements/gpu.lock.
# With uv on PATH, uv installs the same hashed locks (about 5x faster than pip); pip otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
asked_python=${PYTHON:-}  # PYTHON makes a new .venv only: one set for an existing .venv is checked below
PYTHON=${PYTHON:-python3}
LOCK=${LOCK:-requirements/cpu.lock}
# The extras: the files requirements/all.in brings in, but for the GPU runtime.
all_extras() { sed -n 's/^-r \(.*\)\.in$/\1/p' requirements/all.in | grep -vx gpu; }
usage="give none (training's packages), --extra NAME (one of: $(all_extras | tr '\n' ' ')or all) or --test"
extras=()
while [ $# -gt 0 ]; do
    case "$1" in
        --test)
            extras+=(test)
            while read -r name; do extras+=("$name"); done < <(all_extras)
            ;;
        --extra)
            [ $# -ge 2 ] || { echo "scripts/venv.sh: --extra needs a name: $usage" >&2; exit 2; }
            if [ "$2" = all ]; then
                while read -r name; do extras+=("$name"); done < <(all_extras)
            elif all_extras | grep -qx -- "$2"; then
                extras+=("$2")
            else
                echo "scripts/venv.sh: '$2' is not an extra: $usage" >&2
                exit 2
            fi
            shift
            ;;
        *)
            echo "scripts/venv.sh: unknown argument '$1': $usage" >&2
            exit 2
            ;;
    esac
    shift
done
hash16() { cat "$@" | sha256sum | cut -c1-16; }
# Packages, not pins: a lock pins some once per Python version (numpy ; python_version < "3.11" ...).
count() { sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\)==.*/\1/p' "$1" | sort -u | wc -l; }
runtime_stamp=.venv/.lock-runtime-$(hash16 "$LOCK")
if command -v uv >/dev/null 2>&1; then
    # --compile-bytecode: pip's default; without it every process compiles what it imports
    install=(uv pip install --quiet --python .venv/bin/python --compile-bytecode)
else
    install=(.venv/bin/python -m pip install --disable-pip-version-check)
fi

# The Pythons the locks hold wheels for, pyproject.toml's requires-python (">=3.10,<3.14"): with another,
# pip fails on the first package, and the .venv it leaves would be reused by every later run.
requires=$(sed -n 's/^requires-python = "\(.*\)"$/\1/p' pyproject.toml 2>/dev/null || true)
venv_version() { sed -n 's/^version *= *//p' .venv/pyvenv.cfg 2>/dev/null; }
python_supported() {  # .venv's version against ">=3.LO,<3.HI"; true when either cannot be read
    local lo hi major minor
    read -r lo hi < <(sed -n 's/^>=3\.\([0-9]*\),<3\.\([0-9]*\)$/\1 \2/p' <<<"$requires")
    IFS=. read -r major minor _ < <(venv_version)
    [ -z "$lo" ] || [ -z "$minor" ] || { [ "$major" = 3 ] && [ "$minor" -ge "$lo" ] && [ "$minor" -lt "$hi" ]; }
}
refuse_python() {  # what, its version, the fix
    echo "scripts/venv.sh: $1 is Python $2, which TensorFlow has no wheels for (pyproject.toml: requires-python" \
        "$requires); $3, e.g. PYTHON=python3.12 scripts/train" >&2
    exit 2
}
make_venv() {
    local said package
    said=$("$PYTHON" -m venv .venv 2>&1) && return 0
    # Half made (a python without pip): every later run would take it as made and fail in pip, even once
    # the cause is fixed. Made just now, by this Python: nothing of the user's is in it.
    rm -rf .venv
    if grep -q ensurepip <<<"$said"; then  # Debian/Ubuntu without python3-venv: ten lines, said in one
        package=$(sed -n 's/.*apt install \(python3[0-9.]*-venv\).*/\1/p' <<<"$said")
        echo "scripts/venv.sh: PYTHON=$PYTHON cannot put pip into a new .venv (it has no ensurepip):" \
            "\`sudo apt install ${package:-python3-venv}\` (Debian/Ubuntu) and run again, or set PYTHON to a" \
            "Python that has ensurepip" >&2
        exit 2
    fi
    printf '%s\n' "$said" >&2
    exit 1
}
if [ ! -x .venv/bin/python ]; then
    make_venv
    if ! python_supported; then
        version=$(venv_version)
        rm -rf .venv  # made just now, by this Python: nothing of the user's is in it
        refuse_python "PYTHON=$PYTHON" "$version" "set PYTHON to a supported one"
    fi
elif ! python_supported; then
    refuse_python .venv "$(venv_version)" "delete .venv and run again with PYTHON set to a supported one"
elif [ -n "$asked_python" ]; then
    have=$(venv_version | cut -d. -f1,2 || true)  # none when pyvenv.cfg is missing: nothing to compare
    asked=
    [ -z "$have" ] || asked=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
    if [ -n "$asked" ] && [ "$asked" != "$have" ]; then
        echo "scripts/venv.sh: WARNING: .venv is Python $have, made before; PYTHON=$PYTHON (Python $asked) is" \
            "used only to make a new .venv: delete .venv and run again to use it" >&2
    fi
fi
# Before an install only: a .venv with every lock installed (by uv, on PATH then) runs as it is.
need_pip() {
    if [ "${install[0]}" != uv ] && [ ! -x .venv/bin/pip ]; then
        # Made without pip (by uv, --without-pip, or a Python without ensurepip): pip would fail on every run.
        echo "scripts/venv.sh: .venv has no pip (made without it): delete .venv and run again, or put uv on PATH" >&2
        exit 2
    fi
}
if [ ! -f "$runtime_stamp" ]; then
    need_pip
    # pip prints nothing for minutes while it downloads TensorFlow unless told: say what and why first.
    echo "scripts/venv.sh: installing the $(count "$LOCK") pinned packages of $LOCK into .venv" \
        "(TensorFlow alone is hundreds of MB: a few minutes the first time, then only when the lock changes)" >&2
    "${install[@]}" --require-hashes -r "$LOCK"
    "${install[@]}" --quiet --no-deps -e .
    rm -f .venv/.lock-*  # every older stamp, the extras' too: they were installed against the old pins
    touch "$runtime_stamp"
fi
onnx_asked=0
for name in $(printf '%s\n' "${extras[@]+"${extras[@]}"}" | sort -u); do
    extra_lock=requirements/$name.lock
    stamp=.venv/.lock-$name-$(hash16 "$LOCK" "$extra_lock")  # the runtime lock's pins hold the extra's
    if [ ! -f "$stamp" ]; then
        need_pip
        echo "scripts/venv.sh: installing the $(count "$extra_lock") pinned packages of $extra_lock into .venv" >&2
        "${install[@]}" --require-hashes -r "$extra_lock"
        rm -f .venv/.lock-"$name"-*
        touch "$stamp"
    fi
    [ "$name" = onnx ] && onnx_asked=1
done
# The exported LiteRT and ONNX files are checked by their runtimes in an environment without
# TensorFlow (.venv-runtime-check, which the export finds by itself); --test leaves it to its caller.
if [ "$onnx_asked" = 1 ] && [[ " ${extras[*]} " != *" test "* ]]; then
    scripts/venv-runtime-check.sh
fi
