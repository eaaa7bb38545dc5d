"""resume: which run a fit writes to (auto, by id, refused on differing settings or no checkpoint),
and that planning a resume writes nothing, without TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
from builders import write_run, write_tiny_npz

from train.config import Settings, load_settings
from train.errors import CheckpointError, ConfigError, ResumeMismatchError, RunBusyError, RunRecordError
from train.run.files import read_json
from train.run.find import RunNotFound
from train.run.lock import RunLock
from train.run.resume import auto_resume, check_data, plan_run


def _settings(tmp_path, **changes):
    values = {
        "dataset": "mnist",
        "runs_dir": str(tmp_path / "runs"),
        "data_dir": str(tmp_path / "data"),
        "batch_size": 32,
        # Constant: EPOCHS is free on resume only where no schedule spans the epochs.
        "lr_schedule": "constant",
        **changes,
    }
    return load_settings(values, env_file=None, environ={})


def _fake_run(settings, run_id, status, checkpoint=True, **config_changes):
    return write_run(
        Path(settings.runs_dir) / run_id,
        {**settings.to_dict(), **config_changes},
        None if status is None else {"status": status, "data": {"fingerprint": "a" * 64}},
        checkpoints=["ckpt-000000004.npz"] if checkpoint else [],
    )


def prepare_run_dir(settings, resume, force, restart=False):
    plan = plan_run(settings, resume, force, restart)
    plan.release()
    return plan.run_dir, plan.settings, plan.resumed


def _snapshot(run):
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"}


@pytest.mark.parametrize("status", ["interrupted", "budget", "running"])
def test_auto_resumes_the_newest_unfinished_run_with_equal_settings(tmp_path, status):
    s = _settings(tmp_path)
    _fake_run(s, "20260101-000000-aaaa", "interrupted")
    newest = _fake_run(s, "20260102-000000-bbbb", status, epochs=9)  # EPOCHS may differ on resume
    assert auto_resume(s) == str(newest)


@pytest.mark.parametrize(
    "status, why",
    [
        ("completed", "completed"),
        ("failed", "ended with status 'failed' (auto continues only a stopped or killed run)"),
        ("diverged", "ended with status 'diverged' (auto continues only a stopped or killed run)"),
    ],
)
def test_auto_starts_fresh_after_a_finished_or_failed_run_and_says_which(tmp_path, caplog, monkeypatch, status, why):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)  # setup_logging may have turned it off
    monkeypatch.setattr(logging.getLogger("train"), "handlers", [])  # and earlier tests may have left theirs
    s = _settings(tmp_path)
    _fake_run(s, "20260101-000000-aaaa", "interrupted")  # an older unfinished run is not picked
    _fake_run(s, "20260102-000000-bbbb", status)
    with caplog.at_level("INFO", logger="train"):
        assert auto_resume(s) == ""
    assert caplog.messages == [f"RESUME=auto: run 20260102-000000-bbbb {why}; starting a new run"]


def test_auto_starts_fresh_when_settings_differ(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)  # setup_logging may have turned it off
    monkeypatch.setattr(logging.getLogger("train"), "handlers", [])  # and earlier tests may have left theirs
    s = _settings(tmp_path)
    _fake_run(s, "20260102-000000-bbbb", "interrupted", batch_size=64, seed=1)
    with caplog.at_level("INFO", logger="train"):
        assert auto_resume(s) == ""
    assert caplog.messages == [
        "RESUME=auto: run 20260102-000000-bbbb did not finish but its settings differ "
        "(BATCH_SIZE: 64 -> 32; SEED: 1 -> 42); starting a new run"
    ]


CHOSEN = {"batch_size": 256, "learning_rate": 0.005, "reason": "training in float32 on a CPU"}


def _chosen_pair_run(settings):
    """An interrupted run whose start chose 256 and 0.005 (its manifest's `batch`)."""
    return write_run(
        Path(settings.runs_dir) / "20260102-000000-bbbb",
        {**settings.to_dict(), "batch_size": 256, "learning_rate": 0.005},
        {"status": "interrupted", "batch": CHOSEN},
        checkpoints=["ckpt-000000004.npz"],
    )


def test_auto_resumes_a_run_whose_batch_was_chosen_for_its_machine_while_neither_is_set(tmp_path):
    """Neither BATCH_SIZE nor LEARNING_RATE set: the pair a new run would take here is compared, and a
    run whose own pair was chosen so (its manifest's `batch`) keeps it, whatever this machine takes."""
    unset = load_settings({"dataset": "mnist", "runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    here = lambda: unset.replace(batch_size=256, learning_rate=0.005)  # noqa: E731  what a CPU in float32 took
    elsewhere = lambda: unset.replace(batch_size=512, learning_rate=0.007)  # noqa: E731  what a GPU takes
    run = _chosen_pair_run(unset)
    assert auto_resume(unset, here) == str(run)
    assert auto_resume(unset, elsewhere) == str(run)
    assert auto_resume(unset.replace(batch_size=256)) == ""  # given: both as given, and 0.007 differs
    (run / "manifest.json").write_text(json.dumps({"status": "interrupted"}))  # the pair was given then
    assert auto_resume(unset, here) == str(run)  # what a new run would take here anyway
    assert auto_resume(unset, elsewhere) == ""
    forced = {**unset.to_dict(), "batch_size": 64, "learning_rate": 0.005}  # --force'd since it was chosen
    (run / "config.json").write_text(json.dumps(forced))
    (run / "manifest.json").write_text(json.dumps({"status": "interrupted", "batch": CHOSEN}))
    assert auto_resume(unset, here) == ""


def test_auto_with_a_batch_given_compares_it_with_a_chosen_pair_and_starts_a_new_run(tmp_path):
    """`fit` offers no choice when BATCH_SIZE or LEARNING_RATE is given: a run whose pair was chosen is
    then compared as any other (here 64 against its 256), so RESUME=auto starts a new run."""
    unset = load_settings({"dataset": "mnist", "runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    run = _chosen_pair_run(unset)
    plan = plan_run(unset.replace(batch_size=64), "auto", choose=None)
    plan.release()
    assert not plan.resumed and plan.run_dir != run and plan.batch is None


def test_auto_continues_a_run_from_before_runs_chose_their_batch_at_the_defaults_it_took(tmp_path):
    """A run interrupted by a version that did not choose (512 and 0.007, no `batch` record) is what
    that version's invocation with neither set trained: the next `up` continues it on any machine."""
    unset = load_settings({"dataset": "mnist", "runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    older = _fake_run(unset, "20260102-000000-bbbb", "interrupted")  # its config: the defaults
    assert auto_resume(unset, lambda: unset.replace(batch_size=256, learning_rate=0.005)) == str(older)
    _fake_run(unset, "20260103-000000-cccc", "interrupted", batch_size=64)  # given then: compared as ever
    assert auto_resume(unset, lambda: unset.replace(batch_size=256, learning_rate=0.005)) == ""


def test_auto_continues_a_run_saved_at_one_step_a_call_before_eight_became_the_default(tmp_path):
    """STEPS_PER_EXECUTION does not change the weights: the `up` after an upgrade continues the run."""
    s = _settings(tmp_path)
    older = _fake_run(s, "20260102-000000-bbbb", "interrupted", steps_per_execution=1)
    assert s.steps_per_execution == 8 and auto_resume(s) == str(older)


def test_auto_asks_for_the_choice_only_when_there_is_a_run_to_compare(tmp_path):
    unset = load_settings({"dataset": "mnist", "runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})

    def never():
        raise AssertionError("the choice starts TensorFlow: not without a run to compare")

    assert auto_resume(unset, never) == ""
    run = _fake_run(unset, "20260102-000000-bbbb", "interrupted", batch_size=64)  # given then: compared
    with RunLock(run), pytest.raises(RunBusyError):
        auto_resume(unset, never)  # being resumed or exported: refused first


def test_auto_starts_fresh_without_runs_or_with_an_unreadable_one(tmp_path):
    s = _settings(tmp_path)
    assert auto_resume(s) == ""  # RUNS_DIR does not exist yet
    _fake_run(s, "20260102-000000-bbbb", None)  # killed before the manifest was written
    assert auto_resume(s) == ""


def test_prepare_new_run_writes_its_config(tmp_path):
    s = _settings(tmp_path, run_name="demo")
    run_dir, effective, resumed = prepare_run_dir(s, None, force=False)
    assert not resumed and effective == s and run_dir.name.endswith("-demo")
    assert read_json(run_dir / "config.json") == s.to_dict()


def test_prepare_auto_without_a_candidate_creates_a_run(tmp_path):
    s = _settings(tmp_path)
    run_dir, _, resumed = prepare_run_dir(s, "auto", force=False)
    assert not resumed and (run_dir / "config.json").is_file()


def test_prepare_resume_keeps_the_runs_settings_but_takes_free_ones_and_writes_only_when_told(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=2)
    before = _snapshot(run)
    plan = plan_run(s.replace(epochs=7), run.name)
    plan.release()
    assert plan.resumed and plan.run_dir == run
    assert plan.settings.epochs == 7 and plan.settings.batch_size == 32
    assert _snapshot(run) == before  # planning writes nothing: fit writes once everything is checked
    plan.write_config()
    assert read_json(run / "config.json")["epochs"] == 7


def test_write_config_leaves_an_unchanged_config_alone(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    (run / "config.json").write_text(json.dumps(s.to_dict(), indent=7))  # same settings, other bytes
    before = (run / "config.json").read_bytes()
    plan = plan_run(s, run.name)
    plan.release()
    plan.write_config()
    assert (run / "config.json").read_bytes() == before


def test_prepare_refuses_differing_settings_listing_them_unless_forced(tmp_path):
    s = _settings(tmp_path, seed=42)  # given: a setting left out would keep the run's value
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", batch_size=64, seed=1)
    with pytest.raises(ResumeMismatchError) as info:
        prepare_run_dir(s, run.name, force=False)
    assert str(info.value) == (
        f"run {run.name} was started with other settings (BATCH_SIZE: 64 -> 32; SEED: 1 -> 42): "
        "resume with the same settings, or pass --force (force=True in train()) to continue with the new ones"
    )
    assert info.value.exit_code == 4 and info.value.change == "BATCH_SIZE: 64 -> 32; SEED: 1 -> 42"  # for a sweep
    assert read_json(run / "config.json")["batch_size"] == 64  # untouched after a refusal
    plan = plan_run(s, run.name, force=True)
    plan.release()
    assert plan.resumed and plan.settings == s
    assert plan.forced == ["BATCH_SIZE: 64 -> 32", "SEED: 1 -> 42"]
    assert read_json(run / "config.json")["batch_size"] == 64  # fit writes it once the resume is checked


def test_a_python_caller_resuming_with_a_changed_setting_is_told_force_true(tmp_path):
    """The refusal said only `pass --force`: a notebook's train() takes force=True, not a flag."""
    import train

    s = _settings(tmp_path, seed=42)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", seed=1)
    with pytest.raises(ResumeMismatchError, match=r"SEED: 1 -> 42\).*force=True in train\(\)"):
        train.train(s, resume=run.name)  # refused as the run is planned, before TensorFlow is needed
    assert read_json(run / "config.json")["seed"] == 1


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


def test_resume_without_checkpoints_is_an_error_naming_the_run_and_the_fix(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "completed", checkpoint=False)
    (run / "metrics.csv").write_text("epoch\n1\n")
    before = _snapshot(run)
    with pytest.raises(CheckpointError) as info:
        plan_run(s, run.name)
    assert info.value.exit_code == 4
    assert run.name in str(info.value) and "--restart" in str(info.value) and "without --resume" in str(info.value)
    assert _snapshot(run) == before
    plan = plan_run(s, run.name, restart=True)  # the explicit way to start it over
    plan.release()
    assert plan.resumed and plan.restart


def test_restart_is_refused_when_checkpoints_exist_or_without_resume(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    with pytest.raises(
        CheckpointError, match=r"--restart \(restart=True in train\(\)\) is only for a run whose checkpoints are gone"
    ):
        plan_run(s, run.name, restart=True)
    with pytest.raises(ConfigError, match="--restart"):
        plan_run(s, None, restart=True)


def test_auto_resume_of_an_emptied_interrupted_run_is_an_error_not_a_fresh_start(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", checkpoint=False)
    (run / "best.weights.h5").write_bytes(b"weights")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        plan_run(s, "auto")


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_epoch_1(tmp_path):
    s = _settings(tmp_path)
    old = _fake_run(s, "20260102-000000-bbbb", "interrupted", checkpoint=False)  # stopped during start-up
    assert auto_resume(s) == str(old)
    plan = plan_run(s, "auto")  # nothing was trained, so nothing is lost
    plan.release()
    assert plan.run_dir == old and not plan.restart
    (old / "metrics.csv").write_text("epoch\n1\n")  # it had trained: its checkpoints were removed
    with pytest.raises(CheckpointError, match="no checkpoint"):
        plan_run(s, "auto")


def test_auto_refusing_a_run_whose_checkpoints_are_gone_names_resume_empty_for_a_new_run(tmp_path):
    """RESUME=auto (docker compose's default) chose a run stopped mid-way through epoch 1, whose
    checkpoints were then removed: no --resume was given, so the line names RESUME= empty, not
    `without --resume`, for a new run (as the EPOCHS refusal does); an explicit --resume keeps its words."""
    import json

    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", checkpoint=False)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "trained_state_saved": True}))
    assert auto_resume(s) == str(run)
    with pytest.raises(CheckpointError) as info:
        plan_run(s, "auto")
    assert str(info.value).endswith(
        "Pass --restart (restart=True in train()) to train it again from epoch 1 in the same directory, or start a "
        "new run instead (RESUME= empty: RESUME=auto chose this run)"
    )
    with pytest.raises(CheckpointError) as info:
        plan_run(s, run.name)
    assert str(info.value).endswith("or start a new run without --resume (resume=None in train())")


@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
@pytest.mark.parametrize("content", [b'{"status": "compl', b"[1, 2]", b"\xff\xfe\x00"])
def test_a_corrupt_record_is_a_run_record_error_for_resume_and_auto(tmp_path, name, content):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    (run / name).write_bytes(content)
    for resume in (run.name, "auto"):
        with pytest.raises(RunRecordError) as info:
            plan_run(s, resume)
        assert info.value.exit_code == 4 and run.name in str(info.value) and name in str(info.value)
    assert (run / name).read_bytes() == content


def test_a_config_with_an_invalid_value_is_a_run_record_error(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", batch_size=-3)
    with pytest.raises(RunRecordError, match="config.json does not hold valid settings"):
        plan_run(s, run.name)


def test_a_run_whose_data_moved_is_a_data_error_not_a_damaged_record(tmp_path):
    from train.errors import DataError
    from train.run.rundir import read_run_settings

    moved = tmp_path / "moved.npz"
    s = _settings(tmp_path, dataset=f"npz:{write_tiny_npz(tmp_path)}")
    run = _fake_run(s, "20260102-000000-cccc", "interrupted", dataset=f"npz:{moved}")
    with pytest.raises(DataError) as e:  # what reads the data (a report's validation part) is told to put it back
        read_run_settings(run)
    assert str(e.value) == (
        f"run {run.name} was trained on DATASET=npz:{moved}, which is not there now (file {moved} does not exist): "
        "put the data back where it was"
    )
    assert read_run_settings(run, need_data=False).dataset == f"npz:{moved}"
    with pytest.raises(ResumeMismatchError, match="DATASET: "):  # a resume compares it with what is asked
        plan_run(s, run.name)


def test_a_run_locked_by_another_holder_is_refused_naming_it(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    starting = _fake_run(s, "20260103-000000-000001", "running", checkpoint=False)  # no state yet, but alive
    with RunLock(starting):
        with pytest.raises(RunBusyError):
            plan_run(s, "auto")
    starting.rename(run.parent / "moved")
    with RunLock(run):
        for resume in (run.name, "auto", "latest"):
            with pytest.raises(RunBusyError) as info:
                plan_run(s, resume)
            assert run.name in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    plan_run(s, run.name).release()  # released: free again


def test_changed_data_is_refused_unless_forced_and_then_recorded(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    plan = plan_run(s, run.name)
    plan.release()
    check_data(plan, "a" * 64, "x.npz", force=False)  # the same bytes: fine
    with pytest.raises(ResumeMismatchError) as info:
        check_data(plan, "b" * 64, "x.npz", force=False)
    assert str(info.value) == (
        f"run {plan.run_dir.name} was trained on other data (DATA: fingerprint aaaaaaaaaaaa... -> bbbbbbbbbbbb... "
        "(x.npz)): the same path holds new contents; resume on the run's own data, start a new run, or pass --force "
        "(force=True in train()) to continue on the new data (recorded in the manifest's segments)"
    )
    check_data(plan, "b" * 64, "x.npz", force=True)
    assert plan.forced == ["DATA: fingerprint aaaaaaaaaaaa... -> bbbbbbbbbbbb... (x.npz)"]


@pytest.mark.parametrize(
    "files, manifest, trained",
    [
        ((), {}, False),
        ((), {"epochs_completed": 0}, False),
        ((), {"epochs_completed": 2}, True),
        (("metrics.csv",), {}, True),
        (("best.weights.h5",), {}, True),
        (("final.weights.h5",), {}, True),
        # a state saved mid-way through epoch 1 (a stop, CHECKPOINT_EVERY), recorded by the loop
        ((), {"epochs_completed": 0, "trained_state_saved": True}, True),
    ],
)
def test_a_run_counts_as_trained_by_its_files_or_its_manifest(tmp_path, files, manifest, trained):
    from train.run.resume import _trained

    for name in files:
        (tmp_path / name).write_bytes(b"x")
    assert _trained(tmp_path, manifest) is trained


def test_plan_run_refuses_differing_settings_by_default(tmp_path):
    s = _settings(tmp_path, seed=42)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", seed=1)
    with pytest.raises(ResumeMismatchError):
        plan_run(s, run.name)


def test_a_new_run_is_not_resumed_and_restart_needs_a_run(tmp_path):
    s = _settings(tmp_path)
    plan = plan_run(s, None)
    plan.release()
    assert plan.resumed is False and plan.restart is False
    with pytest.raises(ConfigError) as info:
        plan_run(s, None, restart=True)
    assert info.value.name == "--restart" and str(info.value) == (
        "--restart=True is not valid: needs --resume RUN (resume=RUN in train()), the run it trains again from epoch 1 "
        "when its checkpoints are gone"
    )


def test_a_run_killed_before_its_manifest_resumes(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", None, checkpoint=False)
    plan = plan_run(s, run.name)
    plan.release()
    assert plan.resumed and plan.manifest == {}
    lost = _fake_run(s, "20260103-000000-cccc", None)  # checkpoints and no manifest.json: it was deleted
    with pytest.raises(RunRecordError, match=f"run {lost.name} has no manifest.json .*restore the file from a backup"):
        plan_run(s, lost.name)  # it resumed, with weights "written before hashes were kept" and a new precision


def test_checkpoint_refusals_name_the_checkpoint_directory(tmp_path):
    s = _settings(tmp_path)
    trained = _fake_run(s, "20260102-000000-bbbb", "interrupted", checkpoint=False)
    (trained / "metrics.csv").write_text("epoch\n1\n")
    with pytest.raises(CheckpointError) as info:
        plan_run(s, trained.name)
    assert str(info.value) == (
        f"run {trained.name} has no checkpoint in {trained / 'checkpoints'} (deleted or never written): there is "
        "nothing to resume from. Pass --restart (restart=True in train()) to train it again from epoch 1 in the same "
        "directory, or start a new run without --resume (resume=None in train())"
    )
    kept = _fake_run(s, "20260103-000000-cccc", "interrupted")
    with pytest.raises(CheckpointError) as info:
        plan_run(s, kept.name, restart=True)
    assert str(info.value) == (
        f"run {kept.name} has checkpoints in {kept / 'checkpoints'}: --restart (restart=True in train()) is only for "
        "a run whose checkpoints are gone; leave it out to resume the run"
    )


def test_auto_checks_the_lock_of_the_run_it_would_continue(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "running")
    with RunLock(run):
        with pytest.raises(RunBusyError):
            auto_resume(s)  # still going: not a candidate
    assert auto_resume(s) == str(run)  # killed: its lock is free, so it is resumed
    (run / "manifest.json").write_text(json.dumps({"status": "interrupted"}))
    with RunLock(run), pytest.raises(RunBusyError):
        auto_resume(s)  # stopped, and being resumed or exported by another process: refused at once
    assert auto_resume(s) == str(run)


# -- a resume takes only what this invocation gives ------------------------------------------------
def test_a_resume_keeps_the_runs_epochs_unless_epochs_is_given(tmp_path):
    s = _settings(tmp_path)  # EPOCHS not given: the default 3
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=5)
    plan = plan_run(s, run.name)
    plan.release()
    assert plan.settings.epochs == 5
    plan.write_config()
    assert read_json(run / "config.json")["epochs"] == 5
    plan = plan_run(_settings(tmp_path, epochs=3), run.name)  # given, even as the default's value
    plan.release()
    assert plan.settings.epochs == 3


def test_epochs_given_below_the_runs_own_warm_up_is_refused_naming_epochs_and_the_warm_up(tmp_path):
    """The warm-up is the run's (changing it needs --force): the refusal says which EPOCHS would do, not
    a LR_WARMUP_EPOCHS the user never gave."""
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=10, lr_warmup_epochs=2.5)
    with pytest.raises(ConfigError) as info:
        plan_run(_settings(tmp_path, epochs=2), run.name)
    assert str(info.value) == (
        "EPOCHS=2 is not valid: run 20260102-000000-bbbb warms up over LR_WARMUP_EPOCHS=2.5 epochs and the warm-up "
        "must end before the training does: give more than 2.5"
    )
    with pytest.raises(ConfigError, match=r"^LR_WARMUP_EPOCHS=2\.5 is not valid: the warm-up must end"):
        _settings(tmp_path, epochs=2, lr_warmup_epochs=2.5)  # both given: refused before any run is read


# A recorded value other than the default for every setting that may change on resume.
_NAMES = {f.name for f in dataclasses.fields(Settings)}
# Every free setting, the extras' too: only those of the extras this template has are tested.
RECORDED_FREE = {
    "data_dir": "/recorded/data",
    "epochs": 5,
    "max_minutes": 30.0,
    "progress": "bar",
    "debug": True,
    "export": False,
    "keep_checkpoints": 7,
    "checkpoint_every": 50,
    "steps_per_execution": 1,  # the default before it was 8
    "memory_growth": False,
    "auto_batch": True,
    "resume": "latest",
    "patience": 4,
    "min_delta": 0.01,
    "report": "quick",
    "mlflow_tracking_uri": "http://127.0.0.1:5999",
    "mlflow_experiment": "recorded",
    "max_image_pixels": 1000,
    "cache": "file",  # the same batches in every mode (tests/inputs/test_images.py)
    "join_timeout": 5.0,
    "peak_flops": "1e12",
    "export_formats": "savedmodel,onnx",
    "export_quantize": "dynamic",
    "export_check_python": "/recorded/python",
    "store_cache": "/recorded/cache",
    "store_lease_seconds": 30.0,
    "store_flush_seconds": 10.0,
    "dvc_command": "/recorded/dvc",
    "dvc_data_cache": "/recorded/data-versions",
    "serve_max_batch": 8,
    "serve_max_wait_ms": 1.0,
    "serve_max_body_mb": 2.0,
    "serve_max_pixels": 1000,
    "serve_drain_seconds": 5.0,
    "sweep_storage": "sqlite:////recorded/study.db",
    "profile": "steps",
    "profile_steps": "3:7",
}
RECORDED_FREE = {name: value for name, value in RECORDED_FREE.items() if name in _NAMES}
# RUNS_DIR is where the run is found; WORKERS/WORKER_INDEX say where this process trains.
OF_THE_INVOCATION = {"runs_dir", "workers", "worker_index"} & _NAMES


def test_every_free_setting_has_a_recorded_value_here():
    from train.config import RESUME_FREE

    assert set(RECORDED_FREE) == RESUME_FREE - OF_THE_INVOCATION


@pytest.mark.parametrize("name", sorted(RECORDED_FREE))
def test_a_free_setting_left_out_keeps_the_runs_value_and_given_takes_the_new_one(tmp_path, name):
    from train.config import Settings, env_text

    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", **{name: RECORDED_FREE[name]})
    left_out = {k: v for k, v in _given_values(s).items() if k != name}
    plan = plan_run(load_settings(left_out, env_file=None, environ={}), run.name)
    plan.release()
    assert getattr(plan.settings, name) == RECORDED_FREE[name]
    given = {**left_out, name: env_text(getattr(Settings, name))}  # given, as a flag, with the default's value
    plan = plan_run(load_settings(given, env_file=None, environ={}), run.name)
    plan.release()
    assert getattr(plan.settings, name) == getattr(Settings(), name)


def _given_values(s):
    return {"dataset": s.dataset, "runs_dir": s.runs_dir, "data_dir": s.data_dir, "batch_size": s.batch_size}


@pytest.mark.parametrize("where", ["environ", "env_file"])
def test_a_free_setting_from_the_environment_or_env_file_counts_as_given(tmp_path, where):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=5, patience=2)
    env_file = tmp_path / "my.env"
    env_file.write_text("EPOCHS=8\nPATIENCE=0\n")
    environ = {"EPOCHS": "8", "PATIENCE": "0"}
    given = load_settings(
        _given_values(s),
        env_file=env_file if where == "env_file" else None,
        environ=environ if where == "environ" else {},
    )
    plan = plan_run(given, run.name)
    plan.release()
    assert (plan.settings.epochs, plan.settings.patience) == (8, 0)


def test_a_setting_left_out_keeps_the_runs_value_instead_of_being_refused(tmp_path):
    # Started with --seed 1 --learning-rate 0.01; resumed with `--resume RUN` alone, as the stop message says.
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", seed=1, learning_rate=0.01)
    plan = plan_run(s, run.name)
    plan.release()
    assert (plan.settings.seed, plan.settings.learning_rate) == (1, 0.01) and plan.forced == []


def test_a_programmatic_replace_counts_as_given(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=5)
    plan = plan_run(s.replace(epochs=3), run.name)
    plan.release()
    assert plan.settings.epochs == 3


def test_run_name_never_blocks_a_resume_and_the_run_keeps_its_name(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb-stopme", "interrupted", run_name="stopme")
    for invocation in (s, _settings(tmp_path, run_name="other")):
        plan = plan_run(invocation, run.name)
        plan.release()
        assert plan.settings.run_name == "stopme" and plan.forced == []


@pytest.mark.skipif("workers" not in _NAMES, reason="(optional: this template has no workers extra)")
def test_workers_are_this_processs_and_a_moved_run_gets_its_new_runs_dir(tmp_path):
    s = _settings(tmp_path)
    old_home = str(tmp_path / "old-runs")
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", workers="h:1,h:2", worker_index=0, runs_dir=old_home)
    plan = plan_run(load_settings({"dataset": "mnist", "batch_size": 32}, env_file=None, environ={}), str(run))
    plan.release()
    assert (plan.settings.workers, plan.settings.worker_index) == ("", -1)
    assert plan.settings.runs_dir == str(run.parent)


def test_auto_still_compares_the_resolved_settings(tmp_path):
    # RESUME=auto asks "is this the same job?": a setting left out that differs means a new run.
    s = _settings(tmp_path)
    _fake_run(s, "20260102-000000-bbbb", "interrupted", seed=1)
    assert auto_resume(s) == ""


def test_as_given_makes_a_resume_take_every_setting_from_the_invocation(tmp_path):
    # What the chief of several workers does: the others train with their own invocation's settings.
    from train.config import as_given

    s = _settings(tmp_path, seed=1)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted", epochs=5)
    plan = plan_run(as_given(s), run.name)
    plan.release()
    assert plan.settings.epochs == 3 and plan.settings == as_given(s)


def test_auto_continues_a_named_run_unless_another_name_is_given(tmp_path):
    s = _settings(tmp_path)
    named = _fake_run(s, "20260102-000000-bbbb-stopme", "interrupted", run_name="stopme")
    assert auto_resume(s) == str(named)  # `docker compose up` again, without the --run-name of the first
    assert auto_resume(_settings(tmp_path, run_name="stopme")) == str(named)
    assert auto_resume(_settings(tmp_path, run_name="other")) == ""  # a new name asks for a new run


def test_a_run_recorded_before_validation_was_split_off_resumes_validating_on_the_test_split(tmp_path):
    """Its config.json has no VAL_FROM: it trained on all of x_train and validated on x_test, so its
    metrics, best weights and early stopping meant that; a resume (and reproduce, which reads the same
    record) keeps doing so, and still writes VAL_FROM=test when the config is written again."""
    import numpy as np
    from builders import write_tiny_npz

    from train.inputs import pipeline as data

    npz = write_tiny_npz(tmp_path)
    s = _settings(tmp_path, dataset=f"npz:{npz}")
    old = {k: v for k, v in s.to_dict().items() if k != "val_from"}
    run = write_run(
        Path(s.runs_dir) / "20250101-000000-aaaa", old, {"status": "interrupted"}, checkpoints=["ckpt-000000004.npz"]
    )
    plan = plan_run(s, run.name)
    plan.release()
    assert plan.settings.val_from == "test"
    spec = data.load_data(plan.settings)
    with np.load(npz) as z:
        assert (spec.n_train, spec.n_val, spec.n_test) == (len(z["y_train"]), len(z["y_test"]), 0)
        np.testing.assert_array_equal(spec._train.x[..., 0], z["x_train"])
        np.testing.assert_array_equal(spec._val.x[..., 0], z["x_test"])
    plan.write_config()
    assert read_json(run / "config.json")["val_from"] == "test"
    # A new run with the same settings validates on a share of the training data instead.
    fresh = plan_run(s, None)
    fresh.release()
    assert fresh.settings.val_from == "train"


@pytest.mark.extra("sweep")  # SWEEP_STORAGE: a URL-valued setting besides a bucket RUNS_DIR
def test_a_resume_keeps_the_url_values_it_was_given_and_a_local_runs_dir_with_an_at(tmp_path):
    # config.json shows URLs masked; the resumed process still needs the real ones, and a local
    # folder named with an @ is a path, not a URL to mask.
    url = "postgresql://u:pa/ss@127.0.0.1:5432/db"
    runs = tmp_path / "runs@v2"
    settings = _settings(tmp_path, runs_dir=str(runs), sweep_storage=url)
    assert settings.to_dict()["runs_dir"] == str(runs)
    run = _fake_run(settings, "20260101-000000-000001", "interrupted")
    assert read_json(run / "config.json")["sweep_storage"] == "postgresql://***@127.0.0.1:5432/db"
    run_dir, resumed, was_resumed = prepare_run_dir(settings, run.name, force=False)
    assert was_resumed and run_dir == run
    assert resumed.sweep_storage == url and resumed.runs_dir == str(runs)


def _segments(run, *hashes_and_statuses):
    manifest = read_json(run / "manifest.json")
    manifest["segments"] = [{"status": status, "config_sha256": sha} for sha, status in hashes_and_statuses]
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_a_config_json_changed_after_the_run_wrote_it_is_refused_naming_the_file_and_the_fix(tmp_path):
    from train.digest import sha256_file

    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    _segments(run, (sha256_file(run / "config.json"), "interrupted"))
    config = read_json(run / "config.json")
    (run / "config.json").write_text(json.dumps({**config, "learning_rate": 0.5}))  # edited in the bucket
    before = _snapshot(run)
    with pytest.raises(RunRecordError) as info:
        plan_run(s, run.name)
    message = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in message
    assert f"{run / 'config.json'} was changed after the run wrote it" in message
    assert "restore the file, or start a new run" in message
    assert _snapshot(run) == before
    (run / "config.json").write_text(json.dumps(config))  # restored: the same bytes as written
    assert prepare_run_dir(s, run.name, False)[2] is True


def test_a_run_recorded_without_a_config_hash_resumes_as_before(tmp_path):
    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    _segments(run, (None, "interrupted"))
    config = read_json(run / "config.json")
    (run / "config.json").write_text(json.dumps({**config, "learning_rate": 0.5}))
    run_dir, settings, resumed = prepare_run_dir(s, run.name, False)
    assert resumed and settings.learning_rate == 0.5


@pytest.mark.parametrize(("status", "older_accepted"), [("running", True), ("failed", True), ("interrupted", False)])
def test_a_segment_ended_as_it_started_accepts_the_config_json_of_the_one_before(tmp_path, status, older_accepted):
    """A segment is recorded before the config.json it changes: a kill between the two leaves the older file."""
    from train.digest import sha256_file

    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    _segments(run, (sha256_file(run / "config.json"), "interrupted"), ("b" * 64, status))
    if older_accepted:
        assert prepare_run_dir(s, run.name, False)[2] is True
    else:
        with pytest.raises(RunRecordError, match="was changed after the run wrote it"):
            plan_run(s, run.name)


def test_the_config_hash_of_a_resume_is_the_file_it_writes(tmp_path):
    from train.digest import sha256_file

    s = _settings(tmp_path)
    run = _fake_run(s, "20260102-000000-bbbb", "interrupted")
    plan = plan_run(s.replace(epochs=s.epochs + 3), run.name)  # EPOCHS is free: config.json changes
    try:
        recorded = plan.config_sha256()
        assert recorded != sha256_file(run / "config.json")
        plan.write_config()
        assert recorded == sha256_file(run / "config.json")
    finally:
        plan.release()
