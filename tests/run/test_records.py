"""A run's record across segments: what a resume that fails, is refused or stops early leaves behind,
two processes on one run, and what `runs` shows. End to end on generated data (slow)."""

from __future__ import annotations

import json
import signal

import pytest
from builders import write_tiny_npz
from faults import fit_flags, kill_after_new_checkpoint, manifest, only_run, output, run_fit, start_fit, wait_until
from helpers import fit_here, stop_at_check, tiny_settings

pytestmark = pytest.mark.slow


def _bytes(run, *names):
    return {n: (run / n).read_bytes() for n in names}


def test_extending_a_completed_run_and_stopping_early_keeps_its_record_and_the_total_time(tmp_path, monkeypatch):
    from train import train
    from train.results.runs_table import list_runs

    s = tiny_settings(tmp_path, epochs=1, export=True)
    first = train(s)
    done = manifest(first.run_dir)
    assert done["export"] and done["best"]["value"] is not None and done["final_weights_sha256"]
    restore = stop_at_check(monkeypatch, 3)
    stopped = train(s.replace(epochs=2), resume=first.run_dir.name)
    restore()
    assert stopped.status == "interrupted"
    m = manifest(first.run_dir)
    for key in ("best", "export", "final_weights_sha256", "final_metrics", "data", "started_at"):
        assert m[key] == done[key], key
    assert m["epochs_completed"] == 1 and m["status"] == "interrupted"
    assert [(g["status"], g["epoch_from"], g["epoch_to"]) for g in m["segments"]] == [
        ("completed", 0, 1),
        ("interrupted", 1, 1),
    ]
    assert m["segments"][1]["resumed_from"].startswith("ckpt-")
    finished = train(s.replace(epochs=2, export=False), resume="latest")  # its export is not what is checked
    m = manifest(first.run_dir)
    assert finished.status == "completed" and m["epochs_completed"] == 2
    assert m["final_weights_sha256"] == finished.final_weights_sha256 != done["final_weights_sha256"]
    seconds = [g["seconds"] for g in m["segments"]]
    (row,) = list_runs(s.runs_dir)
    assert len(seconds) == 3 and row["duration"] == pytest.approx(sum(seconds)) and row["duration"] > seconds[-1]
    assert (row["epochs"], row["of"]) == (2, 2)


def test_a_forced_model_change_that_fails_leaves_config_and_manifest_as_they_were(one_epoch_copy, capsys):
    from train import train
    from train.errors import CheckpointError
    from train.results.export import rebuild_model

    s, run = one_epoch_copy
    before = _bytes(run, "config.json", "manifest.json", "labels.txt", "metrics.csv")
    with pytest.raises(CheckpointError, match="architecture changed"):
        train(s.replace(model="cnn_bn", epochs=2), resume=run.name, force=True)
    assert _bytes(run, "config.json", "manifest.json", "labels.txt", "metrics.csv") == before
    logged = (run / "train.log").read_text()
    assert "resume not started; its config.json and manifest.json are unchanged" in logged
    assert logged.count("CheckpointError: ") == 1 and "architecture changed" in logged  # the error, once
    assert "architecture changed" not in capsys.readouterr().out  # the console: the caller's (the CLI's line)
    model, _, _ = rebuild_model(run)  # the run is still usable as it was: the cnn
    assert not any("batch_normalization" in v.path for v in model.variables)


@pytest.mark.parametrize("deleted", ["the files", "the folders"])
def test_resume_after_the_checkpoints_were_deleted_is_exit_4_then_restart_is_explicit(
    tmp_path, one_epoch_run, one_epoch_copy, monkeypatch, capsys, deleted
):
    import shutil

    from train import cli

    monkeypatch.chdir(tmp_path)
    flags = fit_flags(tmp_path, one_epoch_run[0], epochs=1, export=False)
    _, run = one_epoch_copy
    if deleted == "the files":
        for p in (run / "checkpoints").iterdir():
            p.unlink()
    else:  # `rm -r checkpoints tensorboard`: the restart writes them again
        shutil.rmtree(run / "checkpoints")
        shutil.rmtree(run / "tensorboard")
    before = _bytes(run, "config.json", "manifest.json")
    capsys.readouterr()
    assert cli.main(flags + ["--resume", run.name, "--epochs", "2"]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"CheckpointError: run {run.name} has no checkpoint") and err.count("\n") == 1
    assert "--restart" in err and _bytes(run, "config.json", "manifest.json") == before
    assert cli.main(flags + ["--resume", run.name, "--restart"]) == 0
    m = manifest(run)
    assert [(g["status"], g["restart"]) for g in m["segments"]] == [("completed", False), ("completed", True)]
    assert m["epochs_completed"] == 1
    assert (run / "checkpoints" / "LATEST").is_file() and any((run / "tensorboard").iterdir())


