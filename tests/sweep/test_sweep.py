"""Sweeps: every trial an ordinary run, the study's total kept across reruns, pruning through the epoch loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import write_tiny_npz

from train.cli import main
from train.config import load_settings
from train.run.find import list_run_dirs


def _space(tmp_path: Path, body: str, study: str = "") -> Path:
    path = tmp_path / "space.toml"
    path.write_text(f"[study]\nname = 's'\ntrials = 3\n{study}\n[space]\n{body}")
    return path


def _flags(tmp_path: Path, **changes) -> list[str]:
    npz = write_tiny_npz(tmp_path, n_train=48, n_test=16, size=8)
    values = {
        "dataset": f"npz:{npz}",
        "runs_dir": str(tmp_path / "runs"),
        "data_dir": str(tmp_path / "data"),
        "model": "faults:dense16",
        "epochs": 1,
        "batch_size": 16,
        # A constant rate: the pruner compares each trial's epochs as the learning rate gives them.
        "lr_schedule": "constant",
        "lr_warmup_epochs": 0,
        "checkpoint_every": 0,
        "precision": "float32",
        "progress": "line",
        "report": "quick",
        "export": False,
        "peak_flops": "1e11",
        **changes,
    }
    flags = ["--env-file", "/dev/null"]
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return flags


def _manifests(runs: Path) -> list[dict]:
    return [json.loads((r / "manifest.json").read_text()) for r in list_run_dirs(runs)]


@pytest.mark.slow
def test_three_trials_are_three_runs_a_rerun_continues_and_more_trials_add_one(tmp_path, capsys):
    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'lr'\ntrials = 3\npruner = 'none'\n[space]\n"
        "learning_rate = { low = 1e-4, high = 1e-2, log = true }\nbatch_size = [8, 16]\n"
    )
    runs = tmp_path / "my runs"  # a space: the command printed to paste quotes it
    flags = _flags(tmp_path, runs_dir=str(runs))
    assert main(["sweep", str(space), *flags]) == 0
    out = capsys.readouterr().out
    sweeps = sorted((m["sweep"]["trial"], m["status"], m["sweep"]["study"]) for m in _manifests(runs))
    assert sweeps == [(0, "completed", "lr"), (1, "completed", "lr"), (2, "completed", "lr")]
    for m in _manifests(runs):
        config = json.loads((runs / m["run_id"] / "config.json").read_text())
        assert config["learning_rate"] == m["sweep"]["params"]["learning_rate"]
        assert config["batch_size"] == m["sweep"]["params"]["batch_size"]
    best_line = next(line for line in out.splitlines() if line.startswith("best: trial "))
    best = min(_manifests(runs), key=lambda m: -m["best"]["value"])
    assert best["best"]["value"] == pytest.approx(float(best_line.split("val_accuracy=")[1].split()[0]), abs=1e-4)
    assert f"python -m train export {best_line.split('(run ')[1].rstrip(')')} --runs-dir '{runs}'" in out
    # Chosen on validation; its test result is shown beside it, from its own manifest.
    chosen = json.loads((runs / best_line.split("(run ")[1].rstrip(")") / "manifest.json").read_text())
    tested = chosen["test"]["weights"]["best"]["accuracy"]
    assert f"  test: accuracy={tested:.4f} (its best weights, the test split evaluated once; " in out

    assert main(["sweep", str(space), *flags]) == 0  # the same total: nothing more to run
    assert len(list_run_dirs(runs)) == 3
    capsys.readouterr()
    assert main(["sweep", str(space), "--trials", "4", *flags]) == 0
    assert sorted(m["sweep"]["trial"] for m in _manifests(runs)) == [0, 1, 2, 3]
    # The fourth trial may beat the first three: the study's best is now the best of four.
    best_of_4 = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best: trial "))

    # A trial's run is a run like any other: listed, reported and exported by the usual commands.
    run_id = best_line.split("(run ")[1].rstrip(")")
    assert main(["runs", "--runs-dir", str(runs), "--env-file", "/dev/null"]) == 0
    assert run_id in capsys.readouterr().out
    assert main(["report", run_id, "--quick", "--runs-dir", str(runs), "--env-file", "/dev/null"]) == 0
    assert main(["export", run_id, "--runs-dir", str(runs), "--env-file", "/dev/null"]) == 0
    assert (runs / run_id / "export" / "model.keras").is_file()
    report = (runs / "sweeps" / "lr" / "report.html").read_text()
    trial, best_run = best_of_4.split()[2], best_of_4.split("(run ")[1].rstrip(")")
    assert (
        f"best: trial {trial}, " in report and f"run {best_run}" in report and f"../../{run_id}/report.html" in report
    )


@pytest.mark.slow
def test_a_trial_behind_the_others_is_pruned_and_the_sweep_exits_0(tmp_path, capsys):
    from train.sweep.space import read_space
    from train.sweep.storage import default_url, open_storage, open_study

    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'p'\ntrials = 2\npruner = 'median'\nstartup_trials = 1\nmetric = 'val_loss'\n"
        "[space]\nlearning_rate = [0.05, 1e-8]\n"
    )
    flags = _flags(tmp_path, epochs=3)
    settings = load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    spec = read_space(space, settings)
    url = default_url(tmp_path / "runs", "p")
    study = open_study(open_storage(url, 60), spec, url, None)
    study.enqueue_trial({"learning_rate": 0.05})  # the good one first: the pruner then has something to compare
    study.enqueue_trial({"learning_rate": 1e-8})
    assert main(["sweep", str(space), *flags]) == 0
    by_lr = {m["sweep"]["params"]["learning_rate"]: m for m in _manifests(tmp_path / "runs")}
    assert by_lr[0.05]["status"] == "completed" and by_lr[0.05]["epochs_completed"] == 3
    pruned = by_lr[1e-8]
    assert pruned["status"] == "pruned" and pruned["epochs_completed"] == 1
    assert "pruned by the median pruner after epoch 1" in pruned["ended_because"]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {0: "COMPLETE", 1: "PRUNED"}


@pytest.mark.slow
def test_a_trial_that_diverges_fails_says_why_and_the_study_goes_on(tmp_path, capsys):
    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'd'\ntrials = 2\npruner = 'none'\nsampler = 'grid'\n"
        "[space]\nmodel = ['faults:nan_after_10_steps', 'faults:dense16']\n"
    )
    assert main(["sweep", str(space), *_flags(tmp_path, batch_size=4)]) == 0  # 12 steps: NaN from the 11th
    by_model = {m["sweep"]["params"]["model"]: m for m in _manifests(tmp_path / "runs")}
    assert by_model["faults:nan_after_10_steps"]["status"] == "failed"
    assert by_model["faults:dense16"]["status"] == "completed"
    diverged = by_model["faults:nan_after_10_steps"]["sweep"]["trial"]
    (line,) = [x for x in capsys.readouterr().out.splitlines() if f" trial {diverged}: fail" in x]
    assert line.split(f" trial {diverged}: ")[1].startswith("fail (DivergedError: loss is nan in epoch 1"), line


@pytest.mark.slow
def test_with_pruner_none_no_trial_is_pruned(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'n'\ntrials = 2\npruner = 'none'\nstartup_trials = 0\nsampler = 'grid'\nmetric = 'val_loss'\n"
        "[space]\nlearning_rate = [0.05, 1e-8]\n"
    )
    assert main(["sweep", str(space), *_flags(tmp_path, epochs=2)]) == 0
    assert sorted(m["status"] for m in _manifests(tmp_path / "runs")) == ["completed", "completed"]


def test_pruners_are_optunas(tmp_path):
    import optuna

    from train.sweep.space import read_space
    from train.sweep.storage import make_pruner

    settings = load_settings({"runs_dir": str(tmp_path)}, env_file=None, environ={})
    for name, cls in (
        ("median", optuna.pruners.MedianPruner),
        ("hyperband", optuna.pruners.HyperbandPruner),
        ("none", optuna.pruners.NopPruner),
    ):
        spec = read_space(_space(tmp_path, "batch_size = [8]\n", f"pruner = '{name}'"), settings)
        assert isinstance(make_pruner(spec), cls)


def _study_with(tmp_path, states):
    import optuna

    from train.sweep.space import read_space
    from train.sweep.storage import default_url, open_storage, open_study

    settings = load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    spec = read_space(_space(tmp_path, "batch_size = [8, 16]\n"), settings)
    url = default_url(tmp_path / "runs", spec.name)
    study = open_study(open_storage(url, 60), spec, url, None)
    dist = {"batch_size": optuna.distributions.CategoricalDistribution([8, 16])}
    for state in states:
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                params={"batch_size": 8},
                distributions=dist,
                value=0.5 if state.name == "COMPLETE" else None,
            )
        )
    return study, spec, settings


def test_a_trial_asked_beyond_the_total_is_surplus_and_never_trains(tmp_path):
    import optuna

    from train.sweep import study as sweep
    from train.training.stop_flag import StopFlag

    COMPLETE = optuna.trial.TrialState.COMPLETE
    study, spec, settings = _study_with(tmp_path, [COMPLETE, COMPLETE])
    trial = study.ask()  # another process got the last place a moment before
    with pytest.raises(sweep._Surplus):
        sweep._objective(trial, study, spec, settings, "sqlite:///x", 2, StopFlag())
    assert study.trials[2].user_attrs[sweep.SURPLUS_ATTR] is True
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert [t.number for t in sweep.counted(study.get_trials())] == [0, 1]
    assert not list((tmp_path / "runs").glob("2*"))  # no run directory was made


def test_a_retry_replaces_the_trial_it_retries_in_the_count(tmp_path):
    import optuna

    from train.sweep import study as sweep

    study, _spec, _settings = _study_with(tmp_path, [optuna.trial.TrialState.FAIL])
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study.trials[0])
    every = study.get_trials()
    assert [t.number for t in sweep.counted(every)] == [1] and every[1].state.name == "WAITING"


def test_a_sweep_waiting_for_another_process_looks_again_within_seconds_not_a_heartbeat(tmp_path, monkeypatch, caplog):
    import logging

    import optuna

    from train.sweep import study as sweep

    COMPLETE = optuna.trial.TrialState.COMPLETE
    study, spec, settings = _study_with(tmp_path, [COMPLETE, COMPLETE])
    other = study.ask()  # the third and last trial, running in another process
    waits = []

    def wait(stop, seconds):
        waits.append(seconds)
        if len(waits) == 3:  # the other process finishes while this one waits
            study.tell(other, 0.5)

    monkeypatch.setattr(sweep, "_wait", wait)
    monkeypatch.setattr("train.train", lambda *a, **k: pytest.fail("nothing is left to train here"))
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    with caplog.at_level(logging.INFO, logger="train"):
        result = sweep.run_sweep(spec, settings, url, trials=3)
    assert spec.heartbeat == 60 and waits == [sweep.POLL_SECONDS] * 3 and sweep.POLL_SECONDS <= 5
    said = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert said == [  # once, not at every look
        "waiting for trial(s) 2, run by other processes (a trial whose process is gone is taken over once it "
        "has sent no heartbeat for 120 s)"
    ]
    assert result.finished == 3
    assert f"study s in {url}: 3 trial(s) in total, 3 counted so far" in caplog.messages  # the other's running one too


def test_a_queued_trial_whose_run_had_finished_is_told_its_result_not_trained_again(tmp_path, monkeypatch):
    import optuna
    from builders import write_run_records

    from train.sweep import study as sweep

    FAIL = optuna.trial.TrialState.FAIL
    study, spec, settings = _study_with(tmp_path, [FAIL])  # trial 0: its process died after the run ended
    run = write_run_records(
        tmp_path / "runs" / "20261201-000000-000000-s-t0",
        manifest={"status": "completed", "best": {"monitor": "val_accuracy", "value": 0.75}},
    )
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study.trials[0])
    frozen = study.trials[1]
    study._storage.set_trial_user_attr(frozen._trial_id, sweep.RUN_ATTR, run.name)
    monkeypatch.setattr("train.train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    result = sweep.run_sweep(spec, settings, url, trials=1)
    (kept,) = sweep.counted(study.get_trials())
    assert (kept.number, kept.state.name, kept.value) == (1, "COMPLETE", 0.75)
    assert result.best["run"] == run.name
    # What the command's last line reads.
    assert (result.study, result.total, result.finished) == ("s", 1, 1)
    assert json.loads((run / "manifest.json").read_text())["sweep"]["retry_of"] == [0]


def test_a_retried_trial_whose_run_has_other_settings_says_what_a_sweep_can_do_not_force(tmp_path, monkeypatch):
    import optuna
    from builders import write_run_records

    from train.errors import ResumeMismatchError
    from train.sweep import study as sweep

    study, spec, settings = _study_with(tmp_path, [optuna.trial.TrialState.FAIL])  # trial 0: stopped by SIGTERM
    run = write_run_records(tmp_path / "runs" / "20261201-000000-000000-s-t0", manifest={"status": "interrupted"})
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study.trials[0])
    study._storage.set_trial_user_attr(study.trials[1]._trial_id, sweep.RUN_ATTR, run.name)

    def other_settings(*_a, **_k):  # what fit's resume says when the sweep is rerun with --epochs 3
        raise ResumeMismatchError(f"run {run.name} ...: resume ..., or pass --force ...", "EPOCHS: 2 -> 3")

    monkeypatch.setattr("train.train", other_settings)
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    with pytest.raises(ResumeMismatchError) as err:
        sweep.run_sweep(spec, settings, url, trials=1)
    assert str(err.value) == (
        f"study s: trial 1 continues run {run.name}, which was started with other settings or data (EPOCHS: 2 -> 3): "
        "rerun the sweep with what that run was started with, or search with the new settings in a new study "
        "(--study NAME)"
    )
    assert err.value.exit_code == 4 and "--force" not in str(err.value)  # `sweep` has no --force
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL", "WAITING"]  # queued again, not counted


@pytest.mark.slow
def test_a_trial_reproduces_bit_identical_from_its_own_record(tmp_path):
    import shutil

    from helpers import clone_of_the_package, train_in

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = clone_of_the_package(tmp_path / "repo")  # a committed copy: the record's commit is clean
    npz = write_tiny_npz(tmp_path, n_train=64, n_test=16)
    space = tmp_path / "space.toml"
    space.write_text("[study]\nname = 'r'\ntrials = 1\npruner = 'none'\n[space]\nlearning_rate = [0.002]\n")
    runs = tmp_path / "runs"
    flags = ["--dataset", f"npz:{npz}", "--runs-dir", str(runs), "--epochs", "1", "--batch-size", "16"]
    train_in(
        repo, "sweep", str(space), *flags, "--precision", "float32", "--deterministic", "--no-export", "--report", "off"
    )
    (run,) = list_run_dirs(runs)
    proc = train_in(repo, "reproduce", run.name, "--local", "--runs-dir", str(runs))
    assert "MATCH by final weights sha256" in proc.stdout, proc.stdout


def test_a_trial_stopped_by_the_sweeps_own_error_is_queued_again_not_counted(tmp_path, monkeypatch):
    from train.errors import DataError, SecondInterrupt
    from train.sweep import study as sweep

    study, spec, settings = _study_with(tmp_path, [])

    def missing_data(*_a, **_k):
        raise DataError("the data set is gone")

    monkeypatch.setattr("train.train", missing_data)
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    with pytest.raises(DataError):
        sweep.run_sweep(spec, settings, url, trials=1)
    every = study.get_trials()
    assert [(t.number, t.state.name) for t in every] == [(0, "FAIL"), (1, "WAITING")]
    assert [t.number for t in sweep.counted(every)] == [1] and every[1].params == every[0].params
    # A second Ctrl-C likewise; its line gives the sweep's command, not the `--resume RUN` of a fit's.
    monkeypatch.setattr("train.train", lambda *_a, **_k: (_ for _ in ()).throw(SecondInterrupt()))
    with pytest.raises(SecondInterrupt) as stopped:
        sweep.run_sweep(spec, settings, url, trials=1, command="python -m train sweep s.toml")
    assert str(stopped.value) == (
        "Stopped at once (second Ctrl-C): the last saved state is kept; the trial is queued again; "
        "to continue it: python -m train sweep s.toml"
    )
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL", "WAITING"]


def test_the_command_a_stop_says_again_masks_the_storage_password(tmp_path, monkeypatch, capsys):
    from train.sweep import study as sweep

    said = []

    def run_sweep(spec, settings, url, trials, command):  # what a stop and the trial's train.log say
        said.append(command)
        return sweep.SweepResult(spec.name, 1, 1, None)

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    space = _space(tmp_path, "batch_size = [8, 16]\n")
    url = "postgresql://bob:s3cret@127.0.0.1:1/optuna"
    for flags in (["--storage", url], [f"--sweep-storage={url}"]):
        assert main(["sweep", str(space), *flags, "--runs-dir", str(tmp_path / "runs"), "--env-file", "/dev/null"]) == 0
    assert len(said) == 2 and all("s3cret" not in c and "postgresql://***@127.0.0.1:1/optuna" in c for c in said), said
    assert "s3cret" not in "".join(capsys.readouterr())


def test_sigterm_between_trials_ends_the_sweep_with_75_before_the_next_trial(tmp_path, monkeypatch, caplog):
    import logging
    import os
    import signal

    from train.sweep import study as sweep
    from train.training.loop import Result

    study, spec, settings = _study_with(tmp_path, [])

    def trains_then_is_stopped(s, **_kw):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives once the trial's run has ended: the sweep's own handler
        return Result(None, "completed", 1, best=0.5)

    monkeypatch.setattr("train.train", trains_then_is_stopped)
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    with (
        caplog.at_level(logging.INFO, logger="train"),
        pytest.raises(sweep.SweepInterrupted, match="between trials") as err,
    ):
        sweep.run_sweep(spec, settings, url, trials=3)
    assert err.value.exit_code == 75
    assert [(t.number, t.state.name) for t in study.get_trials()] == [(0, "COMPLETE")]
    # What the stop does, said when it arrives: no run of the sweep's own has steps to finish.
    assert "received SIGTERM: stopping before another trial starts" in caplog.messages, caplog.messages


def test_a_stopped_trial_gives_one_instruction_and_its_retry_is_numbered_so_a_user_can_follow_it(
    tmp_path, monkeypatch, caplog
):
    """In this process, each trial's training replaced: a run is made and stopped, then the next
    sweep resumes it. One command to continue (the sweep's, in the run's last line too), no Optuna
    warning, and the retry named as one in the log and in the report; a resumed run's own name is
    no RUN_NAME it ignores."""
    import logging
    import warnings

    from builders import write_run_records

    from train.sweep import study as sweep
    from train.training.loop import Result

    study, spec, settings = _study_with(tmp_path, [])
    url = f"sqlite:///{tmp_path / 'runs' / 'sweeps' / 's.db'}"
    command = "python -m train sweep space.toml --epochs 3"
    seen = []

    def stopped(s, resume, callbacks, continue_with):
        run = write_run_records(
            tmp_path / "runs" / f"20261201-000000-000000-{s.run_name}", config={"run_name": s.run_name}
        )
        for callback in callbacks:
            callback.on_start(run)
        seen.append(continue_with(run.name))
        return Result(run, "interrupted", 0)

    monkeypatch.setattr("train.train", stopped)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        with pytest.raises(sweep.SweepInterrupted) as err:
            sweep.run_sweep(spec, settings, url, trials=1, command=command)
    run = "20261201-000000-000000-s-t0"
    assert str(err.value) == (
        f"study s: trial 0 stopped (interrupted); its run {run} saved a resumable state; to continue it: {command}"
    )
    assert seen == [command]  # the run's own last line: the sweep continues it, not `fit --resume`
    assert [str(w.message) for w in warned if "Experimental" in type(w.category).__name__] == []

    def completed(s, resume, callbacks, continue_with):
        seen.append((s.run_name, resume))
        return Result(tmp_path / "runs" / run, "completed", 1, best=0.5)

    monkeypatch.setattr("train.train", completed)
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="train"):
        result = sweep.run_sweep(spec, settings, url, trials=1, command=command)
    assert seen[1] == ("s-t0", str(tmp_path / "runs" / run))  # its own name, not an empty RUN_NAME
    assert f"trial 1 (a retry of trial 0): resuming run {run}" in caplog.messages
    assert "<td>1 (a retry of trial 0) (best)</td>" in result.report.read_text()


@pytest.mark.slow
def test_sigterm_once_a_trials_training_is_over_ends_the_sweep_before_the_next_trial(tmp_path, monkeypatch):
    """The signal comes during the trial's test split (one epoch trains fast; the test and the export
    take longer): the run's own handler takes it and the run completes, and the sweep must still stop."""
    import os
    import signal

    import train as package
    from train.sweep import study as sweep
    from train.sweep.space import read_space
    from train.sweep.storage import default_url

    real_train = package.train

    class SignalOnComplete:
        def on_complete(self, result):
            os.kill(os.getpid(), signal.SIGTERM)

    def train_then_signal(settings, **kwargs):
        kwargs["callbacks"] = [*kwargs.get("callbacks", ()), SignalOnComplete()]
        return real_train(settings, **kwargs)

    monkeypatch.setattr(package, "train", train_then_signal)
    npz = write_tiny_npz(tmp_path, n_train=48, n_test=16, size=8)
    fixed = {"dataset": f"npz:{npz}", "model": "faults:dense16", "epochs": 1, "export": False, "report": "off"}
    settings = load_settings({"runs_dir": str(tmp_path / "runs"), **fixed}, env_file=None, environ={})
    spec = read_space(_space(tmp_path, "batch_size = [8, 16]\n"), settings)
    with pytest.raises(sweep.SweepInterrupted, match="between trials") as err:
        sweep.run_sweep(spec, settings, default_url(tmp_path / "runs", spec.name), trials=3)
    assert err.value.exit_code == 75
    (run,) = list_run_dirs(tmp_path / "runs")
    assert json.loads((run / "manifest.json").read_text())["status"] == "completed"


