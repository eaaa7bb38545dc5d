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


# -- each record whole ------------------------------------------------------------------------------
ISO_SECONDS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"


def test_now_is_utc_to_the_second():
    import re

    assert re.fullmatch(ISO_SECONDS, manifest.now_iso())


def test_a_new_segment_is_recorded_whole(monkeypatch):
    monkeypatch.setattr(manifest.sys, "argv", ["train", "--epochs", "3"])
    seg = manifest.new_segment(5, 2, "ckpt (epoch 3, step 0)", ["SEED: 1 -> 2"], True, True, "c" * 64, False)
    assert seg == {
        "started_at": seg["started_at"],
        "ended_at": None,
        "status": "running",
        "error": None,
        "seconds": None,
        "host": manifest.socket.gethostname(),
        "command": ["train", "--epochs", "3"],
        "resumed_from": "ckpt (epoch 3, step 0)",
        "forced_changes": ["SEED: 1 -> 2"],
        "restart": True,
        "smoke": True,
        "epochs_planned": 5,
        "epoch_from": 2,
        "epoch_to": None,
        "data_fingerprint": None,
        "config_sha256": "c" * 64,
        "trains": False,
    }
    defaults = manifest.new_segment(1)
    assert {k: defaults[k] for k in ("epoch_from", "resumed_from", "forced_changes", "restart", "smoke")} == {
        "epoch_from": 0,
        "resumed_from": None,
        "forced_changes": [],
        "restart": False,
        "smoke": False,
    }
    assert (defaults["config_sha256"], defaults["trains"]) == (None, True)


def test_a_new_manifest_is_written_whole_with_its_first_segment(tmp_path, monkeypatch):
    facts = {"host": "h", "seed": 42, "git": {"commit": "a" * 40}}
    monkeypatch.setattr(manifest, "environment_facts", lambda settings: facts)
    path = tmp_path / "manifest.json"
    seg = manifest.new_segment(2)
    batch = {"batch_size": 64, "why": "measured"}
    m = manifest.start_manifest(path, object(), "r1", seg, batch)
    assert m == {
        "run_id": "r1",
        "status": "running",
        "started_at": seg["started_at"],
        "resumed_at": [],
        "ended_at": None,
        "error": None,
        **facts,
        "batch": batch,
        "segments": [{**seg, "git": facts["git"]}],
    }
    assert read_json(path) == m
    assert "batch" not in manifest.start_manifest(path, object(), "r1", seg)


def test_the_environment_facts_are_recorded_whole(monkeypatch):
    import platform
    import sys

    monkeypatch.setattr(manifest, "tf_facts", lambda: {"tensorflow": "t", "keras": "k", "build_info": {}})
    monkeypatch.setattr(manifest, "gpu_facts", lambda: [{"name": "g"}])
    monkeypatch.setattr(manifest, "git_info", lambda: {"commit": "c"})
    monkeypatch.setattr(manifest, "lock_hash", lambda: {"file": "f", "sha256": "s"})
    monkeypatch.setattr(manifest.sys, "argv", ["train"])
    assert manifest.environment_facts(type("S", (), {"seed": 7})()) == {
        "seed": 7,
        "host": manifest.socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": ["train"],
        "tensorflow": "t",
        "keras": "k",
        "build_info": {},
        "gpus": [{"name": "g"}],
        "git": {"commit": "c"},
        "requirements_lock": {"file": "f", "sha256": "s"},
    }


def test_the_tensorflow_facts_are_the_installed_versions():
    import keras
    import tensorflow as tf

    facts = manifest.tf_facts()
    assert facts == {"tensorflow": tf.__version__, "keras": keras.__version__, "build_info": facts["build_info"]}
    assert facts["build_info"] == dict(tf.sysconfig.get_build_info())


def test_a_broken_driver_is_recorded_as_one_error_and_each_gpu_as_a_dict(monkeypatch):
    from dataclasses import dataclass

    from train.gpucheck import gpuinfo

    @dataclass
    class Gpu:
        name: str

    monkeypatch.setattr(gpuinfo, "query_gpus", lambda: [Gpu("A100"), {"name": "T4"}])
    assert manifest.gpu_facts() == [{"name": "A100"}, {"name": "T4"}]

    def broken():
        raise RuntimeError("NVML: driver not loaded")

    monkeypatch.setattr(gpuinfo, "query_gpus", broken)
    assert manifest.gpu_facts() == [{"error": "RuntimeError: NVML: driver not loaded"}]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_an_untracked_file_does_not_make_the_checkout_dirty(tmp_path):
    (tmp_path / "f.txt").write_text("1")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "commit", "-q", "-m", "c")
    (tmp_path / "new.txt").write_text("not added")
    assert git_info(tmp_path)["dirty"] is False