def test_changed_data_at_the_same_path_is_refused_unless_forced_and_recorded(tmp_path):
    from train import train
    from train.errors import ResumeMismatchError

    s = tiny_settings(tmp_path, epochs=1, export=False)
    run = train(s).run_dir
    old = manifest(run)["data"]["fingerprint"]
    write_tiny_npz(tmp_path, seed=1)  # same path, new contents
    before = _bytes(run, "config.json", "manifest.json")
    with pytest.raises(ResumeMismatchError) as info:
        train(s.replace(epochs=2), resume=run.name)
    assert f"DATA: fingerprint {old[:12]}..." in str(info.value) and "--force" in str(info.value)
    assert _bytes(run, "config.json", "manifest.json") == before
    forced = train(s.replace(epochs=2), resume=run.name, force=True)
    m = manifest(run)
    assert forced.status == "completed"
    assert [g["data_fingerprint"] for g in m["segments"]] == [old, m["data"]["fingerprint"]] and old != m["data"][
        "fingerprint"
    ]
    assert m["segments"][1]["forced_changes"][0].startswith(f"DATA: fingerprint {old[:12]}...")


def test_a_smoke_run_records_the_one_epoch_it_trains_and_says_epochs_is_not_used(tmp_path):
    from train import train
    from train.results.runs_table import format_runs, list_runs

    s = tiny_settings(tmp_path, smoke=True, epochs=5, export=False)
    result = train(s)
    assert result.epochs_completed == 1
    first = (result.run_dir / "train.log").read_text()
    assert (
        first.count("WARNING: EPOCHS=5 is not used: a smoke run trains one epoch (leave SMOKE off to train more)") == 1
    )
    assert manifest(result.run_dir)["segments"][0]["epochs_planned"] == 1
    line = format_runs(list_runs(s.runs_dir)).splitlines()[1]
    assert line.split()[1:3] == ["completed", "1/1"] and line.endswith("(smoke)")
    again = train(s.replace(epochs=6), resume=result.run_dir.name)  # what a larger EPOCHS does: no contradiction
    assert again.epochs_completed == 1
    said = (result.run_dir / "train.log").read_text().removeprefix(first)
    assert "EPOCHS: 5 -> 6 (not used: a smoke run trains one epoch)" in said
    assert "(to train more, start a run without SMOKE: a smoke run trains one epoch)" in said
    assert "is not used" not in said  # said once, by the resume's line


def test_a_second_fit_on_a_run_in_progress_is_refused_and_a_dead_holder_does_not_block(tmp_path, monkeypatch, capsys):
    """The holder and the refused fits are processes of their own (the refusals come before TensorFlow
    loads); the resume after the holder's death, which the test only reads the record of, runs in this one."""
    npz = write_tiny_npz(tmp_path)
    gate = tmp_path / "go"
    flags = fit_flags(tmp_path, npz, epochs=50, export=False, model="gate:dense16")
    first = start_fit(flags, tmp_path, extra_env={"GATE_FILE": str(gate)})
    try:
        # The event: the first run holds its lock and waits in its model factory.
        assert wait_until(lambda: (tmp_path / "go.waiting").exists(), first), output(first)[-3000:]
        run = only_run(tmp_path / "runs")
        before = _bytes(run, "config.json", "manifest.json")
        open_gate = tmp_path / "open"
        open_gate.write_text("go")  # a second fit that got as far as its model would not wait
        for extra in (["--resume", run.name], ["--resume", "auto"]):
            rc, out = run_fit(flags + extra + ["--epochs", "1"], tmp_path, extra_env={"GATE_FILE": str(open_gate)})
            assert rc == 4, out[-3000:]
            assert f"RunBusyError: run {run.name} is in use by another process (pid {first.pid} on host" in out
            assert "Traceback" not in out and out.count("Error") == 1
        assert _bytes(run, "config.json", "manifest.json") == before
        gate.write_text("go")
        assert kill_after_new_checkpoint(first, tmp_path / "runs", 0.0), output(first)[-3000:]  # SIGKILL
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait()
    assert f"pid {first.pid}" in (run / "run.lock").read_text()  # the dead holder's lock file remains
    monkeypatch.setenv("GATE_FILE", str(gate))
    rc, out = fit_here(tmp_path, monkeypatch, capsys, flags + ["--resume", run.name, "--epochs", "1"])
    assert rc == 0, out[-3000:]
    m = manifest(run)
    assert [g["status"] for g in m["segments"]] == ["killed", "completed"]
    assert m["segments"][0]["seconds_estimated"] is True