def test_a_space_of_one_point_is_one_trial_said_once_not_the_same_training_again_and_again(tmp_path, caplog):
    from train.sweep.space import read_space
    from train.sweep.study import planned_total

    settings = load_settings({"runs_dir": str(tmp_path)}, env_file=None, environ={})
    one = read_space(_space(tmp_path, "batch_size = [16]\nmodel = ['cnn']\n"), settings)
    with caplog.at_level("INFO", logger="train"):
        assert planned_total(one) == 1 and planned_total(one, 5) == 1
    said = [r.getMessage() for r in caplog.records if "every setting in [space] has one value" in r.getMessage()]
    assert len(said) == 2 and "1 trial, not 3" in said[0] and "1 trial, not 5" in said[1], said
    caplog.clear()
    # Two points, or a range: TPE and random may search them with any number of trials, and say nothing.
    two = read_space(_space(tmp_path, "batch_size = [16, 32]\n"), settings)
    ranged = read_space(_space(tmp_path, "learning_rate = { low = 1e-4, high = 1e-2 }\n"), settings)
    with caplog.at_level("INFO", logger="train"):
        assert planned_total(two) == 3 and planned_total(ranged, 7) == 7
    assert not caplog.records


def test_more_trials_finished_than_asked_is_said_in_words_not_6_of_2():
    from train.sweep.command import finished_line
    from train.sweep.study import SweepResult

    assert finished_line(SweepResult("s", 4, 2, None)) == "study s: 2 of 4 trial(s) finished"
    line = finished_line(SweepResult("s", 2, 6, None))
    assert line.startswith("study s: 6 trial(s) finished, more than the 2 asked") and " of 2" not in line, line


