"""manifest: git facts (or the BUILD_COMMIT baked into the image), the lock hash, updates."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from train.run import manifest
from train.run.files import read_json
from train.run.manifest import file_sha256, git_info, lock_hash, update_manifest


def _git(root, *args):
    subprocess.run(
        ["git", "-C", str(root), *args],
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(root),
            "PATH": "/usr/bin:/bin",
        },
    )


@pytest.fixture
def no_git(monkeypatch):
    """Make `git` unavailable, as inside the image."""

    def fail(*a, **kw):
        raise FileNotFoundError("git")

    monkeypatch.setattr(manifest.subprocess, "run", fail)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_git_info_in_a_repository_reports_commit_and_dirty(tmp_path):
    (tmp_path / "f.txt").write_text("1")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "commit", "-q", "-m", "c")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git_info(tmp_path) == {"commit": head, "dirty": False, "source": "git"}
    (tmp_path / "f.txt").write_text("2")
    assert git_info(tmp_path)["dirty"] is True


def test_a_dirty_checkout_gets_one_warning_line_and_a_clean_one_none():
    line = manifest.dirty_warning({"git": {"commit": "0123456789abcdef" * 2, "dirty": True, "source": "git"}})
    assert line.startswith("WARNING: the checkout has uncommitted changes on top of commit 0123456789ab")
    assert "\n" not in line and "--allow-dirty" in line
    for git in ({"commit": "0123", "dirty": False}, {"commit": "0123", "dirty": None}, None):
        assert manifest.dirty_warning({"git": git}) is None


def test_git_info_outside_git_reads_build_commit(tmp_path, no_git):
    (tmp_path / "BUILD_COMMIT").write_text("abc123\n")
    assert git_info(tmp_path) == {"commit": "abc123", "dirty": None, "source": str(tmp_path / "BUILD_COMMIT")}


def test_git_info_not_a_repository_falls_back_too(tmp_path):
    (tmp_path / "BUILD_COMMIT").write_text("")  # built outside git: baked empty
    info = git_info(tmp_path)  # real git, but tmp_path is no repository
    assert info["commit"] is None and info["source"].endswith("BUILD_COMMIT")
    assert info["commit_missing"].startswith("GIT_COMMIT was not set when this image was built: rebuild it with")
    assert "GIT_COMMIT=$(git rev-parse HEAD) docker compose build" in info["commit_missing"]


def test_git_info_with_nothing_says_why(tmp_path, no_git):
    info = git_info(tmp_path)
    assert info["commit"] is None and "no BUILD_COMMIT" in info["source"]


def test_lock_hash_names_the_installed_lock(tmp_path):
    from importlib import metadata

    try:
        metadata.version("tensorflow-cpu")
        name = "requirements/cpu.lock"
    except metadata.PackageNotFoundError:
        name = "requirements/gpu.lock"
    (tmp_path / "requirements").mkdir()
    (tmp_path / name).write_text("tensorflow==x\n")
    got = lock_hash(tmp_path)
    assert got == {"file": str(tmp_path / name), "sha256": hashlib.sha256(b"tensorflow==x\n").hexdigest()}
    (tmp_path / name).unlink()
    assert lock_hash(tmp_path)["sha256"] is None
    assert file_sha256(tmp_path / "missing") is None


def test_update_manifest_merges_fields(tmp_path):
    path = tmp_path / "manifest.json"
    update_manifest(path, status="running", seed=1)
    update_manifest(path, status="completed")
    assert read_json(path) == {"status": "completed", "seed": 1}


def test_project_root_is_the_checkout():
    root = manifest.project_root()
    assert (root / "train" / "run" / "manifest.py").is_file()


# -- segments: the history of a run, one entry per process that trained it -----------------------
@pytest.fixture
def facts(monkeypatch):
    """The environment facts without importing TensorFlow."""
    monkeypatch.setattr(manifest, "environment_facts", lambda settings: {"host": "h", "seed": 42})


FINISHED = {
    "run_id": "r",
    "status": "completed",
    "started_at": "2026-01-01T00:00:00+00:00",
    "resumed_at": [],
    "ended_at": "2026-01-01T00:01:34+00:00",
    "error": None,
    "epochs_completed": 3,
    "best": {"monitor": "val_accuracy", "value": 0.9},
    "export": {"max_abs_diff": 0.0},
    "final_weights_sha256": "f" * 64,
    "final_metrics": {"epoch": 3},
    "duration_seconds": 94.0,
    "data": {"fingerprint": "a" * 64},
}


def test_a_resume_that_stops_early_keeps_what_the_finished_run_recorded(tmp_path, facts):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {**FINISHED, "segments": [{"status": "completed", "seconds": 94.0}]})
    seg = manifest.new_segment(5, 3, "ckpt-000000036.npz (epoch 3, step 0)")
    manifest.open_segment(path, read_json(path), object(), seg)
    manifest.record_data(path, {"fingerprint": "a" * 64}, {"policy": "float32"})
    m = manifest.close_segment(
        path, "interrupted", None, 20.0, epoch=3, best={"monitor": "val_accuracy", "value": None}
    )
    for key in ("best", "export", "final_weights_sha256", "final_metrics", "epochs_completed", "started_at"):
        assert m[key] == FINISHED[key], key
    assert m["status"] == "interrupted" and m["duration_seconds"] == 114.0
    assert [s["status"] for s in m["segments"]] == ["completed", "interrupted"]
    last = m["segments"][-1]
    assert last["resumed_from"].startswith("ckpt-000000036.npz") and last["epoch_from"] == 3 and last["epoch_to"] == 3
    assert last["epochs_planned"] == 5 and last["data_fingerprint"] == "a" * 64 and last["ended_at"]
    assert m["resumed_at"] == [last["started_at"]]


def test_a_completed_run_resumed_as_it_was_keeps_what_trained_it(tmp_path, monkeypatch):
    """It trains nothing (its test split and export are done again): `reproduce` must still check out
    the code that made its weights, not a later, dirty tree's, and name the devices and precision
    they were trained on. Each segment records its own."""
    made, later = {"commit": "a" * 40, "dirty": False}, {"commit": "b" * 40, "dirty": True}
    facts = {"host": "h", "git": later, "keras": "9", "gpus": []}
    monkeypatch.setattr(manifest, "environment_facts", lambda settings: facts)
    path = tmp_path / "manifest.json"
    bf16 = {"policy": "mixed_bfloat16", "reason": "an A100"}
    start = {**FINISHED, "git": made, "keras": "3", "gpus": [{"name": "A100"}], "precision": bf16}
    manifest.write_json(path, {**start, "segments": [{"status": "completed", "git": made}]})
    idle = manifest.new_segment(3, 3, "ckpt (epoch 4, step 0)", trains=False)
    manifest.open_segment(path, read_json(path), object(), idle)
    m = manifest.record_data(path, {"fingerprint": "a" * 64}, {"policy": "float32", "reason": "this CPU"})
    assert (m["git"], m["keras"], m["gpus"], m["precision"]) == (made, "3", [{"name": "A100"}], bf16)
    assert m["segments"][-1]["git"] == later and m["segments"][-1]["precision"] == "float32"
    manifest.open_segment(path, read_json(path), object(), manifest.new_segment(5, 3, "ckpt (epoch 4, step 0)"))
    m = manifest.record_data(path, {"fingerprint": "a" * 64}, {"policy": "float32", "reason": "this CPU"})
    assert (m["git"], m["keras"], m["gpus"]) == (later, "9", [])  # two more epochs: the later code trains them
    assert m["precision"]["policy"] == "float32"


def test_an_old_manifest_becomes_the_first_segment_and_a_forced_data_change_is_recorded(tmp_path, facts):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, FINISHED)  # written before segments existed
    seg = manifest.new_segment(4, 3, "ckpt", forced=["DATA: fingerprint aaaa... -> bbbb... (x.npz)"])
    manifest.open_segment(path, read_json(path), object(), seg)
    manifest.record_data(path, {"fingerprint": "b" * 64}, {"policy": "float32"})
    m = manifest.close_segment(path, "completed", None, 10.0, epoch=4, best={"monitor": "val_accuracy", "value": 0.95})
    first, second = m["segments"]
    assert first["data_fingerprint"] == "a" * 64 and first["status"] == "completed" and first["seconds"] == 94.0
    assert second["data_fingerprint"] == "b" * 64 and second["forced_changes"] == seg["forced_changes"]
    assert m["data"]["fingerprint"] == "b" * 64 and m["best"]["value"] == 0.95 and m["epochs_completed"] == 4
    assert m["duration_seconds"] == 104.0


def test_a_killed_segment_is_closed_at_its_last_checkpoint_when_the_run_resumes(tmp_path, facts):
    import datetime as dt

    path = tmp_path / "manifest.json"
    killed = manifest.new_segment(3)
    killed["started_at"] = "2026-01-01T00:00:00+00:00"
    manifest.write_json(path, {**FINISHED, "status": "running", "segments": [killed]})
    last_write = dt.datetime(2026, 1, 1, 0, 1, 0, tzinfo=dt.timezone.utc).timestamp()
    m = manifest.open_segment(path, read_json(path), object(), manifest.new_segment(3, 1), last_write=last_write)
    assert m["segments"][0]["status"] == "killed" and m["segments"][0]["seconds"] == 60.0
    assert m["segments"][0]["seconds_estimated"] is True and m["segments"][1]["status"] == "running"


def test_a_new_run_starts_with_one_open_segment(tmp_path, facts):
    path = tmp_path / "manifest.json"
    m = manifest.start_manifest(path, object(), "r1", manifest.new_segment(1, smoke=True))
    assert m["status"] == "running" and m["resumed_at"] == [] and m["host"] == "h"
    assert m["segments"][0]["smoke"] is True and m["segments"][0]["epochs_planned"] == 1
    failed = manifest.close_segment(path, "failed", "DataError: x", 1.5)
    assert failed["duration_seconds"] == 1.5 and "epochs_completed" not in failed and "best" not in failed


def test_a_run_killed_before_its_manifest_gets_one_when_resumed(tmp_path, facts):
    run = tmp_path / "20260101-000000-000001"
    run.mkdir()
    m = manifest.open_segment(run / "manifest.json", {}, object(), manifest.new_segment(2))
    assert m["run_id"] == run.name and len(m["segments"]) == 1 and m["status"] == "running"


def test_resumed_from_numbers_epochs_as_the_log_does():
    # state.epoch counts finished epochs; the log says "resuming at epoch <that + 1>, step <step>".
    assert manifest.resume_point("ckpt-000000266.npz", 1, 266) == "ckpt-000000266.npz (epoch 2, step 266)"


@pytest.mark.parametrize("segments, summary", [("abc", True), ({"a": 1}, True), ([1, 2], False), ([{}], False)])
def test_segments_edited_into_something_else_are_left_out_when_a_run_resumes(tmp_path, facts, segments, summary):
    """What is not a list of segments becomes the run's one summary, as a manifest from before segments."""
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {**FINISHED, "segments": segments})
    m = manifest.open_segment(path, read_json(path), object(), manifest.new_segment(5, 3))
    assert [s.get("note", "") for s in m["segments"][:-1]] == (
        ["summary of the run before segments were recorded"] if summary else []
    )
    assert m["segments"][-1]["epoch_from"] == 3


def test_the_command_recorded_masks_a_database_password_given_as_a_flag(monkeypatch):
    """`sweep --storage postgresql://user:PASSWORD@...` (or --sweep-storage=...) is the command of each
    trial's run: the manifest records it with the URL masked, as everywhere a URL is shown."""
    argv = [
        "train",
        "sweep",
        "s.toml",
        "--storage",
        "postgresql://bob:pw@db:5432/o",
        "--sweep-storage=mysql://b:pw@h/o",
    ]
    monkeypatch.setattr(manifest.sys, "argv", [*argv, "--runs-dir", "s3://bucket/runs", "--dataset", "npz:/d/m.npz"])
    masked = [*argv[:4], "postgresql://***@db:5432/o", "--sweep-storage=mysql://***@h/o"]
    masked += ["--runs-dir", "s3://bucket/runs", "--dataset", "npz:/d/m.npz"]  # nothing else changes
    assert manifest.new_segment(1)["command"] == masked
    monkeypatch.setattr(manifest, "tf_facts", dict)
    monkeypatch.setattr(manifest, "gpu_facts", list)
    assert manifest.environment_facts(type("S", (), {"seed": 1})())["command"] == masked