@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_a_damaged_record_stops_resume_and_auto_with_one_line(
    tmp_path, one_epoch_run, one_epoch_copy, name, monkeypatch, capsys
):
    from train import cli

    monkeypatch.chdir(tmp_path)  # through the CLI's edge in this process: the damage is in a file
    flags = fit_flags(tmp_path, one_epoch_run[0], epochs=1, export=False)
    _, run = one_epoch_copy
    text = (run / name).read_text()
    (run / name).write_text(text[: len(text) // 2])  # truncated
    for extra in (["--resume", run.name], ["--resume", "auto"]):
        capsys.readouterr()
        rc = cli.main(flags + extra)
        out = "".join(capsys.readouterr())
        assert rc == 4, out[-3000:]
        assert f"RunRecordError: run {run.name}: " in out and name in out and "Traceback" not in out
    assert (run / name).read_text() == text[: len(text) // 2]


def test_a_resume_interrupted_during_start_up_leaves_the_record_as_it_was(one_epoch_copy, monkeypatch):
    import os

    from train import train
    from train.setup import devices

    s, run = one_epoch_copy
    before = _bytes(run, "config.json", "manifest.json")
    real_setup = devices.setup_devices

    def signalled_setup(settings, **_probes):
        os.kill(os.getpid(), signal.SIGTERM)  # `docker stop` while the resume starts up
        return real_setup(settings)

    monkeypatch.setattr(devices, "setup_devices", signalled_setup)
    result = train(s.replace(epochs=3), resume=run.name)
    assert result.status == "interrupted"
    assert _bytes(run, "config.json", "manifest.json") == before


def test_a_manifest_damaged_during_the_run_does_not_hide_how_the_run_ended(tmp_path, caplog, monkeypatch):
    import logging

    from helpers import tiny_settings as settings_for

    from train.training import fit

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)

    monkeypatch.setattr(logging.getLogger("train"), "handlers", [])  # no handler left by an earlier test
    run = tmp_path / "20260101-000000-000001"
    (run / "checkpoints").mkdir(parents=True)
    (run / "manifest.json").write_text('{"status": "runn')
    with caplog.at_level("ERROR", logger="train"):
        fit._close(run, run / "manifest.json", settings_for(tmp_path), "failed", "DataError: x", 1.0)
    assert "could not update the manifest" in caplog.text


def test_a_named_run_stopped_resumes_with_the_command_the_stop_prints(tmp_path):
    import re
    import shlex
    import subprocess
    import sys

    from faults import env, states, step_of

    from train.results.runs_table import list_runs

    npz = write_tiny_npz(tmp_path)
    # What a user keeps in .env; the first run adds flags, as `scripts/train --epochs 5 ...` does.
    (tmp_path / ".env").write_text(
        f"DATASET=npz:{npz}\nRUNS_DIR={tmp_path / 'runs'}\nDATA_DIR={tmp_path / 'data'}\nBATCH_SIZE=32\n"
        "CHECKPOINT_EVERY=4\nPRECISION=float32\nPROGRESS=line\nEXPORT=false\nREPORT=off\nPEAK_FLOPS=1e12\n"
    )

    def under_way():
        return any(step_of(s) >= 4 for r in (tmp_path / "runs").glob("*") for s in states(r))

    first = start_fit(["--run-name", "stopme", "--epochs", "5", "--learning-rate", "0.002"], tmp_path)
    try:
        assert wait_until(under_way, first), output(first)[-3000:]
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 75, output(first)[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    told = re.search(r"; to continue it: (.+)$", output(first), re.MULTILINE)
    assert told, output(first)[-3000:]
    command = shlex.split(told.group(1))
    assert command[:4] == [sys.executable, "-m", "train", "fit"] and command[-2] == "--resume", command
    # As a user pastes it, in a shell that does not choose TensorFlow's CPU kernels (the tests' own choice,
    # tests/conftest.py, is left out): the run chooses them, and says so below.
    shell = {k: v for k, v in env().items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    pasted = subprocess.run(command, cwd=tmp_path, env=shell, capture_output=True, text=True, timeout=180)
    out = pasted.stdout + pasted.stderr  # exactly the command the stop printed, as a user pastes it
    assert pasted.returncode == 0, out[-3000:]
    run = only_run(tmp_path / "runs")
    config = json.loads((run / "config.json").read_text())
    assert (config["epochs"], config["run_name"], config["learning_rate"]) == (5, "stopme", 0.002)
    (row,) = list_runs(tmp_path / "runs")
    assert (row["status"], row["epochs"], row["of"]) == ("completed", 5, 5)
    # The log and the manifest name the point resumed from in the same words.
    logged = re.search(r"resuming at (epoch \d+, step \d+)", out)
    assert logged, out[-3000:]
    assert manifest(run)["segments"][-1]["resumed_from"].endswith(f"({logged.group(1)})")
    # A run from the shell chose its CPU kernels before TensorFlow's import: oneDNN's where TensorFlow's
    # default would be Eigen's (an AVX2-only CPU), and the record says which and why.
    import platform

    from train.setup.hardware import onednn_enabled

    if platform.machine() == "x86_64":
        why = "TensorFlow's default" if onednn_enabled({}) else "TF_ENABLE_ONEDNN_OPTS=1, set by the template"
        assert manifest(run)["precision"]["cpu"]["onednn"].startswith(f"on ({why}")
