# Training image: --build-arg VARIANT=gpu (default) | cpu picks the lock; --target runtime (default)
# | test (runtime + tests, for CI) | serve (runtime + the HTTP server). `invoke build` assembles the
# command. No "# syntax=" line: the engine's built-in BuildKit frontend has RUN --mount, so the file
# builds without a registry.

# Pinned by tag and digest (refresh both together). Another base (a mirror, an internal image)
# needs bash, python3 3.10-3.13 with venv, useradd, and tini or apt-get to install it.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1
ARG VARIANT=gpu
# The extras the image carries on top of the core, each from requirements/<name>.lock: what a run in
# the cloud asks for (RUNS_DIR in a bucket, MLflow, sweeps, ONNX). --build-arg EXTRAS="" builds the
# core alone; the `serve` target adds serve.
ARG EXTRAS="mlflow sweep store onnx"

FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini forwards `docker stop`'s SIGTERM to python, so training saves a resumable state (exit 75).
# Not version-pinned (DL3008): the base digest fixes the Debian release; a pinned revision breaks
# the build as soon as a security update replaces it.
# hadolint ignore=DL3008
RUN command -v tini >/dev/null \
    || { command -v apt-get >/dev/null \
         || { echo "BASE_IMAGE has neither tini nor apt-get to install it: use a base image with tini installed, or a Debian/Ubuntu one" >&2; exit 1; }; \
         apt-get update \
         && apt-get install -y --no-install-recommends tini \
         && rm -rf /var/lib/apt/lists/*; }

# A user that owns nothing but its home; at run time compose's `user:` (HOST_UID/HOST_GID) may be
# any other id, so that files on the mounted volume belong to the user on the host.
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
# APP_UID/APP_GID: a numeric USER, so runAsNonRoot can verify it. TINI_SUBREAPER: tini also under
# compose's `init: true`. MPLCONFIGDIR: a writable font cache for any run-time UID.

RUN python3 -m venv "${VIRTUAL_ENV}" \
    && install -d -o app -g app /runs /data
WORKDIR /app
# Every lock: the manifest records the installed runtime lock's hash; the GPU check reads them.
COPY requirements/*.lock ./requirements/
# Exec form: tini is PID 1 and python gets the signals. `docker run IMAGE <command>` runs any command.
ENTRYPOINT ["tini", "--", "python", "-m", "train"]
CMD ["fit"]
# No HEALTHCHECK: a training job has no endpoint; progress is in /runs/<run-id>/train.log.

# Dependencies from the lock before any source, so a code edit reuses this layer. ca_bundle: an
# optional secret for a TLS-intercepting proxy, never in a layer. PIP_CACHE_DIR: with HOME=/home/app
# pip (as root) would find its cache not owned by root and disable it.
FROM base AS deps-cpu
ARG EXTRAS
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && for extra in ${EXTRAS}; do echo "-r $extra.lock"; done > requirements/extras.txt \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements/cpu.lock -r requirements/extras.txt

FROM base AS deps-gpu
ARG EXTRAS
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && for extra in ${EXTRAS}; do echo "-r $extra.lock"; done > requirements/extras.txt \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements/gpu.lock -r requirements/extras.txt
# For the NVIDIA container toolkit: every GPU, CUDA and nvidia-smi/NVML. `--gpus` and compose's GPU
# reservation set NVIDIA_VISIBLE_DEVICES again after this; pick GPUs as docs/container.md says.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The package without re-resolving (--no-deps) or build isolation (setuptools is in the lock);
# README.m[d]: builds without it too. BUILD_COMMIT (GIT_COMMIT, no .git in the context) is each
# run's commit; last, so a new commit rebuilds one tiny layer. DL3006: deps-${VARIANT} is a stage.
# hadolint ignore=DL3006
FROM deps-${VARIANT} AS runtime
WORKDIR /app
COPY pyproject.toml README.m[d] ./
COPY train ./train
RUN pip install --no-deps --no-build-isolation --no-cache-dir . && rm -rf build ./*.egg-info
ARG GIT_COMMIT=""
RUN printf '%s\n' "${GIT_COMMIT}" > BUILD_COMMIT
# DL3066: numeric once expanded; hadolint does not expand variables.
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}

# The runtime plus the test lock, the tests and the files they compare with the code; nothing here
# reaches the runtime image. Root only to install.
FROM runtime AS test
USER 0
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements/test.lock
COPY requirements/*.in ./requirements/
COPY .env.exampl[e] ./
COPY tests ./tests
COPY docs ./docs
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}

# The runtime image plus the server of `python -m train serve` (requirements/serve.lock: Starlette,
# uvicorn), no test tools: `docker run -p 127.0.0.1:8501:8501 -v "$PWD/runs:/runs:ro" IMAGE:serve`
# serves the latest run's export. Inside the container it listens on every interface (0.0.0.0),
# else the published port would reach nothing; who may connect is decided where the port is
# published (compose: 127.0.0.1 only). Readiness: /v2/health/ready, 200 once the model is warmed up.
FROM runtime AS serve
USER 0
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && PIP_CACHE_DIR=/root/.cache/pip pip install --require-hashes --no-deps -r requirements/serve.lock
# hadolint ignore=DL3066
USER ${APP_UID}:${APP_GID}
EXPOSE 8501
# The image has Python but no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/v2/health/ready', timeout=4)"]
CMD ["serve", "latest", "--host", "0.0.0.0", "--port", "8501"]

# A build without --target gives the last stage: the runtime image.
FROM runtime AS default