def test_git_info_outside_git_with_an_empty_build_commit_says_how_to_bake_one(tmp_path, no_git):
    (tmp_path / "BUILD_COMMIT").write_text("\n")
    assert git_info(tmp_path) == {
        "commit": None,
        "dirty": None,
        "source": str(tmp_path / "BUILD_COMMIT"),
        "commit_missing": "GIT_COMMIT was not set when this image was built: rebuild it with `invoke build` (or "
        "`invoke train`, which pass it), or `GIT_COMMIT=$(git rev-parse HEAD) docker compose build`",
    }


def test_git_info_with_nothing_says_so_whole(tmp_path, no_git):
    assert git_info(tmp_path) == {
        "commit": None,
        "dirty": None,
        "source": "no git repository and no BUILD_COMMIT file",
    }


def test_the_dirty_warning_is_one_whole_line():
    assert manifest.dirty_warning({"git": {"commit": "0123456789abcdef", "dirty": True}}) == (
        "WARNING: the checkout has uncommitted changes on top of commit 0123456789ab: this run's code is in no "
        "commit (reproduce refuses it without --allow-dirty); commit, then train"
    )
    assert manifest.dirty_warning({}) is None


@pytest.mark.parametrize(
    "record, version",
    [
        ({"data": {"version": {"path": "images", "tool": "dvc"}}}, {"path": "images", "tool": "dvc"}),
        ({"data": {"version": {"path": ""}}}, None),
        ({"data": {"version": ["images"]}}, None),
        ({"data": ["x"]}, None),
        ({"data": None}, None),
        ({}, None),
    ],
)
def test_the_data_version_is_a_mapping_with_a_path_or_none(record, version):
    assert manifest.data_version(record) == version


def test_a_data_version_reads_as_one_whole_line():
    version = {
        "path": "images",
        "commit": "c7d0a16b0065" + "f" * 28,
        "repository": "/data/repo",
        "dvc_file": "images.dvc",
        "hash": "166b9274" + "0" * 24,
        "remote_url": "s3://bucket/dvc",
    }
    assert manifest.data_version_text(version) == (
        "dvc: images at commit c7d0a16b0065 of /data/repo (images.dvc, md5 166b92740000..., remote s3://bucket/dvc)"
    )
    remote = {**version, "tool": "git-lfs", "git_remote": "git@host:repo", "workspace": "differs"}
    assert manifest.data_version_text(remote) == (
        "git-lfs: images at commit c7d0a16b0065 of git@host:repo (images.dvc, md5 166b92740000..., remote "
        "s3://bucket/dvc); the data read differed from this version"
    )
    bare = {"path": "images", "commit": None, "dvc_file_committed": False}
    assert manifest.data_version_text(bare) == "dvc: images at no commit of None (); None had uncommitted changes"
    assert manifest.data_version_text({**version, "dvc_file_committed": False}) == (
        "dvc: images at commit c7d0a16b0065 of /data/repo (images.dvc, md5 166b92740000..., remote s3://bucket/dvc); "
        "images.dvc had uncommitted changes"
    )
    assert manifest.data_version_text({**bare, "dvc_file_committed": None}) == "dvc: images at no commit of None ()"


def test_a_recorded_lock_is_found_where_the_checkout_keeps_it():
    assert manifest.lock_in_checkout("/work/x/requirements/gpu.lock") == "requirements/gpu.lock"
    assert manifest.lock_in_checkout("/work/x/requirements.lock") == "requirements.lock"
    assert manifest.lock_in_checkout("") == "requirements/cpu.lock"
    assert manifest.lock_in_checkout(None) == "requirements/cpu.lock"


def test_a_section_is_a_mapping_or_empty():
    assert manifest.section({"data": {"a": 1}}, "data") == {"a": 1}
    assert manifest.section({"data": [1]}, "data") == {} and manifest.section({}, "data") == {}


def test_a_killed_segment_is_closed_whole_and_never_with_negative_seconds(tmp_path, facts):
    import datetime as dt

    path = tmp_path / "manifest.json"
    killed = {**manifest.new_segment(3), "started_at": "2026-01-01T00:00:00+00:00"}
    manifest.write_json(path, {**FINISHED, "status": "running", "segments": [killed]})
    last_write = dt.datetime(2026, 1, 1, 0, 1, 0, 126000, tzinfo=dt.timezone.utc).timestamp()
    m = manifest.open_segment(path, read_json(path), object(), manifest.new_segment(3, 1), last_write=last_write)
    assert m["segments"][0] == {
        **killed,
        "status": "killed",
        "ended_at": "2026-01-01T00:01:00+00:00",
        "seconds": 60.13,
        "seconds_estimated": True,
    }
    manifest.write_json(path, {**FINISHED, "status": "running", "segments": [killed]})
    early = dt.datetime(2025, 12, 31, 23, 59, 0, tzinfo=dt.timezone.utc).timestamp()  # a clock set back
    m = manifest.open_segment(path, read_json(path), object(), manifest.new_segment(3, 1), last_write=early)
    assert m["segments"][0]["seconds"] == 0.0
    manifest.write_json(path, {**FINISHED, "status": "running", "segments": [killed]})
    m = manifest.open_segment(path, read_json(path), object(), manifest.new_segment(3, 1))
    assert m["segments"][0] == {**killed, "status": "killed"}  # no last write known: no end guessed