def test_a_run_name_given_to_a_sweep_is_one_warning_that_says_how_trials_are_named(caplog):
    from train.sweep.command import _warn_run_name

    with caplog.at_level("WARNING", logger="train"):
        _warn_run_name(load_settings({"run_name": "mine"}, env_file=None, environ={}))
        _warn_run_name(load_settings({}, env_file=None, environ={}))
    assert [r.getMessage() for r in caplog.records] == [
        "WARNING: RUN_NAME=mine is not used: a sweep names each trial's run <run id>-<study>-t<trial number>"
    ]


def test_a_pruned_trial_names_its_metric_with_the_digits_compare_reads(tmp_path):
    """The log, compare and the report round the number metrics.csv keeps; the pruner's line rounded the
    float32 itself, so a tie (float32 0.90825, 0.90824997...) read 0.9082 here and 0.9083 in compare."""
    import types

    import numpy as np
    import optuna

    from train.sweep.trials import TrialObserver

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.95))
    spec = types.SimpleNamespace(pruner="threshold", metric="val_accuracy")
    observer = TrialObserver(study.ask(), spec, {}, epochs=3)
    ending = observer.on_epoch_end(1, {"val_accuracy": float(np.float32(0.90825))}, None)
    assert ending is not None and ending[0] == "pruned"
    assert "val_accuracy=0.9083 is behind" in ending[1], ending[1]


