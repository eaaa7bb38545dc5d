# Training image. Two build choices:
#   --build-arg VARIANT=gpu (default) or cpu: which lock is installed (cpu: tensorflow-cpu, no CUDA wheels);
#   --target runtime (what trains; the default) or test (runtime + the test tools and tests/, for CI)
#   or serve (runtime + the HTTP server of `python -m train serve`).
# Both variants share every layer but the one that installs the lock file.
#
# No "# syntax=" line on purpose: the engine's built-in BuildKit frontend supports RUN --mount, so
# the file builds where no registry is reachable. Build with BuildKit on (DOCKER_BUILDKIT=1, the
# default since Docker 23, or `docker compose build`); `invoke build` assembles the command.

# Base image pinned by tag and digest. The digest is the docker.io index digest of
# python:3.11.13-slim-bookworm as pinned in public Dockerfiles (looked up when this file was
# written); refresh both together. Override with --build-arg BASE_IMAGE=... for a registry mirror or
# an internal image; it needs bash, python3 (3.10-3.13) with the venv module, and useradd.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1
# Declared before the first FROM so that a FROM line can use it: it picks the dependency stage.
ARG VARIANT=gpu

FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini forwards `docker stop`'s SIGTERM to python and reaps zombies, so training saves a resumable
# state before it exits (exit code 75). The slim image has no tini; a base that already ships it
# skips apt. Not version-pinned (DL3008): the base digest fixes the Debian release, and pinning a
# Debian revision breaks the build as soon as a security update replaces it.
# hadolint ignore=DL3008
RUN command -v tini >/dev/null \
    || { apt-get update \
         && apt-get install -y --no-install-recommends tini \
         && rm -rf /var/lib/apt/lists/*; }

# The user that owns nothing but its home: the image's files stay root-owned and read-only to it.
# UID/GID are build arguments; at run time compose's `user:` (HOST_UID/HOST_GID) may pick any other
# id, so that files written to the mounted volume belong to the user on the host.
ARG UID=1000
ARG GID=1000
RUN groupadd --gid "${GID}" app \
    && useradd --uid "${UID}" --gid "${GID}" --create-home --shell /bin/bash app \
    && chmod 1777 /home/app  # any run-time UID can write caches (~/.keras) here

ENV APP_UID=${UID} \
    APP_GID=${GID} \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    HOME=/home/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    TINI_SUBREAPER=1 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    MPLCONFIGDIR=/tmp/matplotlib \
    RUNS_DIR=/runs \
    DATA_DIR=/data
# APP_UID/APP_GID: the build-time ids, for the numeric USER of each stage (so runAsNonRoot can verify).
# TINI_SUBREAPER: lets tini work under compose's `init: true` (docker-init as PID 1) too.
# MPLCONFIGDIR: the report's matplotlib font cache; HOME is not writable when HOST_UID is not the
# build-time UID, and matplotlib would otherwise warn and rebuild the cache at every start.
# TF_CPP_MIN_LOG_LEVEL=2 keeps TensorFlow's C++ INFO/WARNING noise out of the logs; set 0 to debug.

RUN python3 -m venv "${VIRTUAL_ENV}" \
    && install -d -o app -g app /runs /data
WORKDIR /app
# Both runtime locks: each run's manifest records the hash of the one installed, and the GPU check
# compares them with TensorFlow's tested stack.
COPY requirements.lock requirements-gpu.lock ./
# Exec form, so tini is PID 1 and python receives signals directly. `docker run IMAGE` trains;
# `docker run IMAGE check|export|runs|predict ...` runs the other commands of the CLI.
ENTRYPOINT ["tini", "--", "python", "-m", "train"]
CMD ["fit"]
# No HEALTHCHECK: a training job has no endpoint to probe, and "still running" is what the container
# state already says; progress is in /runs/<run-id>/train.log.

# Dependencies come from the lock before any source is copied: a code edit reuses this layer.
# The cache mount keeps downloaded wheels across rebuilds without storing them in the image.
# ca_bundle is an optional BuildKit secret for networks that intercept TLS (corporate proxies):
# `--secret id=ca_bundle,src=/path/ca.pem`; it is mounted for this step only, never in a layer.
# PIP_CACHE_DIR points pip at the cache mount: with HOME=/home/app, pip (as root) would otherwise
# look in /home/app/.cache/pip, find it not owned by root and disable its cache altogether.
FROM base AS deps-cpu
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements.lock

FROM base AS deps-gpu
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements-gpu.lock
# Read by the NVIDIA container toolkit: which GPUs to mount and which driver libraries (compute:
# CUDA; utility: nvidia-smi and NVML for `train check`). `docker run --gpus` and compose's GPU
# reservation set NVIDIA_VISIBLE_DEVICES after this environment, so the later value wins; pick GPUs
# with `--gpus '"device=0,2"'`, or CUDA_VISIBLE_DEVICES in .env with compose.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The package, installed without re-resolving anything (--no-deps) and without build isolation
# (setuptools comes from the lock, so nothing unpinned is downloaded). README.md is the package's
# long description; the [d] wildcard lets the build work in a checkout without it. BUILD_COMMIT
# records the commit the image was built from for each run's manifest (there is no .git in the
# build context: `invoke build`/`invoke train` pass GIT_COMMIT, and compose does when it is set in
# the environment or .env); it comes last, so a new commit rebuilds one tiny layer. ENTRYPOINT, CMD
# and the environment are inherited from `base`.
# DL3006 ("tag the image"): deps-${VARIANT} is one of the two stages above, not an image.
# hadolint ignore=DL3006
FROM deps-${VARIANT} AS runtime
WORKDIR /app
COPY pyproject.toml README.m[d] ./
COPY train ./train
RUN pip install --no-deps --no-build-isolation --no-cache-dir . && rm -rf build ./*.egg-info
ARG GIT_COMMIT=""
RUN printf '%s\n' "${GIT_COMMIT}" > BUILD_COMMIT
# DL3066 ("non-numeric user"): it is numeric once expanded; hadolint does not expand variables.
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}

# The runtime image plus what only the tests need: the test lock (pytest, invoke, pillow, ...), the
# tests, and the files they compare with the code (.env.example, the lock inputs, docs/). CI runs
# the suite in it; nothing here reaches the runtime image. Root only to install, then the same user.
FROM runtime AS test
USER 0
COPY requirements-test.lock ./
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements-test.lock
COPY requirements*.in .env.exampl[e] ./
COPY tests ./tests
COPY docs ./docs
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}

# The runtime image plus the server of `python -m train serve` (requirements-serve.lock: Starlette,
# uvicorn), no test tools: `docker run -p 127.0.0.1:8501:8501 -v "$PWD/runs:/runs:ro" IMAGE:serve`
# serves the latest run's export. Inside the container it listens on every interface (0.0.0.0),
# else the published port would reach nothing; who may connect is decided where the port is
# published (compose: 127.0.0.1 only). Readiness: /v2/health/ready, 200 once the model is warmed up.
FROM runtime AS serve
USER 0
COPY requirements-serve.lock ./
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements-serve.lock
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}
EXPOSE 8501
# The image has Python but no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/v2/health/ready', timeout=4)"]
CMD ["serve", "latest", "--host", "0.0.0.0", "--port", "8501"]

# The last stage is what a build without --target gives: the runtime image, not the test one.
FROM runtime AS default
