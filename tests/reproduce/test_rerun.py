"""reproduce: checks before any work, the rerun from a worktree of the recorded commit, the verdict.

The end-to-end tests train in a throw-away git repository holding a copy of the package, so the
record's commit and dirty flag are under the test's control whatever state this checkout is in.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from builders import write_tiny_npz
from faults import states, wait_until
from helpers import clone_of_the_package, git, subprocess_env, train_in

from train.errors import ReproduceError
from train.reproduce.rerun import Verdict, check_model_module, judge, version_warnings, within_tolerance

TINY = [
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--checkpoint-every",
    "4",
    "--precision",
    "float32",
    # A constant rate: only then does a rerun of fewer epochs (--epochs 1) follow the same rates.
    "--lr-schedule",
    "constant",
    "--deterministic",
    "--progress",
    "line",
    "--no-export",
    # As helpers.tiny_values: no report.html, and a given peak (not measured in every fresh RUNS_DIR);
    # no test here reads either, and the reruns take them from the run's config.json.
    "--report",
    "off",
    "--peak-flops",
    "1e12",
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


def test_the_cli_exits_10_when_the_verdict_is_different(tmp_path, monkeypatch, capsys):
    from builders import write_run_records

    import train.reproduce.rerun
    from train.cli import main

    run = write_run_records(tmp_path / "runs" / "20240101-000000-000000-ab12")
    verdict = Verdict(run.name, "rerun", method="final weights sha256", match=False, details={"rerun": "x"})
    monkeypatch.setattr(train.reproduce.rerun, "reproduce", lambda *a, **kw: verdict)
    assert main(["reproduce", str(run), "--local", "--runs-dir", str(run.parent)]) == 10
    assert "result:     DIFFERENT by final weights sha256" in capsys.readouterr().out
    verdict.match = True
    assert main(["reproduce", str(run), "--local", "--runs-dir", str(run.parent)]) == 0


def _sha_rows(precision_same: bool) -> list[dict]:
    return [{"what": "device", "same": True}, {"what": "precision", "same": precision_same}]


def test_another_precision_is_judged_by_the_metrics_not_the_weights(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text("epoch,val_accuracy,val_loss\n1,0.9,0.3\n")
    orig_m, new_m = {"final_weights_sha256": "a" * 64}, {"final_weights_sha256": "b" * 64, "epochs_completed": 1}
    config = {"deterministic": True, "epochs": 1}
    other = judge(Verdict("a", "b", rows=_sha_rows(False)), tmp_path / "a", orig_m, config, tmp_path / "b", new_m, None)
    assert other.match and "within tolerance (another device kind or precision)" in other.method
    same = judge(Verdict("a", "b", rows=_sha_rows(True)), tmp_path / "a", orig_m, config, tmp_path / "b", new_m, None)
    assert not same.match and same.method.startswith("final weights sha256")
    assert same.details == {"original": "a" * 64, "rerun": "b" * 64}


def test_an_exact_row_that_differs_names_the_metric(tmp_path):
    for name, loss in (("a", "0.3"), ("b", "0.30001")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text(f"epoch,val_accuracy,val_loss\n1,0.9,{loss}\n2,0.9,0.2\n")
    v = judge(
        Verdict("a", "b", rows=_sha_rows(True)),
        tmp_path / "a",
        {},
        {"deterministic": True, "epochs": 2},
        tmp_path / "b",
        {},
        1,
    )
    assert not v.match and v.details == {"epoch": 1, "differ": {"val_loss": {"original": 0.3, "rerun": 0.30001}}}


def test_a_dirty_original_is_marked_in_the_code_row(tmp_path):
    from train.reproduce.rerun import side_by_side

    commit = "0123456789abcdef0123456789abcdef01234567"
    orig = {"git": {"commit": commit, "dirty": True}}
    rows = side_by_side(orig, {}, {"git": {"commit": commit, "dirty": False}}, {}, tmp_path)
    code = rows[0]
    assert code == {"what": "code", "original": f"{commit} + uncommitted changes", "rerun": commit, "same": False}


def test_a_damaged_record_is_one_line(tmp_path):
    from train.reproduce.rerun import read_record

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "manifest.json").write_text('{"status": "compl')
    with pytest.raises(ReproduceError, match="manifest.json is unreadable"):
        read_record(tmp_path)


# -- end to end, in a throw-away repository --------------------------------------------------------
def _runs(runs: Path) -> list[Path]:
    from train.run.find import list_run_dirs

    return list_run_dirs(runs)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tmp = tmp_path_factory.mktemp("repro")
    repo = clone_of_the_package(tmp / "repo")
    npz = write_tiny_npz(tmp)
    runs = tmp / "runs"
    train_in(repo, "fit", "--dataset", f"npz:{npz}", "--runs-dir", str(runs), *TINY)
    (run,) = _runs(runs)
    return repo, runs, run, npz


@pytest.mark.slow
def test_a_deterministic_run_reproduces_bit_identical(original):
    repo, runs, run, _ = original
    proc = train_in(repo, "reproduce", run.name, "--local", "--runs-dir", str(runs))
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
    proc = train_in(repo, "reproduce", str(copy), "--local", "--epochs", "1", "--runs-dir", str(copy.parent))
    assert f"WARNING: tensorflow {_installed_tf()} is installed, the run used 2.19.0" in proc.stdout, proc.stdout
    assert "MATCH by metrics.csv row of epoch 1" in proc.stdout, proc.stdout
    assert "tensorflow" in proc.stdout and "<- differs" in proc.stdout


def _installed_tf() -> str:
    from train.reproduce.rerun import installed_versions

    return installed_versions()["tensorflow"]


@pytest.mark.slow
def test_changed_data_is_refused_with_both_fingerprints_before_any_training(original, tmp_path):
    repo, runs, run, npz = original
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    other = write_tiny_npz(tmp_path, name="other.npz", seed=7)
    config = json.loads((copy / "config.json").read_text())
    config["dataset"] = f"npz:{other}"
    (copy / "config.json").write_text(json.dumps(config))
    proc = train_in(repo, "reproduce", str(copy), "--local", "--runs-dir", str(copy.parent), check=False)
    recorded = json.loads((copy / "manifest.json").read_text())["data"]["fingerprint"]
    assert proc.returncode == 9, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ReproduceError: the data differs") and recorded in line and str(other) in line
    assert _runs(copy.parent) == [copy]  # nothing was trained


@pytest.mark.slow
def test_a_dirty_tree_run_warns_once_and_is_refused_without_allow_dirty(original, tmp_path):
    """What --allow-dirty then does (the verdict's code row, the rerun's warning) is held by the unit
    tests of the verdict and of the refusal; a rerun that matches, by the deterministic run's test."""
    repo, _, _, npz = original
    with (repo / "train" / "__init__.py").open("a") as f:
        f.write("# an uncommitted comment\n")
    try:
        runs = tmp_path / "runs"
        fit = train_in(repo, "fit", "--dataset", f"npz:{npz}", "--runs-dir", str(runs), *TINY, "--epochs", "1")
        warned = [line for line in fit.stdout.splitlines() if "WARNING: the checkout has uncommitted changes" in line]
        assert len(warned) == 1 and "--allow-dirty" in warned[0], fit.stdout
        (run,) = _runs(runs)
        assert json.loads((run / "manifest.json").read_text())["git"]["dirty"] is True
        refused = train_in(repo, "reproduce", run.name, "--local", "--runs-dir", str(runs), check=False)
        assert refused.returncode == 9 and "--allow-dirty" in refused.stderr, refused.stderr
        assert _runs(runs) == [run]  # nothing rerun
    finally:
        git(repo, "checkout", "--", "train/__init__.py")
    assert not git(repo, "status", "--porcelain", "--untracked-files=no").strip()  # the user's tree untouched