@pytest.mark.slow
def test_a_pair_of_values_refused_only_together_fails_its_trial_and_the_study_goes_on(tmp_path, capsys):
    """LR_WARMUP_EPOCHS=1.5 is valid with EPOCHS=2 and not with 1: the space is taken, that trial fails."""
    space = tmp_path / "space.toml"
    space.write_text(
        "[study]\nname = 'pair'\ntrials = 2\npruner = 'none'\nsampler = 'grid'\n"
        "[space]\nepochs = [1, 2]\nlr_warmup_epochs = [1.5]\n"
    )
    assert main(["sweep", str(space), *_flags(tmp_path, lr_schedule="cosine")]) == 0
    out = capsys.readouterr().out
    assert [m["sweep"]["params"]["epochs"] for m in _manifests(tmp_path / "runs")] == [2]
    (failed,) = [x for x in out.splitlines() if ": fail (ConfigError: " in x]
    assert "the warm-up must end before the training does (EPOCHS=1)" in failed, failed


def test_a_grid_runs_each_point_once_and_says_so_whole_and_nothing_when_the_trials_fit(tmp_path, caplog):
    from train.sweep.space import read_space
    from train.sweep.study import planned_total

    settings = load_settings({"runs_dir": str(tmp_path)}, env_file=None, environ={})
    grid = read_space(_space(tmp_path, "batch_size = [16, 32]\n", "sampler = 'grid'"), settings)
    one = read_space(_space(tmp_path, "batch_size = [16]\n"), settings)
    with caplog.at_level("INFO", logger="train"):
        assert planned_total(grid, 2) == 2  # as many trials as points: nothing to say
        assert not caplog.messages
        assert planned_total(grid, 5) == 2 and planned_total(one) == 1
    assert caplog.messages == [
        "study s: the grid has 2 points, so 2 trial(s), not 5",
        "study s: every setting in [space] has one value, so every trial would train the same settings: 1 trial, "
        "not 3; list a second value of a setting to search it",
    ]
