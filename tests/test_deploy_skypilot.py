"""deploy/skypilot/train.yaml, as SkyPilot itself reads it (offline), and its `run:` script, as bash runs it.

SkyPilot lives in its own environment (scripts/venv-skypilot.sh installs requirements/skypilot.lock
into .venv-skypilot; SKYPILOT_PYTHON may name another interpreter). Without it these tests skip;
REQUIRE_ALL=1 (as .ci/run sets) turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, subprocess_env

TASK = PROJECT_ROOT / "deploy" / "skypilot" / "train.yaml"
if not TASK.is_file():
    pytest.skip("deploy/ is host-side (not in the image)", allow_module_level=True)
IMAGE = "registry.example.com/tf-train-template:gpu"
BUCKET = "s3://my-bucket/runs/tf-train"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIA-test", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}


def _skypilot_python() -> str:
    given = os.environ.get("SKYPILOT_PYTHON")
    own = PROJECT_ROOT / ".venv-skypilot" / "bin" / "python"
    if given:
        return given
    if own.is_file():
        return str(own)
    pytest.skip("SkyPilot is not installed (scripts/venv-skypilot.sh installs it into .venv-skypilot)")


def _read_tasks(tmp_path: Path, *overrides: dict) -> list[dict]:
    """The task as SkyPilot reads it with each {"envs": ..., "secrets": ...}, in one start of its interpreter."""
    out = tmp_path / "task.json"
    home = tmp_path / "home"  # SkyPilot writes ~/.sky on import: never the user's own
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "AWS_", "PYTHON"))}
    env.update(HOME=str(home), SKYPILOT_DISABLE_USAGE_COLLECTION="1")
    proc = subprocess.run(
        [
            _skypilot_python(),
            str(PROJECT_ROOT / "tests" / "skypilot_task.py"),
            str(TASK),
            str(out),
            json.dumps(overrides),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> dict[str, dict]:
    """The task as `sky jobs launch deploy/skypilot/train.yaml --env RUNS_DIR=... --secret ...` reads it
    ("launched"), without the secrets ("unresolved") and without RUNS_DIR ("no_runs_dir"): one import of
    SkyPilot (seconds) for the three."""
    given = {
        "launched": {"envs": {"RUNS_DIR": BUCKET}, "secrets": CREDENTIALS},
        "unresolved": {"envs": {"RUNS_DIR": BUCKET}},
        "no_runs_dir": {},
    }
    return dict(zip(given, _read_tasks(tmp_path_factory.mktemp("sky"), *given.values())))


@pytest.fixture(scope="module")
def task(reads) -> dict:
    """The task as `sky jobs launch deploy/skypilot/train.yaml --env RUNS_DIR=... --secret ...` reads it."""
    assert "error" not in reads["launched"], reads["launched"]
    return reads["launched"]


def test_the_job_runs_our_image_on_spot_gpus(task):
    assert task["image_id"] == {None: f"docker:{IMAGE}"} or list(task["image_id"].values()) == [f"docker:{IMAGE}"]
    assert task["use_spot"] is True and task["accelerators"]
    assert task["num_nodes"] == 1  # one node by default; num_nodes is the one number to raise


def test_a_saved_stop_is_recovered_and_nothing_else_is_retried(task):
    recovery = task["job_recovery"]
    assert recovery["recover_on_exit_codes"] == [75]
    # SkyPilot retries every other non-zero exit up to max_restarts_on_errors times, 137 included:
    # an out-of-memory kill must fail the job, not loop.
    assert recovery["max_restarts_on_errors"] == 0
    assert "MAX_MINUTES" not in task["envs"]  # its stop exits 75 as well: it would be recovered forever


def test_the_run_lives_in_the_bucket_and_the_recovered_job_resumes_it(task):
    envs = task["envs"]
    assert envs["RUNS_DIR"] == BUCKET and envs["RESUME"] == "auto" and envs["RUN_NAME"]
    assert int(envs["BATCH_SIZE"]) % task["num_nodes"] == 0


def test_credentials_come_at_launch_as_secrets_never_as_settings(task, reads):
    assert task["secrets"] == sorted(CREDENTIALS) and not set(task["envs"]) & set(CREDENTIALS)
    text = TASK.read_text(encoding="utf-8")
    assert all(value not in text for value in CREDENTIALS.values())
    unresolved = reads["unresolved"]
    assert unresolved["secrets_at_launch"] == sorted(CREDENTIALS)  # SkyPilot asks for them at launch


def test_skypilot_refuses_the_task_without_a_runs_dir(reads):
    refused = reads["no_runs_dir"]
    assert "RUNS_DIR" in refused["error"] and "--env" in refused["error"]


def test_no_port_is_opened_to_the_outside(task):
    # TensorFlow's training port listens unauthenticated on every interface: only the job's own nodes reach it.
    assert task["ports"] is None


# --- the `run:` script, as bash runs it on a node ----------------------------------------------------


def _run_script(task: dict, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """bash runs the task's `run:` with SkyPilot's variables; `python` is this suite's interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    # Whatever reads the bucket's URL must never leave this host: a closed local port, no instance metadata.
    offline = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true"}
    base = subprocess_env(PYTHONPATH=str(PROJECT_ROOT), **offline, **{**task["envs"], **env})
    base["PATH"] = f"{bin_dir}{os.pathsep}{base['PATH']}"
    return subprocess.run(
        ["bash", "-c", task["run"]], cwd=tmp_path, capture_output=True, text=True, env=base, timeout=300
    )


@pytest.mark.parametrize("runs_dir", ["/runs", "./runs", "s3:/bucket", "s3://", "", "file:///runs"])
def test_the_run_script_refuses_a_runs_dir_that_is_not_a_bucket_in_one_line(task, tmp_path, runs_dir):
    proc = _run_script(task, tmp_path, RUNS_DIR=runs_dir)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"RUNS_DIR='{runs_dir}' is not valid:") and "s3://BUCKET" in line


def test_the_run_script_hands_the_templates_exit_code_to_skypilot(task, tmp_path):
    """On a bucket the script starts `python -m train fit` itself (exec): a setting the template refuses
    is its own one-line error and exit code, before TensorFlow (a node rank SkyPilot would never give is
    one too: tests/workers/test_cluster.py)."""
    proc = _run_script(task, tmp_path, EPOCHS="0")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ConfigError: EPOCHS=0"), lines
