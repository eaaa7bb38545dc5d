"""manifest: git facts (or the BUILD_COMMIT baked into the image), the lock hash, updates."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from train import manifest
from train.manifest import file_sha256, git_info, lock_hash, update_manifest
from train.rundir import read_json


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(root), "PATH": "/usr/bin:/bin"})


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
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_info(tmp_path) == {"commit": head, "dirty": False, "source": "git"}
    (tmp_path / "f.txt").write_text("2")
    assert git_info(tmp_path)["dirty"] is True


def test_git_info_outside_git_reads_build_commit(tmp_path, no_git):
    (tmp_path / "BUILD_COMMIT").write_text("abc123\n")
    assert git_info(tmp_path) == {"commit": "abc123", "dirty": None, "source": str(tmp_path / "BUILD_COMMIT")}


def test_git_info_not_a_repository_falls_back_too(tmp_path):
    (tmp_path / "BUILD_COMMIT").write_text("")  # built outside git: baked empty
    info = git_info(tmp_path)  # real git, but tmp_path is no repository
    assert info["commit"] is None and info["source"].endswith("BUILD_COMMIT")


def test_git_info_with_nothing_says_why(tmp_path, no_git):
    info = git_info(tmp_path)
    assert info["commit"] is None and "no BUILD_COMMIT" in info["source"]


def test_lock_hash_names_the_installed_lock(tmp_path):
    from importlib import metadata

    try:
        metadata.version("tensorflow-cpu")
        name = "requirements.lock"
    except metadata.PackageNotFoundError:
        name = "requirements-gpu.lock"
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
    assert (root / "train" / "manifest.py").is_file()
