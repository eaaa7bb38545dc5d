"""reproduce: checks before any work, the rerun from a worktree of the recorded commit, the verdict.

The end-to-end tests train in a throw-away git repository holding a copy of the package, so the
record's commit and dirty flag are under the test's control whatever state this checkout is in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, make_npz, subprocess_env

from train.errors import ReproduceError
from train.reproduce import Verdict, judge, version_warnings, within_tolerance

TINY = [
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--checkpoint-every",
    "4",
    "--precision",
    "float32",
    "--deterministic",
    "--progress",
    "line",
    "--no-export",
]


# -- pure parts ----------------------------------------------------------------------------------
def test_version_warnings_name_both_versions():
    warnings = version_warnings(
        {"tensorflow": "2.19.0", "keras": "3.15.0"}, {"tensorflow": "2.21.0", "keras": "3.15.0", "python": "3.11.7"}
    )
    assert warnings == ["WARNING: tensorflow 2.21.0 is installed, the run used 2.19.0: the rerun may differ"]


def test_tolerance_is_absolute_for_accuracy_and_relative_for_loss():
    ok, details = within_tolerance({"val_accuracy": 0.90, "val_loss": 0.30}, {"val_accuracy": 0.905, "val_loss": 0.32})
    assert ok and details["val_loss"]["allowed"] == pytest.approx(0.03)
    ok, details = within_tolerance({"val_accuracy": 0.90}, {"val_accuracy": 0.88})
    assert not ok and details["val_accuracy"]["difference"] == pytest.approx(0.02)


def test_without_determinism_the_verdict_uses_the_tolerance(tmp_path):
    for name, acc in (("a", "0.90"), ("b", "0.95")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text(f"epoch,val_accuracy,epoch_seconds\n1,{acc},3.0\n")
    rows = [{"what": "device", "same": True}, {"what": "precision", "same": True}]
    v = judge(
        Verdict("a", "b", rows=rows),
        tmp_path / "a",
        {},
        {"deterministic": False, "epochs": 1},
        tmp_path / "b",
        {"epochs_completed": 1},
        None,
    )
    assert not v.match and "tolerance" in v.method and "DETERMINISTIC=false" in v.method


def test_a_damaged_record_is_one_line(tmp_path):
    from train.reproduce import read_record

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "manifest.json").write_text('{"status": "compl')
    with pytest.raises(ReproduceError, match="manifest.json is unreadable"):
        read_record(tmp_path)


# -- end to end, in a throw-away repository --------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _clone_of_the_package(dest: Path) -> Path:
    dest.mkdir()
    shutil.copytree(PROJECT_ROOT / "train", dest / "train", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("requirements.lock", "requirements-gpu.lock", "pyproject.toml"):
        shutil.copy(PROJECT_ROOT / name, dest / name)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "snapshot")
    return dest


def _train(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "train", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=str(repo)),
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def _runs(runs: Path) -> list[Path]:
    from train.rundir import list_run_dirs

    return list_run_dirs(runs)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tmp = tmp_path_factory.mktemp("repro")
    repo = _clone_of_the_package(tmp / "repo")
    npz = make_npz(tmp)
    runs = tmp / "runs"
    _train(repo, "fit", "--dataset", f"npz:{npz}", "--runs-dir", str(runs), *TINY)
    (run,) = _runs(runs)
    return repo, runs, run, npz


@pytest.mark.slow
def test_a_deterministic_run_reproduces_bit_identical(original):
    repo, runs, run, _ = original
    proc = _train(repo, "reproduce", run.name, "--local", "--runs-dir", str(runs))
    assert "MATCH by final weights sha256" in proc.stdout, proc.stdout
    new = [p for p in _runs(runs) if p.name.endswith("repro-" + run.name)]
    assert len(new) == 1
    verdict = json.loads((new[0] / "reproduce.json").read_text())
    assert verdict["match"] and verdict["details"]["original"] == verdict["details"]["rerun"]
    assert all(r["same"] for r in verdict["rows"]), verdict["rows"]
    manifest = json.loads((new[0] / "manifest.json").read_text())
    assert manifest["reproduces"]["run_id"] == run.name and manifest["reproduces"]["match"] is True
    shutil.rmtree(new[0])


@pytest.mark.slow
def test_one_epoch_of_a_two_epoch_run_matches_its_metrics_row_and_an_older_tensorflow_is_named(original):
    repo, runs, run, _ = original
    copy = runs.parent / "runs-older" / run.name
    shutil.copytree(run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["tensorflow"] = "2.19.0"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc = _train(repo, "reproduce", str(copy), "--local", "--epochs", "1", "--runs-dir", str(copy.parent))
    assert f"WARNING: tensorflow {_installed_tf()} is installed, the run used 2.19.0" in proc.stdout, proc.stdout
    assert "MATCH by metrics.csv row of epoch 1" in proc.stdout, proc.stdout
    assert "tensorflow" in proc.stdout and "<- differs" in proc.stdout


def _installed_tf() -> str:
    from train.reproduce import installed_versions

    return installed_versions()["tensorflow"]


@pytest.mark.slow
def test_changed_data_is_refused_with_both_fingerprints_before_any_training(original, tmp_path):
    repo, runs, run, npz = original
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    other = make_npz(tmp_path, name="other.npz", seed=7)
    config = json.loads((copy / "config.json").read_text())
    config["dataset"] = f"npz:{other}"
    (copy / "config.json").write_text(json.dumps(config))
    proc = _train(repo, "reproduce", str(copy), "--local", "--runs-dir", str(copy.parent), check=False)
    recorded = json.loads((copy / "manifest.json").read_text())["data"]["fingerprint"]
    assert proc.returncode == 9, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ReproduceError: the data differs") and recorded in line and str(other) in line
    assert _runs(copy.parent) == [copy]  # nothing was trained


@pytest.mark.slow
def test_a_dirty_tree_run_is_refused_then_accepted_with_allow_dirty(original, tmp_path):
    repo, _, _, npz = original
    with (repo / "train" / "__init__.py").open("a") as f:
        f.write("# an uncommitted comment\n")
    try:
        runs = tmp_path / "runs"
        _train(repo, "fit", "--dataset", f"npz:{npz}", "--runs-dir", str(runs), *TINY, "--epochs", "1")
        (run,) = _runs(runs)
        assert json.loads((run / "manifest.json").read_text())["git"]["dirty"] is True
        refused = _train(repo, "reproduce", run.name, "--local", "--runs-dir", str(runs), check=False)
        assert refused.returncode == 9 and "--allow-dirty" in refused.stderr, refused.stderr
        accepted = _train(repo, "reproduce", run.name, "--local", "--allow-dirty", "--runs-dir", str(runs))
        assert "MATCH" in accepted.stdout, accepted.stdout
    finally:
        _git(repo, "checkout", "--", "train/__init__.py")
    assert not _git(repo, "status", "--porcelain", "--untracked-files=no").strip()  # the user's tree untouched
