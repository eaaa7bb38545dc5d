"""resume: which run a fit writes to (auto, by id, refused on differing settings), without TensorFlow."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from train.config import load_settings
from train.errors import ResumeMismatchError
from train.resume import auto_resume, prepare_run_dir
from train.rundir import RunNotFound, read_json


def _settings(tmp_path, **changes):
    values = {"dataset": "mnist", "runs_dir": str(tmp_path / "runs"), "data_dir": str(tmp_path / "data"),
              "batch_size": 32, **changes}
    return load_settings(values, env_file=None, environ={})


def _fake_run(settings, run_id, status, **config_changes):
    d = Path(settings.runs_dir) / run_id
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**settings.to_dict(), **config_changes}))
    if status is not None:
        (d / "manifest.json").write_text(json.dumps({"status": status}))
    return d


@pytest.mark.parametrize("status", ["interrupted", "budget", "running"])
def test_auto_resumes_the_newest_unfinished_run_with_equal_settings(tmp_path, status):
    s = _settings(tmp_path)
    _fake_run(s, "20260101-000000-aaaa", "interrupted")
    newest = _fake_run(s, "20260102-000000-bbbb", status, epochs=9)  # EPOCHS may differ on resume
    assert auto_resume(s) == str(newest)


@pytest.mark.parametrize("status", ["completed", "failed", "diverged"])
def test_auto_starts_fresh_after_a_finished_or_failed_run(tmp_path, status):
    s = _settings(tmp_path)
    _fake_run(s, "20260101-000000-aaaa", "interrupted")  # an older unfinished run is not picked
    _fake_run(s, "20260102-000000-bbbb", status)
    assert auto_resume(s) == ""


def test_auto_starts_fresh_when_settings_differ(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)  # setup_logging may have turned it off
    s = _settings(tmp_path)
    _fake_run(s, "20260102-000000-bbbb", "interrupted", batch_size=64, seed=1)
    with caplog.at_level("INFO", logger="train"):
        assert auto_resume(s) == ""
    assert caplog.messages == ["RESUME=auto: run 20260102-000000-bbbb did not finish but its settings differ "
                               "(BATCH_SIZE: 64 -> 32; SEED: 1 -> 42); starting a new run"]


def test_auto_starts_fresh_without_runs_or_with_an_unreadable_one(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    s = _settings(tmp_path)
    assert auto_resume(s) == ""  # RUNS_DIR does not exist yet
    run = _fake_run(s, "20260102-000000-bbbb", None)  # killed before the manifest was written
    with caplog.at_level("INFO", logger="train"):
        assert auto_resume(s) == ""
    assert caplog.messages == [f"RESUME=auto: cannot read run {run.name} ([Errno 2] No such file or directory: "
                               f"'{run / 'manifest.json'}'); starting a new run"]


def test_prepare_new_run_writes_its_config(tmp_path):
    s = _settings(tmp_path, run_name="demo")
    run_dir, effective, resumed = prepare_run_dir(s, None, force=False)
    assert not resumed and effective == s and run_dir.name.endswith("-demo")
    assert read_json(run_dir / "config.json") == s.to_dict()


def test_prepare_auto_without_a_candidate_creates_a_run(tmp_path):
    s = _settings(tmp_path)
    run_dir, _, resumed = prepare_run_dir(s, "auto", force=False)
    assert not resumed and (run_dir / "config.json").is_file()


def test_prepare_resume_keeps_the_runs_settings_but_takes_free_ones(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=2)
    run_dir, effective, resumed = prepare_run_dir(s.replace(epochs=7), run.name, force=False)
    assert resumed and run_dir == run
    assert effective.epochs == 7 and effective.batch_size == 32
    assert read_json(run / "config.json")["epochs"] == 7


def test_prepare_refuses_differing_settings_listing_them_unless_forced(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", batch_size=64, seed=1)
    with pytest.raises(ResumeMismatchError) as info:
        prepare_run_dir(s, run.name, force=False)
    assert str(info.value) == (f"run {run.name} was started with other settings (BATCH_SIZE: 64 -> 32; SEED: 1 -> 42): "
                               "resume with the same settings, or pass --force to continue with the new ones")
    assert info.value.exit_code == 4
    assert read_json(run / "config.json")["batch_size"] == 64  # untouched after a refusal
    _, effective, resumed = prepare_run_dir(s, run.name, force=True)
    assert resumed and effective == s
    assert read_json(run / "config.json")["batch_size"] == 32


def test_prepare_unknown_run_is_run_not_found(tmp_path):
    with pytest.raises(RunNotFound):
        prepare_run_dir(_settings(tmp_path), "20990101-000000-zzzz", force=False)


def test_auto_starts_fresh_when_epochs_change_under_a_cosine_schedule(tmp_path):
    s = _settings(tmp_path, lr_schedule="cosine")
    _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=9)
    assert auto_resume(s) == ""


def test_prepare_auto_continues_the_unfinished_run(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    run_dir, effective, resumed = prepare_run_dir(s, "auto", force=False)
    assert (run_dir, effective, resumed) == (run, s, True)
    assert [p.name for p in Path(s.runs_dir).iterdir()] == [run.name]  # no new run directory