def test_a_resumed_manifest_is_written_whole(tmp_path, monkeypatch):
    facts = {"host": "h2", "git": {"commit": "b" * 40}, "keras": "9", "seed": 7}
    monkeypatch.setattr(manifest, "environment_facts", lambda settings: {**facts, "seed": settings.seed})
    path = tmp_path / "manifest.json"
    first = {"status": "failed", "started_at": "2026-01-01T00:00:00+00:00"}
    before = {**FINISHED, "status": "failed", "error": "DataError: x", "resumed_at": ["x"], "segments": [first]}
    manifest.write_json(path, before)
    seg = manifest.new_segment(5, 3)
    m = manifest.open_segment(path, read_json(path), type("S", (), {"seed": 7})(), seg)
    assert m == {
        **before,
        **facts,
        "status": "running",
        "ended_at": None,
        "error": None,
        "resumed_at": ["x", seg["started_at"]],
        "segments": [first, {**seg, "git": facts["git"]}],
    }
    assert read_json(path) == m


def test_a_manifest_without_a_start_takes_the_segment_s(tmp_path, facts):
    path = tmp_path / "run" / "manifest.json"
    path.parent.mkdir()
    seg = manifest.new_segment(1)
    m = manifest.open_segment(path, {"segments": [{"status": "failed"}]}, object(), seg)
    assert (m["started_at"], m["run_id"]) == (seg["started_at"], "run")
    assert m["segments"] == [{"status": "failed"}, {**seg, "git": None}]


def test_a_manifest_from_before_segments_becomes_one_whole_summary(tmp_path, facts):
    path = tmp_path / "manifest.json"
    old = {**FINISHED, "resumed_at": ["2026-01-02T00:00:00+00:00"], "host": "old-host", "error": "E: x"}
    m = manifest.open_segment(path, old, object(), manifest.new_segment(4, 3))
    assert m["segments"][0] == {
        "started_at": "2026-01-02T00:00:00+00:00",
        "ended_at": FINISHED["ended_at"],
        "status": "completed",
        "error": "E: x",
        "seconds": 94.0,
        "host": "old-host",
        "epoch_to": 3,
        "data_fingerprint": "a" * 64,
        "note": "summary of the run before segments were recorded",
    }
    m = manifest.open_segment(path, FINISHED, object(), manifest.new_segment(4, 3))
    assert m["segments"][0]["started_at"] == FINISHED["started_at"]  # never resumed


def test_data_and_precision_are_recorded_in_the_run_and_its_open_segment(tmp_path):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {"segments": [{"status": "completed"}, {"status": "running"}]})
    data, precision = {"fingerprint": "f" * 64, "n": 3}, {"policy": "mixed_bfloat16", "reason": "r"}
    m = manifest.record_data(path, data, precision)
    assert m == {
        "segments": [
            {"status": "completed"},
            {"status": "running", "data_fingerprint": "f" * 64, "precision": "mixed_bfloat16"},
        ],
        "data": data,
        "precision": precision,
    }
    assert read_json(path) == m
    manifest.write_json(path, {"precision": {"policy": "float32"}})  # written before segments existed
    assert manifest.record_data(path, data, precision) == {"precision": precision, "data": data}
    # The CPU kernels, per segment: a resume by another version on an AVX2-only CPU may switch them.
    manifest.write_json(path, {"segments": [{"status": "completed", "onednn": "off (TensorFlow's default)"}, {}]})
    cpu = {"policy": "float32", "cpu": {"family": "AVX2", "onednn": "on (TF_ENABLE_ONEDNN_OPTS=1)"}}
    m = manifest.record_data(path, data, cpu)
    assert [s.get("onednn") for s in m["segments"]] == ["off (TensorFlow's default)", "on (TF_ENABLE_ONEDNN_OPTS=1)"]


