"""Nothing lost: a sweep stopped by SIGTERM or killed by SIGKILL, in real processes, continued by the next sweep.

Each test waits for an event (the trial's first epoch in its metrics.csv), never for a time. The
first sweep asks for 100 epochs, so it is certainly still training when the signal comes; the next
one asks for 2 (EPOCHS may change on a resume), so the resumed run ends soon.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from builders import write_tiny_npz
from faults import env, wait_until

from train.run.find import list_run_dirs

pytestmark = pytest.mark.slow


def _flags(tmp_path: Path, epochs: int) -> list[str]:
    npz = tmp_path / "tiny.npz"
    if not npz.exists():
        write_tiny_npz(tmp_path, n_train=48, n_test=16, size=8)
    values = {
        "dataset": f"npz:{npz}",
        "runs_dir": str(tmp_path / "runs"),
        "model": "faults:dense16",
        "epochs": epochs,
        "batch_size": 16,
        "lr_schedule": "constant",  # EPOCHS may change on a resume only where no schedule spans it
        "checkpoint_every": 0,
        "precision": "float32",
        "progress": "line",
        "report": "off",
        "peak_flops": "1e11",
    }
    return [x for k, v in values.items() for x in ("--" + k.replace("_", "-"), str(v))] + ["--no-export"]


def _start(tmp_path: Path, epochs: int, name: str) -> subprocess.Popen:
    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'sig'\ntrials = 1\npruner = 'none'\nheartbeat = 1\n[space]\nlearning_rate = [0.001, 0.002]\n"
    )
    out = open(tmp_path / f"{name}.out", "w")
    cmd = [sys.executable, "-m", "train", "sweep", str(space), "--env-file", "/dev/null", *_flags(tmp_path, epochs)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env())
    out.close()
    proc.out_path = tmp_path / f"{name}.out"  # type: ignore[attr-defined]
    return proc


def _first_epoch_done(runs: Path) -> bool:
    return any(
        len((r / "metrics.csv").read_text().splitlines()) >= 2
        for r in list_run_dirs(runs)
        if (r / "metrics.csv").is_file()
    )


def _trials(tmp_path: Path):
    import optuna

    study = optuna.load_study(study_name="sig", storage=f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 'sig.db'}")
    return study.get_trials()


def _interrupt(tmp_path: Path, sig: int) -> subprocess.Popen:
    proc = _start(tmp_path, 100, "first")
    assert wait_until(lambda: _first_epoch_done(tmp_path / "runs"), proc, timeout=600), proc.out_path.read_text()
    proc.send_signal(sig)
    proc.wait(timeout=300)
    return proc


def _continue(tmp_path: Path) -> str:
    proc = _start(tmp_path, 2, "second")
    rc = proc.wait(timeout=900)
    out = proc.out_path.read_text()
    assert rc == 0, out
    return out


def _one_run_resumed(tmp_path: Path, first_segment: str) -> dict:
    (run,) = list_run_dirs(tmp_path / "runs")  # the same run, continued: no second run for the trial
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["epochs_completed"] == 2
    assert [s["status"] for s in manifest["segments"]] == [first_segment, "completed"]
    assert manifest["segments"][1]["resumed_from"]
    return manifest


def test_sigterm_during_a_trial_saves_its_run_exits_75_and_the_next_sweep_resumes_that_run(tmp_path):
    proc = _interrupt(tmp_path, signal.SIGTERM)
    out = proc.out_path.read_text()
    assert proc.returncode == 75, out
    assert "SweepInterrupted: study sig: trial 0 stopped" in out and "saved a resumable state" in out
    (run,) = list_run_dirs(tmp_path / "runs")
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"
    trials = _trials(tmp_path)
    assert [(t.number, t.state.name) for t in trials] == [(0, "FAIL"), (1, "WAITING")]
    assert trials[1].user_attrs["run"] == run.name and trials[1].params == trials[0].params

    out = _continue(tmp_path)
    assert f"resuming run {run.name}" in out
    manifest = _one_run_resumed(tmp_path, "interrupted")
    assert manifest["sweep"]["trial"] == 1 and manifest["sweep"]["retry_of"] == [0]
    assert [(t.number, t.state.name) for t in _trials(tmp_path)] == [(0, "FAIL"), (1, "COMPLETE")]
    assert "1 of 1 trial(s) finished" in out


def test_a_killed_sweeps_trial_is_found_by_its_heartbeat_and_resumed_once(tmp_path):
    proc = _interrupt(tmp_path, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    (run,) = list_run_dirs(tmp_path / "runs")
    assert [t.state.name for t in _trials(tmp_path)] == ["RUNNING"]  # nobody told the study

    out = _continue(tmp_path)  # waits until the trial's heartbeat is stale, then retries it
    assert f"resuming run {run.name}" in out
    manifest = _one_run_resumed(tmp_path, "killed")
    assert manifest["sweep"]["retry_of"] == [0]
    trials = _trials(tmp_path)
    assert [(t.number, t.state.name) for t in trials] == [(0, "FAIL"), (1, "COMPLETE")]
    assert trials[1].params == trials[0].params