# -- every "no" of the verdict, and every refusal, end to end --------------------------------------
def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs" / run.name
    shutil.copytree(run, copy)
    return copy


def _edit(path: Path, **changes) -> None:
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))


def _edit_metrics(run: Path, epoch: int, column: str, value: str) -> None:
    lines = (run / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[epoch].split(",")
    assert cells[0] == str(epoch)
    cells[header.index(column)] = value
    lines[epoch] = ",".join(cells)
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


def _reproduce(repo: Path, copy: Path, *extra: str) -> subprocess.CompletedProcess:
    return train_in(repo, "reproduce", str(copy), "--local", "--runs-dir", str(copy.parent), *extra, check=False)


def _refusal(proc: subprocess.CompletedProcess, copy: Path) -> str:
    """The one line of a refusal (exit 9) given before anything was trained."""
    assert proc.returncode == 9 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert _runs(copy.parent) == [copy]  # nothing was trained
    return proc.stderr.strip().splitlines()[-1]


def _rerun_of(copy: Path) -> tuple[dict, dict]:
    (new,) = [p for p in _runs(copy.parent) if p != copy]
    return json.loads((new / "reproduce.json").read_text()), json.loads((new / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["HEAD", "short", "branch"])
def test_a_commit_that_is_not_a_full_hash_is_refused_before_any_training(original, tmp_path, kind):
    repo, _, run, _ = original
    copy = _copy(run, tmp_path)
    recorded = json.loads((copy / "manifest.json").read_text())["git"]
    value = {"HEAD": "HEAD", "short": recorded["commit"][:12], "branch": git(repo, "branch", "--show-current").strip()}[
        kind
    ]
    _edit(copy / "manifest.json", git=dict(recorded, commit=value))
    line = _refusal(_reproduce(repo, copy), copy)
    assert line.startswith(f"ReproduceRecordError: {copy / 'manifest.json'}: git.commit={value!r} is not a full 40-hex")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["metrics abc", "integer commit", "git text", "config epochs text"])
def test_a_damaged_record_is_refused_in_one_line_before_any_training(original, tmp_path, damage):
    repo, _, run, _ = original
    copy = _copy(run, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    if damage == "metrics abc":
        _edit_metrics(copy, 1, "val_loss", "abc")
        file, field, value = "metrics.csv", "line 2, column val_loss", "abc"
    elif damage == "integer commit":
        _edit(copy / "manifest.json", git=dict(manifest["git"], commit=12345))
        file, field, value = "manifest.json", "git.commit", 12345
    elif damage == "git text":
        _edit(copy / "manifest.json", git="git")
        file, field, value = "manifest.json", "git", "git"
    else:
        _edit(copy / "config.json", epochs="abc")
        file, field, value = "config.json", "epochs", "abc"
    line = _refusal(_reproduce(repo, copy, "--epochs", "1"), copy)
    assert line.startswith(f"ReproduceRecordError: {copy / file}: {field}={value!r} "), line


@pytest.mark.slow
def test_a_lock_hash_that_differs_from_the_commits_lock_is_refused_naming_both(original, tmp_path):
    repo, _, run, _ = original
    copy = _copy(run, tmp_path)
    lock = json.loads((copy / "manifest.json").read_text())["requirements_lock"]
    _edit(copy / "manifest.json", requirements_lock=dict(lock, sha256="0" * 64))
    line = _refusal(_reproduce(repo, copy), copy)
    assert "requirements/cpu.lock at commit" in line and lock["sha256"][:16] in line and "0" * 16 in line, line


@pytest.mark.slow
def test_weights_that_differ_are_different_with_exit_10(original, tmp_path):
    repo, _, run, _ = original
    copy = _copy(run, tmp_path)
    real = json.loads((copy / "manifest.json").read_text())["final_weights_sha256"]
    _edit(copy / "manifest.json", final_weights_sha256="0" * 64)
    proc = _reproduce(repo, copy)
    assert proc.returncode == 10, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "result:     DIFFERENT by final weights sha256" in proc.stdout, proc.stdout
    verdict, manifest = _rerun_of(copy)
    assert not verdict["match"] and verdict["details"] == {"original": "0" * 64, "rerun": real}
    assert manifest["reproduces"]["match"] is False


def _worktrees(repo: Path) -> list[str]:
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def _processes_in(folder: Path) -> list[int]:
    """Processes whose working directory is under `folder` (the rerun trains from a worktree there)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _rerun_trains(copy: Path) -> bool:
    """The rerun beside `copy` has saved its first state: it is training (its run.lock names its pid)."""
    new = [p for p in _runs(copy.parent) if p != copy]
    return bool(new and states(new[0]) and (new[0] / "run.lock").stat().st_size)


def _start_long_reproduce(original, tmp_path):
    """`reproduce --local` of a copy of the run set to 500 epochs (still training when a signal comes),
    its worktree under tmp_path/tmp: (repo, copy, tmp, process)."""
    repo, _, run, _ = original
    copy = _copy(run, tmp_path)
    _edit(copy / "config.json", epochs=500)
    tmp = tmp_path / "tmp"  # where the worktree goes
    tmp.mkdir()
    with open(tmp_path / "reproduce.out", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "train", "reproduce", str(copy), "--local", "--runs-dir", str(copy.parent)],
            cwd=repo,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(PYTHONPATH=str(repo), TMPDIR=str(tmp)),
        )
    return repo, copy, tmp, proc


RERUN = """
import signal, sys, time
from pathlib import Path
runs, code = Path(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *a: sys.exit(code))  # 0: the signal came after its last step
(runs / "20240101-000000-000001-repro").mkdir()
(runs / "20240101-000000-000001-repro" / "config.json").write_text("{}")
(runs.parent / "ready").write_text("")
time.sleep(120)
"""


@pytest.mark.parametrize("code", [0, 75])
def test_a_rerun_that_completed_despite_the_signal_gets_its_verdict_an_unfinished_one_does_not(tmp_path, code):
    from train.errors import Interrupted
    from train.reproduce.rerun import run_and_find
    from train.reproduce.worktree import stop_on_signals

    runs = tmp_path / "runs"
    runs.mkdir()

    def send_when_ready():
        end = time.monotonic() + 120
        while not (tmp_path / "ready").exists() and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_when_ready)
    with stop_on_signals() as stop:
        sender.start()
        try:
            found = run_and_find([sys.executable, "-c", RERUN, str(runs), str(code)], runs, stop)
        except Interrupted as exc:
            found = exc
        finally:
            sender.join()
    if code == 0:  # a completed rerun is not "unfinished, keeps its saved state": it is judged
        assert found == runs / "20240101-000000-000001-repro" and stop.signum is None
    else:
        assert "the unfinished rerun 20240101-000000-000001-repro keeps its saved state" in str(found)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the child processes")
def test_sigterm_stops_the_rerun_removes_its_worktree_and_exits_75(original, tmp_path):
    # SIGINT takes the same path: train.reproduce.worktree installs one handler for both.
    sig = signal.SIGTERM
    repo, copy, tmp, proc = _start_long_reproduce(original, tmp_path)
    try:
        assert wait_until(lambda: _rerun_trains(copy), proc, timeout=600), (tmp_path / "reproduce.out").read_text()
        (new,) = [p for p in _runs(copy.parent) if p != copy]
        child = int((new / "run.lock").read_text().split()[1])  # "pid N on host H"
        assert child != proc.pid and _processes_in(tmp) == [child]
        proc.send_signal(sig)
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "reproduce.out").read_text()
    assert rc == 75, text[-3000:]
    assert text.strip().splitlines()[-1].startswith(f"Interrupted: reproduce stopped by {sig.name}: no verdict"), text
    assert _processes_in(tmp) == [] and not Path(f"/proc/{child}").exists()
    assert json.loads((new / "manifest.json").read_text())["status"] == "interrupted"  # it saved and stopped
    assert _worktrees(repo) == [f"worktree {repo}"] and list(tmp.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the child processes")
def test_the_worktree_of_a_killed_reproduce_is_removed_by_the_next_one(original, tmp_path):
    repo, copy, tmp, proc = _start_long_reproduce(original, tmp_path)
    try:
        assert wait_until(lambda: _rerun_trains(copy), proc, timeout=600), (tmp_path / "reproduce.out").read_text()
    finally:
        proc.kill()  # SIGKILL: no clean-up is possible
        proc.wait()
        for pid in _processes_in(tmp):  # the rerun it started, in a session of its own
            os.kill(pid, signal.SIGKILL)
    assert len(_worktrees(repo)) == 2  # left behind
    _edit(copy / "manifest.json", requirements_lock={"sha256": "0" * 64})  # the next one is refused, after cleaning
    proc = _reproduce(repo, copy)
    assert proc.returncode == 9 and "removed the worktree of an earlier reproduce that was killed" in proc.stdout
    # What TensorFlow's autograph wrote for the SIGKILLed rerun stays: it removes those files at exit.
    left = [p for p in tmp.iterdir() if not p.name.startswith("__autograph_generated_file")]
    assert _worktrees(repo) == [f"worktree {repo}"] and left == []


# -- the verdict, exactly ------------------------------------------------------------------------
def _two_runs(tmp_path, a: str, b: str) -> tuple[Path, Path]:
    for name, csv in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text(csv)
    return tmp_path / "a", tmp_path / "b"


def test_within_tolerance_skips_other_columns_and_needs_every_metric_within(tmp_path):
    # batch_size sorts before the metrics and is no metric: skipped, never compared, never the end;
    # test_accuracy, in one run only, is not compared.
    a = {"batch_size": 32.0, "learning_rate": 0.1, "val_accuracy": 0.9, "val_loss": 10.0, "test_accuracy": 1.0}
    ok, details = within_tolerance(
        a, {"batch_size": 64.0, "learning_rate": 0.5, "val_accuracy": 0.9095, "val_loss": 11.0}
    )
    # 0.0095 is within the absolute 0.01 (not 1 % of 0.9); 1.0 is exactly 10 % of a loss of 10.
    assert ok and details == {
        "val_accuracy": {"original": 0.9, "rerun": 0.9095, "difference": pytest.approx(0.0095), "allowed": 0.01},
        "val_loss": {"original": 10.0, "rerun": 11.0, "difference": 1.0, "allowed": 1.0},
    }
    ok, _ = within_tolerance({"val_accuracy": 0.9, "val_loss": 1.0}, {"val_accuracy": 0.8, "val_loss": 1.0})
    assert not ok  # the accuracy is out, the loss after it in: out


def test_the_tolerance_verdict_names_its_epoch_and_metrics(tmp_path):
    a, b = _two_runs(tmp_path, "epoch,val_accuracy\n1,0.5\n2,0.9\n", "epoch,val_accuracy\n1,0.5\n2,0.905\n")
    v = judge(Verdict("a", "b", rows=_sha_rows(True)), a, {}, {"deterministic": False, "epochs": 2}, b, {}, None)
    assert v.match is True
    assert v.method == "metrics of epoch 2 within tolerance (DETERMINISTIC=false): accuracies ±0.01, losses ±10%"
    assert v.details == {
        "epoch": 2,
        "metrics": {
            "val_accuracy": {"original": 0.9, "rerun": 0.905, "difference": pytest.approx(0.005), "allowed": 0.01}
        },
    }
    # A rerun stopped early (its epochs_completed) is compared at its last epoch.
    v = judge(Verdict("a", "b", rows=_sha_rows(True)), a, {}, {"epochs": 2}, b, {"epochs_completed": 1}, None)
    assert v.details["epoch"] == 1


def test_a_rerun_that_early_stopped_later_than_the_original_is_judged_where_both_trained(tmp_path):
    a, b = _two_runs(tmp_path, "epoch,val_accuracy\n1,0.5\n2,0.9\n", "epoch,val_accuracy\n1,0.5\n2,0.9\n3,0.91\n")
    config = {"deterministic": False, "epochs": 6, "patience": 1}
    v = judge(
        Verdict("a", "b", rows=_sha_rows(True)), a, {"epochs_completed": 2}, config, b, {"epochs_completed": 3}, None
    )
    assert v.match is True and v.details["epoch"] == 2  # not "no metrics row for epoch 3" in the original
    assert v.method.endswith("; the original stopped after epoch 2, the rerun after 3")


def test_the_same_weights_match_when_the_rerun_has_every_epoch(tmp_path):
    sha = {"final_weights_sha256": "a" * 64}
    a, b = _two_runs(tmp_path, "epoch,val_accuracy\n1,0.5\n", "epoch,val_accuracy\n1,0.6\n")
    v = judge(Verdict("a", "b", rows=_sha_rows(True)), a, sha, {"deterministic": True, "epochs": 2}, b, sha, 2)
    assert v.match is True
    assert v.method == "final weights sha256 (DETERMINISTIC=true, same device kind and precision)"


def test_another_device_kind_is_judged_by_the_metrics(tmp_path):
    sha = {"final_weights_sha256": "a" * 64, "epochs_completed": 1}
    a, b = _two_runs(tmp_path, "epoch,val_accuracy\n1,0.5\n", "epoch,val_accuracy\n1,0.6\n")
    rows = [{"what": "device", "same": False}, {"what": "precision", "same": True}]
    v = judge(Verdict("a", "b", rows=rows), a, sha, {"deterministic": True, "epochs": 1}, b, sha, None)
    assert v.match is False and "(another device kind or precision)" in v.method


def test_an_exact_row_that_is_the_same_matches(tmp_path):
    a, b = _two_runs(
        tmp_path, "epoch,val_accuracy,epoch_seconds\n1,0.5,3\n", "epoch,val_accuracy,epoch_seconds\n1,0.5,4\n"
    )
    v = judge(Verdict("a", "b", rows=_sha_rows(True)), a, {}, {"deterministic": True, "epochs": 2}, b, {}, 1)
    assert v.match is True and v.details == {"epoch": 1, "differ": {}}
    assert v.method == "metrics.csv row of epoch 1, exactly (the original's weights at that epoch are not kept)"


@pytest.mark.parametrize("missing", ["a", "b"])
def test_a_missing_metrics_row_names_the_file_it_is_missing_from(tmp_path, missing):
    rows = {k: "epoch,val_accuracy\n1,0.5\n" + ("" if k == missing else "2,0.6\n") for k in ("a", "b")}
    a, b = _two_runs(tmp_path, rows["a"], rows["b"])
    with pytest.raises(ReproduceError) as exc:
        judge(Verdict("a", "b", rows=_sha_rows(True)), a, {}, {"deterministic": False, "epochs": 3}, b, {}, 2)
    assert str(exc.value) == (
        f"no metrics row for epoch 2 in {tmp_path / missing / 'metrics.csv'}: nothing to compare the rerun with"
    )


def test_a_record_without_epochs_looks_for_epoch_0(tmp_path):
    a, b = _two_runs(tmp_path, "epoch,val_accuracy\n1,0.5\n", "epoch,val_accuracy\n1,0.5\n")
    with pytest.raises(ReproduceError, match="no metrics row for epoch 0 in "):
        judge(Verdict("a", "b", rows=_sha_rows(True)), a, {}, {}, b, {}, None)


def test_the_printed_verdict(tmp_path):
    from train.reproduce.rerun import format_verdict

    rows = [
        {"what": "code", "original": "abc", "rerun": "abc", "same": True},
        {"what": "precision", "original": "float32", "rerun": "mixed_bfloat16", "same": False},
    ]
    v = Verdict("orig", "new", rows=rows, method="m", match=False, details={"epoch": 1})
    assert format_verdict(v).split("\n") == [
        "            original (orig)  rerun (new)",
        "code        abc           abc",
        "precision   float32       mixed_bfloat16   <- differs",
        "result:     DIFFERENT by m",
        '            {"epoch": 1}',
    ]
    short = [{"what": "code", "original": "abc", "rerun": "abc", "same": True}]
    assert format_verdict(Verdict("o", "n", rows=short, method="m", match=True)).split("\n")[:2] == [
        "            original (o)  rerun (n)",
        "code        abc           abc",
    ]
    long = [{"what": "code", "original": "a" * 20, "rerun": "b", "same": True}]
    assert format_verdict(Verdict("o", "n", rows=long, method="m", match=True, warnings=["WARNING: w"])).split(
        "\n"
    ) == [
        f"            {'original (o)':<20}  rerun (n)",
        f"code        {'a' * 20}  b",
        "result:     MATCH by m",
        "WARNING: w",  # (--allow-dirty, other versions) after the verdict too, not only before the rerun's log
    ]


# -- each row of the comparison, and the plain helpers, exactly --------------------------------------
def test_each_row_of_the_side_by_side_compares_its_own_record(tmp_path):
    from train.reproduce.rerun import side_by_side

    orig_m = {
        "git": {"commit": "c1", "dirty": False, "source": "git"},
        "requirements_lock": {"sha256": "L1"},
        "data": {"fingerprint": "F"},
        "tensorflow": "2.20",
        "keras": "3.1",
        "build_info": {"cuda_version": "12"},
        "gpus": [{"name": "T4"}, {"name": "A100"}, {"name": "T4"}, {"name": None}, "not a device"],
        "precision": {"policy": "float32"},
    }
    new_m = {
        "git": {"commit": "c1", "source": "/app/BUILD_COMMIT"},
        "requirements_lock": {"sha256": "L2"},
        "data": {"fingerprint": "F"},
        "tensorflow": "2.21",
        "keras": "3.1",
        "build_info": "not a dict",
        "gpus": [],
        "precision": {"policy": "mixed_bfloat16"},
    }
    # Where the run lives, how it was started and EPOCHS are not compared; a relative dataset path is
    # relative to where the original started (`base`).
    orig_c = {"dataset": "npz:data/a.npz", "data_dir": "data", "epochs": 2, "runs_dir": "r", "seed": 1, "lr": 0.1}
    orig_c.update(peak_flops=5, resume="auto")
    new_c = {"dataset": f"npz:{tmp_path}/data/a.npz", "data_dir": "/x", "epochs": 1, "runs_dir": "s", "seed": 2}
    new_c.update(batch=3, peak_flops=6)

    def row(what, a, b):
        return {"what": what, "original": a, "rerun": b, "same": a == b}

    assert side_by_side(orig_m, orig_c, new_m, new_c, tmp_path) == [
        row("code", "c1", "c1"),
        row("lock", "L1", "L2"),
        row("image", "none (a git checkout)", "an image (/app/BUILD_COMMIT)"),
        row("data", "F", "F"),
        {"what": "settings", "original": "recorded", "rerun": "differ: batch, lr, seed", "same": False},
        row("tensorflow", "2.20", "2.21"),
        row("keras", "3.1", "3.1"),
        row("cuda", "12", None),
        row("device", "GPU: A100, T4", "CPU"),
        row("precision", "float32", "mixed_bfloat16"),
    ]

    # A CPU is compared by its family of kernels (the last bits differ between AMX and AVX2), a cap by
    # the kernels it runs; a record without a family compares as "CPU" on both sides.
    def cpu(family):
        return {"precision": {"policy": "float32", "cpu": {"model": "m", "family": family}}}

    def device(a, b):
        return side_by_side(a, {}, b, {}, tmp_path)[8]

    assert device(cpu("AMX"), cpu("AVX2")) == row("device", "CPU (AMX)", "CPU (AVX2)")
    stand_in = cpu("AVX2 (stand-in: AMX CPU with ONEDNN_MAX_CPU_ISA=AVX2)")
    assert device(stand_in, cpu("AVX2")) == row("device", "CPU (AVX2)", "CPU (AVX2)")
    assert device({"precision": {"policy": "float32"}}, cpu("AMX")) == row("device", "CPU", "CPU")
    cuda = {"build_info": {"cuda_version": "12.5"}}
    assert side_by_side({}, {}, cuda, {}, tmp_path)[7] == row("cuda", None, "12.5")
    assert side_by_side({}, {}, {}, {}, tmp_path) == [
        *(row(what, None, None) for what in ("code", "lock", "image", "data")),
        {"what": "settings", "original": "recorded", "rerun": "same", "same": True},
        *(row(what, None, None) for what in ("tensorflow", "keras", "cuda")),
        row("device", "CPU", "CPU"),
        row("precision", None, None),
    ]


@pytest.mark.parametrize(
    "orig_fingerprint, new_dataset, differs",
    [
        ("F", "npz:/container/a.npz", False),  # the same data under another path: the fingerprint decides
        ("G", "npz:/container/a.npz", True),  # other data
        ("F", "images:/container/a", True),  # another kind of dataset
    ],
)
def test_a_dataset_path_that_differs_is_the_same_setting_only_for_the_same_fingerprint(
    tmp_path, orig_fingerprint, new_dataset, differs
):
    from train.reproduce.rerun import side_by_side

    orig = ({"data": {"fingerprint": orig_fingerprint}}, {"dataset": "npz:/host/a.npz"})
    rows = side_by_side(*orig, {"data": {"fingerprint": "F"}}, {"dataset": new_dataset}, tmp_path)
    (settings,) = [r for r in rows if r["what"] == "settings"]
    assert settings["rerun"] == ("differ: dataset" if differs else "same") and settings["same"] is not differs


@pytest.mark.parametrize(
    "config, manifest, flags, want",
    [
        ({"precision": "auto"}, {"precision": {"policy": "float32"}}, {"avx512_bf16"}, {"precision": "float32"}),
        (
            {"precision": "auto"},
            {"precision": {"policy": "mixed_bfloat16"}},
            {"avx512_bf16"},
            {"precision": "mixed_bfloat16"},
        ),
        ({"precision": "auto"}, {"precision": {"policy": "mixed_bfloat16"}}, {"avx2"}, {}),  # not native here
        ({"precision": "auto"}, {"precision": {"policy": "mixed_float16"}, "gpus": [{"name": "T4"}]}, set(), {}),
        ({"precision": "float32"}, {"precision": {"policy": "float32"}}, set(), {}),  # given: rerun as given
        ({"precision": "auto"}, {}, set(), {}),
    ],
)
def test_a_rerun_trains_in_auto_s_recorded_choice_where_this_cpu_runs_it_natively(
    config, manifest, flags, want, monkeypatch
):
    from train.reproduce.rerun import pinned_precision, side_by_side
    from train.setup import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    assert pinned_precision(config, manifest) == want
    # The pinned choice is the recorded setting, auto, in the side by side: not a setting that differs.
    settings = side_by_side(manifest, config, manifest, {**config, **want}, Path("."))[4]
    assert settings["rerun"] == "same"


def test_a_run_trained_in_two_precisions_is_rerun_in_auto_s_and_said_to_differ(monkeypatch):
    """A resume on a CPU without bfloat16 trained on in float32: no rerun trains like that, so none is
    pinned, and the precision row names both (a segment that trained nothing does not count)."""
    from train.reproduce.rerun import pinned_precision, side_by_side, trained_precisions
    from train.setup import hardware

    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512_bf16"})
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    segments = [{"precision": "mixed_bfloat16"}, {"precision": "float32"}, {"precision": "float32", "trains": False}]
    manifest = {"precision": {"policy": "float32"}, "segments": segments}
    assert trained_precisions(manifest) == ["mixed_bfloat16", "float32"]
    assert pinned_precision({"precision": "auto"}, manifest) == {}
    row = side_by_side(manifest, {}, {"precision": {"policy": "float32"}}, {}, Path("."))[-1]
    assert row == {"what": "precision", "original": "mixed_bfloat16, float32", "rerun": "float32", "same": False}
    segments[1]["trains"] = False  # the float32 resume trained nothing: the run is bfloat16's
    assert pinned_precision({"precision": "auto"}, manifest) == {"precision": "mixed_bfloat16"}
    segments[1].update(trains=True, restart=True)  # trained again from epoch 1: the earlier weights are gone
    assert trained_precisions(manifest) == ["float32"]


def test_the_recorded_settings_become_the_flags_of_a_fresh_fit(tmp_path):
    from train.reproduce.rerun import as_flags, rerun_flags

    values = {"epochs": 3, "deterministic": True, "export": False, "lr_schedule": None, "batch_size": 32}
    assert as_flags(values, "repro-x", None) == [
        *("--epochs", "3", "--deterministic", "--no-export", "--batch-size", "32"),
        *("--run-name", "repro-x", "--resume", ""),
    ]
    assert as_flags({"epochs": 3}, "n", 1)[:2] == ["--epochs", "1"]
    config = {"dataset": "npz:data/a.npz", "data_dir": "data", "runs_dir": "/old", "model": "cnn"}
    assert rerun_flags(config, tmp_path / "runs", "n", 2, tmp_path) == [
        *("--dataset", f"npz:{tmp_path}/data/a.npz", "--data-dir", f"{tmp_path}/data"),
        *("--runs-dir", str(tmp_path / "runs"), "--model", "cnn", "--run-name", "n", "--resume", ""),
        *("--epochs", "2"),
    ]
    absolute = {"dataset": "images:/abs/dir", "data_dir": "/abs/data"}
    assert rerun_flags(absolute, tmp_path, "n", None, tmp_path)[:4] == [
        *("--dataset", "images:/abs/dir", "--data-dir", "/abs/data"),
    ]
    # A colon in the path is part of the path; an absolute path stays as it was recorded.
    odd = {"dataset": "npz:data/a:b.npz", "data_dir": "/abs/x/../data"}
    assert rerun_flags(odd, tmp_path, "n", None, tmp_path)[:4] == [
        *("--dataset", f"npz:{tmp_path}/data/a:b.npz", "--data-dir", "/abs/x/../data"),
    ]
    builtin = {"dataset": "mnist", "data_dir": ""}  # a built-in name and no data folder stay as they are
    assert rerun_flags(builtin, tmp_path, "n", None, tmp_path)[:4] == ["--dataset", "mnist", "--data-dir", ""]


def test_the_rerun_environment_holds_no_setting_from_this_shell(tmp_path, monkeypatch):
    from train.reproduce.rerun import _clean_env

    monkeypatch.setenv("EPOCHS", "99")
    monkeypatch.setenv("batch_size", "7")
    monkeypatch.setenv("KEEP_ME", "1")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    env = _clean_env(tmp_path, {"epochs": 3, "batch_size": 32})
    assert "EPOCHS" not in env and "batch_size" not in env and env["KEEP_ME"] == "1"
    assert env["PYTHONPATH"] == str(tmp_path) and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the user's own choice stays
    assert _clean_env(tmp_path, {})["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_the_installed_versions_are_this_environment_s(monkeypatch):
    from importlib import metadata

    from train.reproduce import rerun

    assert rerun.installed_versions() == {
        "tensorflow": metadata.version("tensorflow") if _has("tensorflow") else metadata.version("tensorflow-cpu"),
        "keras": metadata.version("keras"),
        "python": sys.version.split()[0],
    }
    known = {"tensorflow": "2.1", "tensorflow-cpu": "2.0-cpu", "keras": "3.0"}

    def version(name):
        if name not in known:
            raise metadata.PackageNotFoundError(name)
        return known[name]

    monkeypatch.setattr(rerun.metadata, "version", version)
    python = sys.version.split()[0]
    assert rerun.installed_versions() == {"tensorflow": "2.1", "keras": "3.0", "python": python}
    del known["tensorflow"]
    assert rerun.installed_versions()["tensorflow"] == "2.0-cpu"  # the CPU-only package counts too
    known.clear()
    assert rerun.installed_versions() == {"tensorflow": None, "keras": None, "python": sys.version.split()[0]}


def _has(package: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(package)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_the_verdict_file_holds_every_field():
    v = Verdict("o", "n", rows=[{"what": "code"}], warnings=["w"], method="m", match=True, details={"epoch": 1})
    assert v.to_dict() == {
        "original": "o",
        "rerun": "n",
        "match": True,
        "method": "m",
        "details": {"epoch": 1},
        "rows": [{"what": "code"}],
        "warnings": ["w"],
    }
    assert list(v.to_dict()) == ["original", "rerun", "match", "method", "details", "rows", "warnings"]


def _repo_with_a_lock(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    (repo / "requirements").mkdir(parents=True)
    (repo / "requirements/cpu.lock").write_text("numpy==2.0\n")
    (repo / "requirements.lock").write_text("numpy==1.0\n")  # where runs recorded before requirements/ had it
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "lock")
    return repo, git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_the_commit_is_checked_before_anything_else_in_one_line_each(tmp_path):
    from train.reproduce.rerun import check_commit

    repo, commit = _repo_with_a_lock(tmp_path)
    assert check_commit(repo, {"git": {"commit": commit, "dirty": False}}, allow_dirty=False) == commit
    assert check_commit(repo, {"git": {"commit": commit, "dirty": True}}, allow_dirty=True) == commit

    def refusal(manifest, root=repo, allow_dirty=False):
        with pytest.raises(ReproduceError) as exc:
            check_commit(root, manifest, allow_dirty)
        return str(exc.value)

    assert refusal({"git": {"source": "/app/BUILD_COMMIT"}}) == (
        "the run records no commit (git source: '/app/BUILD_COMMIT'): it was made outside a git checkout or "
        "from an image built without GIT_COMMIT; rerun it by hand"
    )
    assert refusal({}).startswith("the run records no commit (git source: None)")
    assert refusal({"git": {"commit": commit, "dirty": True}}) == (
        f"the run was made from a tree with uncommitted changes on top of {commit[:12]}: its code is not in any "
        "commit; pass --allow-dirty to rerun with the committed code anyway"
    )
    (tmp_path / "plain").mkdir()
    assert refusal({"git": {"commit": commit}}, root=tmp_path / "plain") == (
        f"{tmp_path / 'plain'} is not a git checkout: run reproduce from a clone of the project that contains "
        f"commit {commit[:12]}"
    )
    other = "f" * 40
    assert refusal({"git": {"commit": other}}) == (
        f"commit {other[:12]} is not in this clone ({repo}): `git fetch` the branch it is on, then run reproduce again"
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_the_lock_at_the_commit_must_have_the_recorded_hash(tmp_path):
    import hashlib

    from train.reproduce.rerun import check_lock

    repo, commit = _repo_with_a_lock(tmp_path)
    sha = hashlib.sha256(b"numpy==2.0\n").hexdigest()
    check_lock(repo, commit, {"requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": sha}})
    check_lock(repo, commit, {})  # no hash recorded: the default lock only has to exist
    old = hashlib.sha256(b"numpy==1.0\n").hexdigest()  # a run recorded when the lock was at the root
    check_lock(repo, commit, {"requirements_lock": {"file": "/app/requirements.lock", "sha256": old}})
    with pytest.raises(ReproduceError) as exc:
        check_lock(repo, commit, {"requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": "0" * 64}})
    assert str(exc.value) == (
        f"requirements/cpu.lock at commit {commit[:12]} has sha256 {sha[:16]}..., the run recorded {'0' * 16}...: "
        "the run was not installed from that commit's lock"
    )
    with pytest.raises(ReproduceError) as exc:
        check_lock(repo, commit, {"requirements_lock": {"file": "requirements/gpu.lock", "sha256": sha}})
    assert str(exc.value) == f"commit {commit[:12]} has no requirements/gpu.lock: its environment cannot be rebuilt"


def test_the_data_must_have_the_recorded_fingerprint(tmp_path):
    from helpers import tiny_settings

    from train.inputs.pipeline import load_data
    from train.reproduce.rerun import check_data

    settings = tiny_settings(tmp_path)
    fingerprint = load_data(settings).fingerprint
    assert check_data(settings, {"data": {"fingerprint": fingerprint}}) == fingerprint
    assert check_data(settings, {}) == fingerprint  # nothing recorded: nothing to compare
    with pytest.raises(ReproduceError) as exc:
        check_data(settings, {"data": {"fingerprint": "0" * 64}})
    assert str(exc.value) == (
        f"the data differs from the run's: {load_data(settings).source} has fingerprint {fingerprint}, the run "
        f"recorded {'0' * 64}; put the run's data back where it read it (a rerun reads the recorded place)"
    )


def test_data_not_here_is_one_line_or_the_dvc_extra_s_fetch_when_the_run_recorded_a_version(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from builders import write_tiny_npz
    from helpers import tiny_values

    from train import extras
    from train.reproduce.record import check_config
    from train.reproduce.rerun import data_for_rerun

    gone = tmp_path / "gone" / "images"
    values = tiny_values(tmp_path, write_tiny_npz(tmp_path)) | {"dataset": f"images:{gone}"}
    check_config(tmp_path / "config.json", values)  # a path this machine lacks is no damage of the record
    # A key no setting has (added by hand): refused before the rerun, which failed on it (exit 9 all the same).
    with pytest.raises(ReproduceError) as info:
        check_config(tmp_path / "config.json", values | {"warmup_epochs": 2})
    assert str(info.value) == (
        f"{tmp_path / 'config.json'}: warmup_epochs=2 is not a setting of this version (did you mean "
        "LR_WARMUP_EPOCHS?), written by a newer version or added by hand; reproduce with the version that wrote "
        "the run, or remove the key"
    )
    with pytest.raises(
        ReproduceError, match=rf"^the run's data is not here: directory {gone} does not exist; put it back where"
    ):
        data_for_rerun(values, {"data": {"fingerprint": "ab"}}, None, print)
    version = {"tool": "dvc", "path": "images", "commit": "c7" * 20}
    recorded = {"data": {"fingerprint": "ab", "version": version}}
    monkeypatch.setattr(extras, "part", lambda extra, name: None)  # a template without the dvc extra
    with pytest.raises(ReproduceError, match="^the run's data is not here"):
        data_for_rerun(values, recorded, None, print)
    fetched = values | {"dataset": "images:/fetched/images"}
    fake = SimpleNamespace(data_version=lambda v, vals, s, fingerprint, say: (fetched, v["commit"]))
    monkeypatch.setattr(extras, "part", lambda extra, name: fake if (extra, name) == ("dvc", "fetch") else None)
    said = []
    assert data_for_rerun(values, recorded, None, said.append) == (fetched, "c7" * 20)
    assert said == [
        f"data: DATASET='images:{gone}': directory {gone} does not exist: fetching the run's DVC version instead"
    ]
    said.clear()  # other data there: the fingerprints, not "put the run's data back", which the fetch does
    there = values | {"dataset": f"npz:{write_tiny_npz(tmp_path)}"}
    assert data_for_rerun(there, recorded, None, said.append) == (fetched, "c7" * 20)
    assert said[0].startswith("data: the data differs from the run's: ") and "put the run's data back" not in said[0]
    assert said[0].endswith("the run recorded ab: fetching the run's DVC version instead")


def test_each_version_that_differs_is_a_warning_and_an_unknown_one_is_none():
    recorded = {"tensorflow": "2.21.0", "keras": "3.14.0", "python": "3.10.1"}
    installed = {"tensorflow": "2.21.0", "keras": "3.15.0", "python": "3.11.7"}
    assert version_warnings(recorded, installed) == [
        "WARNING: keras 3.15.0 is installed, the run used 3.14.0: the rerun may differ",
        "WARNING: python 3.11.7 is installed, the run used 3.10.1: the rerun may differ",
    ]
    assert version_warnings({"keras": None, "python": "3.10.1"}, {"keras": "3.15.0", "python": None}) == []


def test_a_whole_record_is_read_as_manifest_and_config(tmp_path):
    from train.reproduce.rerun import read_record

    (tmp_path / "config.json").write_text('{"epochs": 2}')
    (tmp_path / "manifest.json").write_text('{"status": "completed"}')
    assert read_record(tmp_path) == ({"status": "completed"}, {"epochs": 2})


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_reproduce_says_each_check_reruns_from_a_worktree_of_the_commit_and_writes_its_verdict(tmp_path, monkeypatch):
    """The whole command with the training child replaced: what it says, which code and flags the
    rerun gets, and the verdict it writes into the rerun and its manifest."""
    import hashlib

    from builders import write_run_records, write_tiny_npz
    from helpers import tiny_values

    from train.inputs.pipeline import load_data
    from train.reproduce import rerun
    from train.run.rundir import RunDir

    repo, commit = _repo_with_a_lock(tmp_path)
    lock_sha = hashlib.sha256(b"numpy==2.0\n").hexdigest()
    npz = write_tiny_npz(tmp_path)
    config = dict(tiny_values(tmp_path, npz), deterministic=True, epochs=2)
    from train.config import settings_from_dict

    fingerprint = load_data(settings_from_dict(config)).fingerprint
    config["dataset"] = f"npz:{npz.name}"  # relative: to where the original started (`base`)
    manifest = {
        "git": {"commit": commit, "dirty": True, "source": "git"},
        "requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": lock_sha},
        "data": {"fingerprint": fingerprint},
        "final_weights_sha256": "ab" * 32,
        "epochs_completed": 2,
        "tensorflow": "0.1",
        "status": "interrupted",  # stopped after its last epoch: --epochs 1 can still be compared
    }
    metrics = [{"epoch": 1, "val_accuracy": 0.5, "loss": 1.0}, {"epoch": 2, "val_accuracy": 0.6, "loss": 0.9}]
    run = write_run_records(tmp_path / "runs" / ("base copy.bak" + "x" * 60), config, manifest, metrics)
    seen = {}

    def fake_rerun(code, flags, config_, runs_dir, stop):
        seen.update(code=code, head=git(code, "rev-parse", "HEAD").strip(), flags=flags, runs_dir=runs_dir)
        seen.update(config=config_, stop=stop)
        recorded = dict(config_, dataset=f"npz:{npz}", epochs=1)  # a rerun records absolute paths
        return write_run_records(runs_dir / "rerun", recorded, dict(manifest, git={"commit": commit}), metrics[:1])

    monkeypatch.setattr(rerun, "rerun", fake_rerun)
    said = []
    monkeypatch.chdir(tmp_path)  # where the original started: the base of its relative paths, as for the CLI
    verdict = rerun.reproduce(run, repo, allow_dirty=True, epochs=1, say=said.append)
    short = commit[:12]
    assert said == [
        f"code: commit {short} is in this clone",
        f"WARNING: the run was made from uncommitted changes on top of {short} (--allow-dirty): the rerun uses "
        "the committed code, so a difference may come from those changes",
        "lock: the commit's lock has the recorded sha256",
        f"data: fingerprint {fingerprint} as recorded",
        f"WARNING: tensorflow {rerun.installed_versions()['tensorflow']} is installed, the run used 0.1: "
        "the rerun may differ",
        f"rerunning {run.name} with commit {short} ...",
    ]
    assert seen["head"] == commit and not seen["code"].exists()  # the worktree is gone afterwards
    flags = seen["flags"]
    assert seen["runs_dir"] == run.parent and flags[flags.index("--runs-dir") + 1] == str(run.parent)
    assert flags[flags.index("--run-name") + 1] == ("repro-base_copy_bak" + "x" * 60)[:64]  # RUN_NAME refused . and " "
    assert flags[flags.index("--epochs") + 1] == "1" and flags[flags.index("--dataset") + 1] == f"npz:{npz}"
    assert seen["config"] == RunDir(run).read_config() and isinstance(seen["stop"], rerun.Stop)
    assert verdict.original == run.name and verdict.rerun == "rerun" and verdict.match is True
    assert verdict.method.startswith("metrics.csv row of epoch 1, exactly")
    (settings,) = [r for r in verdict.rows if r["what"] == "settings"]
    assert settings["same"] is True  # the relative dataset of the original is the rerun's absolute one
    assert verdict.warnings == said[1:2] + said[4:5]
    assert [r["what"] for r in verdict.rows][:2] == ["code", "lock"] and verdict.rows[0]["same"] is False
    new = RunDir(run.parent / "rerun")
    assert json.loads(new.reproduce.read_text()) == verdict.to_dict()
    assert new.read_manifest()["reproduces"] == {
        "run_id": run.name,
        "path": str(run),
        "match": True,
        "method": verdict.method,
    }


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (the image has none)")
def test_a_whole_deterministic_rerun_reads_relative_paths_from_base_and_compares_the_final_weights(
    tmp_path, monkeypatch
):
    """`base`, not the working directory, is where the original's relative DATA_DIR is read from; a
    whole rerun of a DETERMINISTIC=true run is judged by both manifests' final weights."""
    import hashlib

    from builders import write_run_records, write_tiny_npz
    from helpers import tiny_values

    from train.config import settings_from_dict
    from train.inputs.pipeline import load_data
    from train.reproduce import rerun

    repo, commit = _repo_with_a_lock(tmp_path)
    npz = write_tiny_npz(tmp_path)
    config = dict(tiny_values(tmp_path, npz), deterministic=True, epochs=2)
    fingerprint = load_data(settings_from_dict(config)).fingerprint
    config["data_dir"] = "data"  # relative to tmp_path, where the original started
    manifest = {
        "git": {"commit": commit, "source": "git"},
        "requirements_lock": {
            "file": "/app/requirements/cpu.lock",
            "sha256": hashlib.sha256(b"numpy==2.0\n").hexdigest(),
        },
        "data": {"fingerprint": fingerprint},
        "final_weights_sha256": "ab" * 32,
        "epochs_completed": 2,
        "status": "completed",
    }
    metrics = [{"epoch": 1, "val_accuracy": 0.5, "loss": 1.0}, {"epoch": 2, "val_accuracy": 0.6, "loss": 0.9}]
    run = write_run_records(tmp_path / "runs" / "original", config, manifest, metrics)

    seen = {}

    def fake_rerun(code, flags, config_, runs_dir, stop):
        seen["data_dir"] = flags[flags.index("--data-dir") + 1]
        recorded = dict(config_, data_dir=seen["data_dir"])  # a rerun records absolute paths
        new = dict(manifest, final_weights_sha256="cd" * 32)
        return write_run_records(runs_dir / "rerun", recorded, new, metrics)

    monkeypatch.setattr(rerun, "rerun", fake_rerun)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    verdict = rerun.reproduce(run, repo, base=tmp_path, say=lambda line: None)
    assert verdict.method == "final weights sha256 (DETERMINISTIC=true, same device kind and precision)"
    assert verdict.match is False and verdict.details == {"original": "ab" * 32, "rerun": "cd" * 32}
    assert seen["data_dir"] == str(tmp_path / "data")
    (settings,) = [r for r in verdict.rows if r["what"] == "settings"]
    assert settings["same"] is True  # the original's relative DATA_DIR, read from `base`, is the rerun's


def test_the_rerun_is_a_fit_of_the_worktree_s_code_with_no_env_file_and_a_clean_environment(tmp_path, monkeypatch):
    from train.reproduce import rerun

    code = tmp_path / "wt" / "src"
    code.mkdir(parents=True)
    monkeypatch.setenv("EPOCHS", "99")
    calls = []
    monkeypatch.setattr(
        rerun, "run_and_find", lambda cmd, runs_dir, stop, **kw: calls.append((cmd, runs_dir, stop, kw)) or "new"
    )
    stop = rerun.Stop()
    assert rerun.rerun(code, ["--epochs", "1"], {"epochs": 2}, tmp_path / "runs", stop) == "new"
    ((cmd, runs_dir, stop_, kw),) = calls
    # no file: one in the worktree, named by the rerun's "to continue it" line, was gone when it was pasted
    assert cmd == [sys.executable, "-m", "train", "fit", "--env-file", "", "--epochs", "1"]
    assert not (tmp_path / "wt" / "empty.env").exists() and runs_dir == tmp_path / "runs" and stop_ is stop
    assert (
        kw["code"] == code and kw["cwd"] == code and "EPOCHS" not in kw["env"] and kw["env"]["PYTHONPATH"] == str(code)
    )


def _run_dir_maker(runs: Path, exit_code: int, make: bool = True) -> list[str]:
    """A child that makes a run directory under `runs` (as `fit` does) and exits with `exit_code`."""
    run = runs / "20260101-000000-000001-ab12"
    body = f"p = pathlib.Path({str(run)!r}); p.mkdir(parents=True); (p / 'config.json').write_text('{{}}'); "
    return [sys.executable, "-c", f"import pathlib, sys; {body if make else ''}sys.exit({exit_code})"]


def test_the_run_a_training_child_made_is_found_and_a_failure_names_its_log(tmp_path):
    from train.reproduce.rerun import Stop, run_and_find

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "20250101-000000-000000-0000").mkdir()  # an older run is never taken for the new one
    (runs / "20250101-000000-000000-0000" / "config.json").write_text("{}")
    assert run_and_find(_run_dir_maker(runs, 0), runs, Stop()) == runs / "20260101-000000-000001-ab12"
    with pytest.raises(ReproduceError) as exc:
        run_and_find(_run_dir_maker(tmp_path / "other", 3), runs, Stop())
    assert str(exc.value) == "the rerun failed with exit code 3"
    with pytest.raises(ReproduceError) as exc:
        run_and_find(_run_dir_maker(tmp_path / "other", 0, make=False), runs, Stop())
    assert str(exc.value) == f"the rerun finished but left no run directory under {runs}"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(ReproduceError) as exc:
        run_and_find(_run_dir_maker(fresh, 4), fresh, Stop())
    assert str(exc.value) == (
        f"the rerun failed with exit code 4; see {fresh / '20260101-000000-000001-ab12' / 'train.log'}"
    )


def test_a_stopped_rerun_names_the_newest_run_it_left_and_the_child_gets_the_code_and_arguments(tmp_path, monkeypatch):
    from builders import write_run_records

    from train.errors import Interrupted
    from train.reproduce import rerun
    from train.reproduce.worktree import Stop

    runs, stop, got = tmp_path / "runs", Stop(), []
    write_run_records(runs / "20240101-000000-000000-aaaa")  # there before: never the rerun's

    def child(cmd, stop_, code, **kw):
        got.append((cmd, stop_, code, kw))
        for name in ("20240102-000000-000000-bbbb", "20240103-000000-000000-cccc", "20240104-000000-000000-dddd"):
            write_run_records(runs / name)
        stop_.signum = signal.SIGTERM  # forwarded to the child, which saved its state and stopped
        return 75

    monkeypatch.setattr(rerun, "run_child", child)
    with pytest.raises(Interrupted) as info:
        rerun.run_and_find(["train"], runs, stop, tmp_path / "src", cwd=str(tmp_path), env={"A": "1"})
    assert got == [(["train"], stop, tmp_path / "src", {"cwd": str(tmp_path), "env": {"A": "1"}})]
    assert "the unfinished rerun 20240104-000000-000000-dddd keeps its saved state" in str(info.value)
    monkeypatch.setattr(rerun, "run_child", lambda cmd, stop_, code, **kw: 75)  # stopped before it made a run
    with pytest.raises(Interrupted) as info:
        rerun.run_and_find(["train"], runs, stop)
    assert str(info.value).endswith("the original run is untouched; run reproduce again")


@pytest.mark.extra("mlflow", "sweep")  # the URL-valued settings besides a bucket RUNS_DIR
def test_a_url_recorded_masked_is_left_out_of_the_rerun_flags():
    from train.reproduce.rerun import as_flags

    # The record shows it masked; given again as recorded, it would be refused as a credential.
    recorded = {"epochs": 3, "mlflow_tracking_uri": "http://***@host/x", "sweep_storage": "postgresql://***@h/db"}
    flags = as_flags(recorded, "n", None)
    assert flags == ["--epochs", "3", "--run-name", "n", "--resume", ""]
    assert as_flags({"mlflow_tracking_uri": "http://h:5000"}, "n", None)[:2] == [
        "--mlflow-tracking-uri",
        "http://h:5000",
    ]


def test_a_model_from_a_module_outside_the_commit_is_refused_before_any_training(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "zoo").mkdir(parents=True)
    (repo / "zoo" / "__init__.py").write_text("")
    (repo / "mine.py").write_text("def net(input_shape, num_classes): ...\n")
    git(repo, "init", "-q")
    git(repo, "add", "zoo")  # mine.py stays out of the commit
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "zoo")
    commit = git(repo, "rev-parse", "HEAD").strip()
    monkeypatch.chdir(repo)  # found here, and on PYTHONPATH, by `fit`; not by the rerun
    monkeypatch.setenv("PYTHONPATH", str(repo))
    for model in ("cnn", "zoo.nets:net", "numpy.linalg:norm"):  # built in, committed, installed
        check_model_module(repo, commit, {"model": model})
    with pytest.raises(ReproduceError) as e:
        check_model_module(repo, commit, {"model": "mine:net"})
    assert str(e.value).startswith(f"MODEL=mine:net: module 'mine' is neither in commit {commit[:12]} nor installed")