def test_a_segment_that_trains_nothing_records_a_precision_only_where_the_run_has_none(tmp_path):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {"segments": [{"trains": False}]})
    assert manifest.record_data(path, {}, {"policy": "float32"})["precision"] == {"policy": "float32"}
    m = manifest.record_data(path, {}, {"policy": "mixed_float16"})
    assert m["precision"] == {"policy": "float32"} and m["segments"][-1]["precision"] == "mixed_float16"


def test_a_closed_segment_and_the_run_are_recorded_whole(tmp_path):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {"segments": [{"seconds": 10.004}, {"seconds": None}, {"status": "running"}]})
    best = {"monitor": "val_loss", "value": 0.25}
    m = manifest.close_segment(path, "failed", "E: x", 2.006, epoch=4, best=best)
    ended = m["ended_at"]
    assert m == {
        "segments": [
            {"seconds": 10.004},
            {"seconds": None},  # killed before anything recorded its end: no time counted
            {"status": "failed", "ended_at": ended, "error": "E: x", "seconds": 2.01, "epoch_to": 4},
        ],
        "status": "failed",
        "ended_at": ended,
        "error": "E: x",
        "duration_seconds": 12.01,
        "epochs_completed": 4,
        "best": best,
    }
    assert read_json(path) == m
    manifest.write_json(path, {})
    assert manifest.close_segment(path, "failed", "E: x", 3.456) == {
        "status": "failed",
        "ended_at": manifest.read_json(path)["ended_at"],
        "error": "E: x",
        "duration_seconds": 3.46,
    }


def test_the_unfinished_epoch_of_a_stopped_segment_is_recorded(tmp_path):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {"segments": [{"status": "completed"}, {"status": "killed"}, {"status": "running"}]})
    manifest.record_unfinished_epoch(path, 3, 12.34567)
    assert read_json(path)["segments"] == [
        {"status": "completed"},
        {"status": "killed"},
        {"status": "running", "unfinished_epoch": {"epoch": 3, "train_seconds": 12.346}},
    ]
    manifest.record_unfinished_epoch(path, 4, 0.5)  # under a second still counts
    assert read_json(path)["segments"][-1]["unfinished_epoch"] == {"epoch": 4, "train_seconds": 0.5}


@pytest.mark.parametrize("segments", [[{"status": "running"}], [], "x", [1]])
def test_no_unfinished_epoch_is_recorded_without_time_spent_or_a_segment(tmp_path, segments):
    path = tmp_path / "manifest.json"
    manifest.write_json(path, {"segments": segments})
    manifest.record_unfinished_epoch(path, 3, 0.0 if segments == [{"status": "running"}] else 5.0)
    assert read_json(path) == {"segments": segments}


def test_a_damaged_manifest_is_one_warning_when_the_unfinished_epoch_is_recorded(tmp_path, caplog, monkeypatch):
    import logging

    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="train")
    manifest.record_unfinished_epoch(path, 3, 5.0)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "train",
            "WARNING: manifest not updated with the unfinished epoch: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)",
        )
    ]
    assert path.read_text() == "{not json"


def test_a_segment_that_does_not_say_whether_it_trains_records_this_code(tmp_path, monkeypatch):
    later = {"commit": "b" * 40}
    monkeypatch.setattr(manifest, "environment_facts", lambda settings: {"git": later, "keras": "9"})
    path = tmp_path / "manifest.json"
    segment = {"started_at": "2026-01-02T00:00:00+00:00"}
    m = manifest.open_segment(path, {**FINISHED, "git": {"commit": "a" * 40}, "keras": "3"}, object(), segment)
    assert (m["git"], m["keras"]) == (later, "9")


def test_a_git_that_hangs_falls_back_to_the_build_commit(tmp_path, monkeypatch):
    def hangs(*a, **kw):
        raise subprocess.TimeoutExpired(a[0], 5)

    monkeypatch.setattr(manifest.subprocess, "run", hangs)
    (tmp_path / "BUILD_COMMIT").write_text("abc123\n")
    assert git_info(tmp_path) == {"commit": "abc123", "dirty": None, "source": str(tmp_path / "BUILD_COMMIT")}


def test_the_gpu_build_of_tensorflow_names_the_gpu_lock(tmp_path, monkeypatch):
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)  # tensorflow, not tensorflow-cpu
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "gpu.lock").write_text("tensorflow==x\n")
    assert lock_hash(tmp_path) == {
        "file": str(tmp_path / "requirements" / "gpu.lock"),
        "sha256": hashlib.sha256(b"tensorflow==x\n").hexdigest(),
    }


def test_a_build_without_build_info_records_why(monkeypatch):
    import tensorflow as tf

    def missing():
        raise KeyError("cuda_version")

    monkeypatch.setattr(tf.sysconfig, "get_build_info", missing)
    assert manifest.tf_facts()["build_info"] == {"error": "'cuda_version'"}
