"""The container files keep their promises: pinned base, non-root, signals, no secrets, CPU variant.

Static checks run everywhere; `docker compose config` runs where a compose binary is installed
(marked `docker`). Building and running the image is .ci/docker.sh's job (minutes, not seconds).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "Dockerfile").is_file():
    pytest.skip("Dockerfile and compose files are host-side (not in the image)", allow_module_level=True)
DOCKERFILE = (ROOT / "Dockerfile").read_text()
INSTRUCTIONS = [line for line in DOCKERFILE.splitlines() if line and not line.startswith((" ", "#"))]


def test_no_syntax_line_so_the_builtin_frontend_is_used():
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.M | re.I)


def test_base_image_is_pinned_by_tag_and_digest_and_overridable():
    assert re.search(r"^ARG BASE_IMAGE=python:3\.1[0-3][\w.-]*-slim-bookworm@sha256:[0-9a-f]{64}$", DOCKERFILE, re.M)
    assert "FROM ${BASE_IMAGE} AS base" in DOCKERFILE


def test_runtime_and_test_stages_end_as_a_numeric_non_root_user_with_an_init_entrypoint():
    froms = [i for i in INSTRUCTIONS if i.startswith("FROM ")]
    assert froms[-4:] == [
        "FROM deps-${VARIANT} AS runtime",
        "FROM runtime AS test",
        "FROM runtime AS serve",
        "FROM runtime AS default",
    ]
    assert "ARG VARIANT=gpu" in INSTRUCTIONS[: INSTRUCTIONS.index(froms[0])]  # global: usable in FROM
    users = [i for i in INSTRUCTIONS if i.startswith("USER ")]
    # runtime; then test and serve, each root only to install
    assert users == ["USER ${APP_UID}:${APP_GID}"] + ["USER 0", "USER ${APP_UID}:${APP_GID}"] * 2
    assert 'ENTRYPOINT ["tini", "--", "python", "-m", "train"]' in INSTRUCTIONS
    assert 'SHELL ["/bin/bash", "-o", "pipefail", "-c"]' in INSTRUCTIONS


def _stage(name: str) -> str:
    """The instructions of one stage, from its FROM line to the next (comments left out)."""
    start = re.search(rf"^FROM \S+ AS {name}$", DOCKERFILE, re.M).start()
    end = re.search(r"^FROM ", DOCKERFILE[start + 1 :], re.M)
    text = DOCKERFILE[start : start + 1 + end.start()] if end else DOCKERFILE[start:]
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def test_the_runtime_image_holds_no_tests_and_no_test_tools():
    runtime = _stage("runtime")
    assert "COPY train ./train" in runtime and "tests" not in runtime and "requirements-test" not in runtime
    assert "COPY tests ./tests" in _stage("test") and "-r requirements/test.lock" in _stage("test")
    assert not re.search(r"^(pytest|invoke)\b", (ROOT / "requirements/core.in").read_text(), re.M)


def test_dependencies_come_from_the_lock_with_hashes_before_the_source():
    deps = DOCKERFILE.index("--require-hashes")
    assert DOCKERFILE.index("COPY train") > deps and "--mount=type=cache" in DOCKERFILE
    assert DOCKERFILE.count("pip install --require-hashes --no-deps -r requirements") == 4  # cpu, gpu, test, serve
    assert DOCKERFILE.count("pip install --no-deps --no-build-isolation") == 1


def test_pip_uses_the_build_cache_mount():
    # HOME is the run-time user's, so without PIP_CACHE_DIR pip ignores the mount (and disables its cache).
    mounts = re.findall(r"--mount=type=cache,target=(\S+?),", DOCKERFILE)
    installs = re.findall(r"PIP_CACHE_DIR=(\S+) pip install --require-hashes", DOCKERFILE)
    assert len(mounts) == 4 and installs == mounts


def _run_instruction(start: str) -> str:
    """The shell script of the RUN instruction that begins with `start`, its continuation lines joined."""
    lines = DOCKERFILE.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(start))
    script = []
    while True:
        line = lines[i]
        script.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
        i += 1
    return " ".join(script).removeprefix("RUN ")


def test_a_base_image_without_tini_or_apt_get_stops_the_build_with_one_line_naming_both(tmp_path):
    """A replacement base (BASE_IMAGE) without tini must say what it lacks, not `apt-get: command not found`."""
    script = _run_instruction("RUN command -v tini")
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run(
        ["/bin/bash", "-o", "pipefail", "-c", script], env={"PATH": str(empty)}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert all(word in result.stderr for word in ("tini", "apt-get", "BASE_IMAGE")), result.stderr
    tini = empty / "tini"  # a base that has tini: nothing to install
    tini.write_text("#!/bin/sh\n")
    tini.chmod(0o755)
    assert subprocess.run(["/bin/bash", "-o", "pipefail", "-c", script], env={"PATH": str(empty)}).returncode == 0


def test_gpu_target_exposes_the_driver_capabilities_it_needs():
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in DOCKERFILE and "TF_CPP_MIN_LOG_LEVEL=2" in DOCKERFILE


def _in_context(path: str) -> bool:
    """Whether .dockerignore lets `path` into the build context (last matching rule wins)."""
    included = True
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/").replace("**/", "")
        parts = Path(path).parts
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))) or fnmatch.fnmatch(
            Path(path).name, pattern
        ):
            included = negate
    return included


@pytest.mark.parametrize(
    "path",
    [
        ".env",
        "runs/x/checkpoints/a.ckpt",
        "data/mnist.npz",
        ".git/config",
        ".venv/bin/python",
        "train/.env",
        "tasks.py",
        "checkpoints/x",
    ],
)
def test_dockerignore_keeps_secrets_and_artefacts_out(path):
    assert not _in_context(path)


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "requirements/cpu.lock",
        "requirements/gpu.lock",
        "requirements/test.lock",
        "requirements/serve.lock",
        "train/training/fit.py",
        "train/gpucheck/stack.py",
        "tests/gpucheck/test_stack.py",
        "docs/gpu-check.md",
    ],
)
def test_dockerignore_lets_the_build_inputs_in(path):
    assert _in_context(path)


def _compose() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.docker
@pytest.mark.parametrize("files", [["docker-compose.yml"], ["docker-compose.yml", "docker-compose.cpu.yml"]])
def test_compose_config_accepts_both_variants(files):
    compose = _compose()
    if compose is None:
        pytest.skip("no Docker Compose v2 binary (docker compose / docker-compose) installed")
    args = [a for f in files for a in ("-f", f)]
    env = {"PATH": shutil.os.environ.get("PATH", ""), "HOST_UID": "1234", "HOST_GID": "567"}
    out = subprocess.run(
        [*compose, *args, "--profile", "tensorboard", "config"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert 'user: "1234:567"' in out.stdout or "user: 1234:567" in out.stdout
    assert "init: true" in out.stdout and "stop_grace_period: 2m0s" in out.stdout
    gpu = len(files) == 1
    assert ("driver: nvidia" in out.stdout) is gpu
    assert "target: runtime" in out.stdout and ("VARIANT: gpu" if gpu else "VARIANT: cpu") in out.stdout
    assert "host_ip: 127.0.0.1" in out.stdout and out.stdout.count("target: 6006") == 1  # TensorBoard: local only


def _config_in_copy(tmp_path, dot_env: str, *args: str, **env: str) -> str:
    """`docker compose [args] config` (both variants) of a copy of the compose files with this .env."""
    compose = _compose()
    if compose is None:
        pytest.skip("no Docker Compose v2 binary (docker compose / docker-compose) installed")
    for name in ("docker-compose.yml", "docker-compose.cpu.yml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".env").write_text(dot_env)
    out = subprocess.run(
        [*compose, *args, "config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": shutil.os.environ.get("PATH", ""), **env},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.docker
def test_a_copied_env_example_keeps_the_volumes_and_resume_auto(tmp_path):
    # `cp .env.example .env`, then the host paths uncommented: the container still uses its volumes.
    dot_env = (ROOT / ".env.example").read_text() + "RUNS_DIR=./runs\nDATA_DIR=./data\nCUDA_VISIBLE_DEVICES=1\n"
    out = _config_in_copy(tmp_path, dot_env)
    assert "RUNS_DIR: /runs" in out and "DATA_DIR: /data" in out and "./runs" not in out.split("x-volumes")[0]
    assert "RESUME: auto" in out
    assert 'CUDA_VISIBLE_DEVICES: "1"' in out  # the documented way to pick GPUs reaches the container


@pytest.mark.docker
def test_a_host_set_up_as_a_worker_trains_in_its_cluster_and_sweeps_alone(tmp_path):
    """WORKERS in .env is for `train`: the sweep refuses a cluster, so `up sweep` on such a host failed."""
    dot_env = "WORKERS=10.0.0.1:2222,10.0.0.2:2222\nWORKER_INDEX=1\nTF_CONFIG={}\n"
    config = _config_in_copy(tmp_path, dot_env, "--profile", "sweep")
    services = dict(re.findall(r"^  (\w+):\n(.*?)(?=^  \w+:\n|^\S)", config, re.M | re.S))
    train, sweep = services["train"], services["sweep"]
    assert "WORKERS: 10.0.0.1:2222,10.0.0.2:2222" in train and 'WORKER_INDEX: "1"' in train, train
    assert 'WORKERS: ""' in sweep and 'WORKER_INDEX: "-1"' in sweep and 'TF_CONFIG: ""' in sweep, sweep


@pytest.mark.docker
def test_build_inputs_come_from_the_environment_without_editing_the_compose_file(tmp_path):
    plain = _config_in_copy(tmp_path, "")
    assert "GIT_COMMIT" not in plain and "BASE_IMAGE" not in plain and "file: /dev/null" in plain
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    out = _config_in_copy(tmp_path, f"BASE_IMAGE=mirror.example/python:3.11\nCA_BUNDLE={ca}\n", GIT_COMMIT="0123abcd")
    assert "GIT_COMMIT: 0123abcd" in out and "BASE_IMAGE: mirror.example/python:3.11" in out
    assert f"file: {ca}" in out and "source: ca_bundle" in out


def _compose_up_lines(text: str, markdown: bool) -> list[str]:
    """Lines that tell a user to run `docker compose ... up` (in a markdown file: its code blocks)."""
    if markdown:
        text = "\n".join(re.findall(r"^```\w*\n(.*?)^```", text, re.M | re.S))
    return [line for line in text.splitlines() if re.search(r"docker compose .*\bup\b", line)]


@pytest.mark.parametrize("name", ["README.md", "docker-compose.yml", "docker-compose.cpu.yml"])
def test_every_documented_compose_up_that_trains_returns_the_training_exit_code(name):
    # A plain `docker compose up` exits 0 even when training failed: scripts would see success.
    lines = _compose_up_lines((ROOT / name).read_text(), markdown=name.endswith(".md"))
    assert lines or name != "README.md"
    for line in lines:
        if "tensorboard" in line or "--detach" in line or "up serve" in line:  # serve: no training to wait for
            continue
        # the multi-worker file trains in worker0 (the chief), every other file in `train`
        service = "worker0" if "docker-compose.multiworker.yml" in line else "train"
        assert f"--exit-code-from {service}" in line, line


def test_workflow_builds_both_variants_with_a_layer_cache_and_linters_in_a_venv():
    wf = (ROOT / ".github" / "workflows" / "container.yml").read_text()
    assert "variant: [cpu, gpu]" in wf and "VARIANT=${{ matrix.variant }}" in wf and "target: runtime" in wf
    assert "target: test" in wf and "tf-train-template:cpu-test -m pytest" in wf
    assert "cache-from: type=gha" in wf and "cache-to: type=gha,mode=max" in wf
    assert "pip install --user" not in wf and 'python3 -m venv "$RUNNER_TEMP/lint"' in wf
    assert "GIT_COMMIT" in wf  # every image the workflow builds records its commit


def test_every_training_service_trains_on_the_volumes_whatever_env_says():
    """`environment:` wins over `env_file:` in compose: each service that runs `fit` pins the volumes."""
    # readers: services that only read the runs volume (serve), pinned to it as well
    for name, services, readers in (("docker-compose.yml", 1, 1), ("docker-compose.multiworker.yml", 2, 0)):
        if name != "docker-compose.yml" and not (ROOT / name).is_file():
            continue  # a fork without the workers extra deletes its compose file (docs/distributed.md)
        text = (ROOT / name).read_text()
        assert text.count("RUNS_DIR: /runs") == services + readers, name
        assert text.count("DATA_DIR: /data") == services, name


# --- the container quick start, as the README and docs/container.md show it --------------------------


def _quick_start(doc: str) -> list[str]:
    """The shell lines of the code block that sets up .env and runs `docker compose up` in a doc."""
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / doc).read_text(), re.S):
        if "docker compose up --exit-code-from train" in block and ">> .env" in block:
            return block.splitlines()
    raise AssertionError(f"{doc} has no quick-start block")


@pytest.mark.parametrize("doc", ["README.md", "docs/container.md"])
def test_the_quick_starts_env_lines_can_be_run_twice(doc, tmp_path):
    """Pasting the block again (a newcomer does) adds no line to .env twice and keeps the .env there
    (the copy of .env.example must not replace it); the CPU line is shown commented out, to be run on
    a CPU-only host, and is just as safe to repeat."""
    shown = [line.lstrip("# ").split("  #")[0] for line in _quick_start(doc)]
    lines = [line for line in shown if ">> .env" in line or ".env.example" in line]
    assert any("HOST_UID=" in line for line in lines) and any("COMPOSE_FILE=" in line for line in lines)
    assert any(".env.example" in line for line in lines)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env.example")
    (tmp_path / ".env").write_text("# HOST_UID=1000   (commented out, as in .env.example)\nEPOCHS=2\n")
    for _ in range(2):
        for line in lines:
            subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True)
    keys = [line.split("=")[0] for line in (tmp_path / ".env").read_text().splitlines() if not line.startswith("#")]
    assert sorted(keys) == ["COMPOSE_FILE", "EPOCHS", "HOST_GID", "HOST_UID"]
    assert "COMPOSE_FILE=docker-compose.yml:docker-compose.cpu.yml" in (tmp_path / ".env").read_text()


@pytest.mark.parametrize("doc", ["README.md", "docs/container.md"])
def test_the_quick_start_says_on_the_up_line_that_a_cpu_host_needs_the_cpu_file_first(doc):
    lines = _quick_start(doc)
    up = next(i for i, line in enumerate(lines) if line.startswith("docker compose up --exit-code-from train"))
    assert "GPU" in lines[up] and "CPU" in lines[up]
    assert "No NVIDIA GPU" in lines[up - 2] and "docker-compose.cpu.yml" in lines[up - 1]