def test_a_built_in_data_set_missing_from_its_tracked_data_dir_is_fetched_never_downloaded_there(tmp_path, monkeypatch):
    """DATASET=mnist read from a DVC-tracked DATA_DIR: the rerun fetches that version instead of letting
    Keras download MNIST into the DVC workspace (which would make it differ from its version)."""
    from types import SimpleNamespace

    from helpers import tiny_values

    from train import datasets, extras
    from train.reproduce.rerun import data_for_rerun

    tracked = tmp_path / "tracked"  # the DVC workspace the run read; its mnist.npz is gone
    values = tiny_values(tmp_path, tmp_path / "unused.npz") | {"dataset": "mnist", "data_dir": str(tracked)}
    version = {"tool": "dvc", "path": "tracked", "commit": "c7" * 20, "setting": "DATA_DIR"}
    fetched = values | {"data_dir": "/fetched/tracked"}
    fake = SimpleNamespace(data_version=lambda v, vals, s, fingerprint, say: (fetched, "ab"))
    monkeypatch.setattr(extras, "part", lambda extra, name: fake if (extra, name) == ("dvc", "fetch") else None)
    monkeypatch.setattr(datasets, "download", lambda url, *a, **k: pytest.fail(f"downloaded {url}"))
    said = []
    assert data_for_rerun(values, {"data": {"fingerprint": "ab", "version": version}}, None, said.append) == (
        fetched,
        "ab",
    )
    assert said == [f"data: {tracked / 'mnist.npz'} is not here: fetching the run's DVC version instead"]
    assert not tracked.exists()
