"""End to end on generated data: every artefact of a run, resume, refusal, export, predict, runs."""

import contextlib
import csv
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
    NO_REAL_MNIST,
    PROJECT_ROOT,
    REAL_MNIST,
    benchmark_script,
    stop_at_check,
    subprocess_env,
    tiny_settings,
)

from train.errors import Interrupted, WorkerLostError

# Marked one by one: a test that trains or starts a process is slow, one of fit's parts alone is not.


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from train import train

    tmp = tmp_path_factory.mktemp("fit")
    settings = tiny_settings(tmp, export=True)
    return settings, train(settings)


@pytest.mark.slow
def test_a_run_leaves_every_artefact(finished):
    settings, result = finished
    d = result.run_dir
    assert result.status == "completed" and result.epochs_completed == 2
    assert json.loads((d / "config.json").read_text())["batch_size"] == 32
    m = json.loads((d / "manifest.json").read_text())
    for key in (
        "tensorflow",
        "keras",
        "python",
        "build_info",
        "gpus",
        "git",
        "requirements_lock",
        "seed",
        "host",
        "started_at",
        "ended_at",
        "precision",
        "final_weights_sha256",
    ):
        assert key in m, key
    assert m["status"] == "completed" and m["seed"] == 42
    assert len(m["data"]["fingerprint"]) == 64
    assert m["precision"]["policy"] == "float32"
    # The CPU the precision was chosen on, as `reproduce` compares it (its family of oneDNN kernels).
    from train.setup.hardware import cpu_family, cpu_flags, cpu_model, onednn_max_isa, onednn_state

    cpu = {"model": cpu_model(), "family": cpu_family(cpu_flags(), onednn_max_isa()), "onednn": onednn_state()}
    assert m["precision"]["cpu"] == cpu
    assert m["export"]["max_abs_diff"] <= 1e-5
    log = (d / "train.log").read_text()
    assert "epoch 2/2:" in log and "export:" in log
    # Validation is VAL_SPLIT of the training data; the test split is evaluated once, at the end.
    assert (m["data"]["n_train"], m["data"]["n_val"], m["data"]["n_test"], m["data"]["val_from"]) == (
        384,
        42,
        128,
        "train",
    )
    assert set(m["test"]["weights"]) == {"best", "final"} and "test (128 examples): accuracy=" in log
    # Benchmark 1 compares the recipe's test accuracy with this, not with the validation split's.
    assert benchmark_script("common").test_accuracy(result) == m["test"]["weights"]["final"]["accuracy"]
    rows = list(csv.DictReader(open(d / "metrics.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert float(rows[-1]["samples_per_second"]) > 0 and rows[-1]["gpu_memory_used_mb"] == ""
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "epoch_seconds"} <= set(rows[0])
    assert list((d / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert (d / "checkpoints" / "LATEST").read_text().strip().endswith(".npz")
    assert (d / "best.weights.h5").is_file() and (d / "final.weights.h5").is_file()
    for name in ("savedmodel/saved_model.pb", "model.keras", "labels.txt"):
        assert (d / "export" / name).exists(), name
    assert not list(d.rglob("*.tmp-*"))
    assert result.history[-1]["val_accuracy"] > 0.5  # the generated task is easy: it learned something


@pytest.mark.slow
def test_savedmodel_serves_raw_uint8_with_plain_tensorflow(finished):
    _, result = finished
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1]); f = m.signatures['serving_default']\n"
        "x = np.zeros((2, 28, 28, 1), np.uint8); x[1, 4:10, 4:10] = 255\n"
        "p = f(images=tf.constant(x))['probabilities'].numpy(); assert p.shape == (2, 4), p.shape\n"
        "assert np.allclose(p.sum(axis=1), 1, atol=1e-5); print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(result.run_dir / "export" / "savedmodel")],
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=""),
        cwd="/",
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.slow
def test_resume_continues_epochs_and_optimizer_steps(one_epoch_copy):
    from faults import optimizer_iterations

    from train import train

    s, run = one_epoch_copy
    steps = optimizer_iterations(run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip())
    assert steps == 12  # 384 examples in batches of 32: the first epoch's, as its checkpoint holds them
    again = train(s.replace(epochs=2), resume=run.name)
    assert again.epochs_completed == 2
    assert int(again.model.optimizer.iterations.numpy()) == 2 * steps
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert len(manifest["resumed_at"]) == 1 and manifest["status"] == "completed"
    assert "restored from checkpoint" in (run / "train.log").read_text()


@pytest.mark.slow
def test_a_resume_keeps_auto_s_precision_where_it_runs_natively_and_says_when_it_cannot(tmp_path, monkeypatch):
    """PRECISION=auto on a resume: the run's own precision, whatever auto would pick now (here a CPU
    whose probe now favours bfloat16); where these devices cannot run it natively, auto picks anew, a
    WARNING says the metrics may step, and each segment's precision is in the manifest."""
    from train import train
    from train.setup import devices
    from train.training import flops

    s = tiny_settings(tmp_path, epochs=1, precision="auto")
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2"})
    first = train(s)
    manifest = first.run_dir / "manifest.json"
    assert json.loads(manifest.read_text())["precision"]["policy"] == "float32"

    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    monkeypatch.setattr(flops, "cached_bf16_speedup", lambda cache: (1.5, "a probe"))  # auto alone: bfloat16
    train(s.replace(epochs=2), resume=first.run_dir.name)
    m = json.loads(manifest.read_text())
    assert m["precision"]["policy"] == "float32"
    assert m["precision"]["reason"] == (
        "the precision this run trained in until now, kept on resume; chosen at its start because: CPU has no native bfloat16 "
        "(no amx_bf16 / avx512_bf16): bf16 would be emulated"
    )
    assert [seg["precision"] for seg in m["segments"]] == ["float32", "float32"]
    assert "WARNING: this run trained in" not in (first.run_dir / "train.log").read_text()

    # Recorded bfloat16 (a run begun on a CPU that has it), resumed on one without: float32, said once.
    m["precision"]["policy"] = "mixed_bfloat16"
    manifest.write_text(json.dumps(m))
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2"})
    train(s.replace(epochs=3), resume=first.run_dir.name)
    m = json.loads(manifest.read_text())
    assert m["precision"]["policy"] == "float32" and m["precision"]["reason"].startswith("CPU has no native")
    assert [seg["precision"] for seg in m["segments"]] == ["float32", "float32", "float32"]
    log = (first.run_dir / "train.log").read_text()
    assert log.count("WARNING: this run trained in mixed_bfloat16 until now, and trains on in float32") == 1

    # Resumed as it is, with every epoch done: nothing is trained, so the record of what trained it stays.
    m["precision"]["policy"] = "mixed_bfloat16"
    manifest.write_text(json.dumps(m))
    train(s.replace(epochs=3), resume=first.run_dir.name)
    m = json.loads(manifest.read_text())
    assert m["precision"]["policy"] == "mixed_bfloat16"
    assert (m["segments"][-1]["precision"], m["segments"][-1]["trains"]) == ("float32", False)
    assert (first.run_dir / "train.log").read_text().count("WARNING: this run trained in") == 1


@pytest.mark.slow
def test_an_early_stopped_run_resumed_as_it_was_trains_nothing_and_says_so_in_its_segment(tmp_path):
    from train import train

    s = tiny_settings(tmp_path, epochs=5, patience=1, min_delta=10.0)  # no epoch improves by 10
    first = train(s)
    assert first.status == "completed" and first.epochs_completed == 2
    config = (first.run_dir / "config.json").read_bytes()
    train(s.replace(learning_rate=0.05), resume=first.run_dir.name, force=True)
    segments = json.loads((first.run_dir / "manifest.json").read_text())["segments"]
    assert [(seg["epoch_from"], seg["trains"]) for seg in segments] == [(0, True), (2, False)]
    # What --force accepted trained nothing: config.json stays what trained the weights (reproduce reruns it).
    assert segments[-1]["forced_changes"] == ["LEARNING_RATE: 0.001 -> 0.05"]
    assert (first.run_dir / "config.json").read_bytes() == config
    train(s, resume=first.run_dir.name)  # and the next resume, as the run was, is not refused


@pytest.mark.slow
def test_a_group_stop_during_the_final_parity_check_leaves_an_interrupted_run_that_a_resume_exports(
    tmp_path, monkeypatch
):
    from train import train
    from train.errors import Interrupted
    from train.results import export

    real = export.subprocess.run
    # SIGTERM to the process group (`timeout`, Ctrl-C) as the parity check runs: its process dies of it.
    monkeypatch.setattr(export.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, -15, "", ""))
    s = tiny_settings(tmp_path, epochs=1, export=True)
    with pytest.raises(Interrupted) as info:
        train(s)
    assert info.value.exit_code == 75 and "does not load" not in str(info.value)
    (run,) = (p for p in (tmp_path / "runs").iterdir() if (p / "manifest.json").is_file())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and not (run / "export").exists(), manifest["status"]
    monkeypatch.setattr(export.subprocess, "run", real)
    again = train(s, resume=run.name)  # all epochs trained: the resume writes the export
    assert again.status == "completed" and (run / "export" / "savedmodel" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_resume_with_other_settings_is_refused_unless_forced(one_epoch_copy):
    from train import train
    from train.errors import ResumeMismatchError

    s, run = one_epoch_copy
    with pytest.raises(ResumeMismatchError) as info:
        train(s.replace(learning_rate=0.01, batch_size=16), resume="latest")
    assert "BATCH_SIZE: 32 -> 16" in str(info.value) and "LEARNING_RATE: 0.001 -> 0.01" in str(info.value)
    forced = train(s.replace(learning_rate=0.01, epochs=2), resume="latest", force=True)
    assert forced.run_dir == run and forced.epochs_completed == 2


@pytest.mark.slow
def test_a_forced_new_batch_size_is_recorded_and_trained_alike(one_epoch_copy):
    """config.json, the manifest and metrics.csv all say the batch size the resumed epochs trained with."""
    from train import train
    from train.digest import sha256_file

    s, run = one_epoch_copy
    train(s.replace(batch_size=16, epochs=2), resume=run.name, force=True)
    config = json.loads((run / "config.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert config["batch_size"] == 16
    assert [d["global_batch"] for d in manifest["distribution"]] == [32, 16]
    assert "BATCH_SIZE: 32 -> 16" in manifest["segments"][-1]["forced_changes"]
    assert [(r["epoch"], r["batch_size"]) for r in rows] == [("1", "32"), ("2", "16")]
    # Each segment records config.json as it wrote it: what the next resume compares the file with.
    first, second = (s["config_sha256"] for s in manifest["segments"])
    assert second == sha256_file(run / "config.json") != first


@pytest.mark.slow
def test_a_run_stopped_inside_an_epoch_is_not_ended_before_it_by_a_lower_epochs(tmp_path, monkeypatch):
    """Resumed with EPOCHS below the epoch it stopped in, it "completed" as nothing to train, its final
    weights those of a part of the next epoch, recorded as the last whole epoch's."""
    from train import train
    from train.errors import ResumeMismatchError

    s = tiny_settings(tmp_path, export=False, steps_per_execution=1)  # 2 epochs of 12 steps
    restore = stop_at_check(monkeypatch, 16)  # in epoch 2
    stopped = train(s)
    restore()
    record = (stopped.run_dir / "manifest.json").read_bytes()
    # RESUME=auto (docker compose's default) takes the run too, EPOCHS being free under a constant rate:
    # a user who meant a new, shorter run is told how to start one.
    for resume in (stopped.run_dir.name, "auto"):
        with pytest.raises(ResumeMismatchError) as info:
            train(s.replace(epochs=1), resume=resume)
        assert re.fullmatch(
            r"EPOCHS=1: this run stopped inside its epoch 2 \(after \d+ of its steps\), so ending it at epoch 1 would "
            r"keep weights of no epoch's end; resume with EPOCHS=2 or more to finish that epoch, or start a new run "
            r"instead \(no --resume, resume=None in train\(\); RESUME= empty where RESUME=auto chose this run\)",
            str(info.value),
        )
    assert (stopped.run_dir / "manifest.json").read_bytes() == record  # nothing of the run changed
    assert train(s, resume=stopped.run_dir.name).status == "completed"


@pytest.mark.slow
def test_stop_mid_epoch_then_resume_is_bit_identical(tmp_path, monkeypatch):
    """In-process version of the guarantee: stop at a step boundary, resume, same final weights."""
    from train import train
    from train.training import stop_flag

    s = tiny_settings(tmp_path, deterministic=True, export=False, checkpoint_every=2)
    straight = train(s)
    calls = {"n": 0}
    original = stop_flag.StopFlag.check

    def stop_at_step_7(self):
        calls["n"] += 1
        if calls["n"] == 7:
            self.request("test stop")
        return original(self)

    monkeypatch.setattr(stop_flag.StopFlag, "check", stop_at_step_7)
    stopped = train(s)
    assert stopped.status == "interrupted"
    monkeypatch.setattr(stop_flag.StopFlag, "check", original)
    resumed = train(s, resume=stopped.run_dir.name)
    assert resumed.status == "completed"
    assert resumed.final_weights_sha256 == straight.final_weights_sha256
    # The resumed epoch's line says its training numbers cover only the steps trained since; the next does not.
    lines = [line for line in (stopped.run_dir / "train.log").read_text().splitlines() if "epoch 1/2: " in line]
    assert len(lines) == 1
    assert re.search(r"\(resumed mid-epoch: loss, train metrics and speed over steps [2-9]-12 only\)$", lines[0])
    assert not [
        line
        for line in (stopped.run_dir / "train.log").read_text().splitlines()
        if "epoch 2/2: " in line and "resumed" in line
    ]


@pytest.mark.slow
def test_export_and_predict_from_the_command_line(finished, tmp_path):
    from PIL import Image

    _, result = finished
    img = np.zeros((28, 28), np.uint8)
    img[4:10, 16:22] = 255  # class 1's square
    Image.fromarray(img).save(tmp_path / "one.png")
    env = subprocess_env()
    runs_dir = str(result.run_dir.parent)
    exp = subprocess.run(
        [sys.executable, "-m", "train", "export", result.run_dir.name, "--runs-dir", runs_dir],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert exp.returncode == 0, exp.stderr[-2000:]
    assert "max |diff|" in exp.stdout
    pred = subprocess.run(
        [sys.executable, "-m", "train", "predict", str(result.run_dir), str(tmp_path / "one.png")],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert pred.returncode == 0, pred.stderr[-2000:]
    fields = pred.stdout.split()
    assert (
        fields[0].endswith("one.png") and fields[1] == "1" and 0.25 < float(fields[2]) <= 1
    )  # above chance (4 classes)
    runs = subprocess.run(
        [sys.executable, "-m", "train", "runs", "--runs-dir", runs_dir],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
    )
    assert runs.returncode == 0 and result.run_dir.name in runs.stdout and "completed" in runs.stdout


@pytest.mark.slow
@pytest.mark.skipif(REAL_MNIST is None, reason=NO_REAL_MNIST)
def test_real_mnist_one_epoch_default_settings(tmp_path):
    """The default workload through the default path (PRECISION=auto, DATA_DIR holding mnist.npz)."""
    from train import train
    from train.config import load_settings

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "mnist.npz").symlink_to(REAL_MNIST.resolve())
    s = load_settings(
        {"epochs": 1, "runs_dir": str(tmp_path / "runs"), "data_dir": str(data_dir), "export": False},
        env_file=None,
        environ={},
    )
    result = train(s)
    assert result.history[-1]["val_accuracy"] >= 0.97
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["data"]["fingerprint"] == "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"
    float32 = manifest["precision"]["policy"] == "float32"  # as the machine's probe decided
    assert manifest["batch"]["batch_size"] == (256 if float32 else 512)


@pytest.mark.slow
def test_resume_auto_continues_an_unfinished_run_and_starts_fresh_after_a_finished_one(tmp_path, monkeypatch):
    from train import train
    from train.training import stop_flag

    s = tiny_settings(tmp_path, epochs=1, export=False, resume="auto")
    original = stop_flag.StopFlag.check
    monkeypatch.setattr(stop_flag.StopFlag, "check", lambda self: self.request("test stop") or original(self))
    stopped = train(s)  # no runs yet: auto starts a new one, which stops at once
    assert stopped.status == "interrupted"
    monkeypatch.setattr(stop_flag.StopFlag, "check", original)
    resumed = train(s)
    assert resumed.run_dir == stopped.run_dir and resumed.status == "completed"
    fresh = train(s)
    assert fresh.run_dir != stopped.run_dir
    other = train(s.replace(learning_rate=0.01))  # settings differ from the newest run: a new run
    assert other.run_dir not in (stopped.run_dir, fresh.run_dir)


@pytest.mark.slow
def test_a_run_that_sets_neither_batch_nor_rate_records_its_machine_s_pair_and_resume_auto_keeps_it(
    tmp_path, monkeypatch
):
    """Neither BATCH_SIZE nor LEARNING_RATE set, in float32 on a CPU: 256 and 0.008, in config.json from
    the start and in the manifest with why; RESUME=auto continues it with neither set. Set: as given."""
    from helpers import tiny_values, write_tiny_npz

    from train import train
    from train.config import load_settings
    from train.setup import devices
    from train.training import stop_flag

    values = tiny_values(tmp_path, write_tiny_npz(tmp_path))
    del values["batch_size"], values["learning_rate"]
    s = load_settings({**values, "epochs": 1, "export": False, "resume": "auto"}, env_file=None, environ={})
    done = train(s)
    assert "batch: 256, learning rate 0.008 (neither was set: " in (done.run_dir / "train.log").read_text()
    original = stop_flag.StopFlag.check
    monkeypatch.setattr(stop_flag.StopFlag, "check", lambda self: self.request("test stop") or original(self))
    stopped = train(s)  # stops before training: its record is written, its log holds the choice
    assert "batch: 256, learning rate 0.008 (neither was set: " in (stopped.run_dir / "train.log").read_text()
    config = json.loads((stopped.run_dir / "config.json").read_text())
    assert (config["batch_size"], config["learning_rate"]) == (256, 0.008)
    chosen = json.loads((stopped.run_dir / "manifest.json").read_text())["batch"]
    assert chosen["reason"].startswith("training in float32 on a CPU") and chosen["batch_size"] == 256
    monkeypatch.setattr(stop_flag.StopFlag, "check", original)
    resumed = train(s)
    assert resumed.run_dir == stopped.run_dir and resumed.status == "completed"
    assert (stopped.run_dir / "train.log").read_text().count("batch: 256") == 1  # the resume chose nothing
    given = train(s.replace(batch_size=64, resume=""))
    assert json.loads((given.run_dir / "config.json").read_text())["learning_rate"] == 0.007  # as before
    assert "batch" not in json.loads((given.run_dir / "manifest.json").read_text())

    def unreadable(*_):
        raise RuntimeError("no driver")

    monkeypatch.setattr(devices, "batch_choice", unreadable)  # then setting the devices up says what is wrong
    fallback = json.loads((train(s.replace(resume="")).run_dir / "manifest.json").read_text())["batch"]
    assert (fallback["batch_size"], fallback["learning_rate"]) == (512, 0.007)
    assert fallback["reason"] == "the defaults, as the devices could not be read (RuntimeError: no driver)"


def test_settings_made_in_code_or_given_either_value_train_with_the_batch_they_hold():
    """A Settings made in code records no given settings: its values are the user's, defaults or not."""
    from train.config import Settings, load_settings
    from train.training.fit import _leaves_batch

    assert not _leaves_batch(Settings())
    assert _leaves_batch(load_settings({}, env_file=None, environ={}))
    for one in ({"batch_size": 512}, {"learning_rate": 0.007}):  # given, even as the defaults: as given
        assert not _leaves_batch(load_settings(one, env_file=None, environ={}))


@pytest.mark.slow
@pytest.mark.parametrize("removed", ["run directory", "RUNS_DIR"])
def test_a_run_whose_directory_is_removed_while_it_trains_stops_with_one_line_exit_7(tmp_path, removed):
    import shutil

    from builders import write_tiny_npz
    from faults import fit_flags, output, start_fit, states, step_of, wait_until

    runs = tmp_path / "runs"
    proc = start_fit(fit_flags(tmp_path, write_tiny_npz(tmp_path), epochs=50, export=False), tmp_path)
    try:
        # The event: training is under way (the state of global step 8 exists).
        assert wait_until(lambda: any(step_of(s) >= 8 for r in runs.glob("2*") for s in states(r)), proc)
        (run,) = runs.glob("2*")
        victim = run if removed == "run directory" else runs
        victim.rename(tmp_path / "trash")  # gone from its path at once, as `rm -rf` ends
        shutil.rmtree(tmp_path / "trash", ignore_errors=True)
        assert proc.wait(timeout=600) == 7, output(proc)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = output(proc)
    assert "Traceback" not in out
    assert out.strip().splitlines()[-1] == (
        f"StorageError: cannot write {run}: the run directory was removed (or replaced) while the run was going, so "
        "nothing more of it can be saved and it cannot be resumed; start a new run, and keep RUNS_DIR out of "
        "clean-up jobs while runs train"
    )
    assert not run.exists()  # nothing wrote a new, partial run folder in its place


@pytest.mark.parametrize("in_a_bucket", [False, True])
def test_a_killed_segment_ends_at_its_last_sign_of_life_not_when_its_files_arrived_here(tmp_path, in_a_bucket):
    """Locally the newest state's write time; in a bucket (whose files here are downloads, written
    now) the last renewal of the lease taken over from the killed process."""
    import os
    import types

    from train.training import fit

    run_dir = tmp_path / "20260101-000000-000001"
    (run_dir / "checkpoints").mkdir(parents=True)
    state = run_dir / "checkpoints" / "ckpt-000000004.npz"
    state.write_bytes(b"a state")  # downloaded just now, in a bucket
    os.utime(state, (1_700_000_100.0, 1_700_000_100.0))  # written then, locally
    lease = types.SimpleNamespace(taken_from=1_700_000_300.0) if in_a_bucket else None
    plan = types.SimpleNamespace(run_dir=run_dir, lock=types.SimpleNamespace(lease=lease))
    if in_a_bucket:
        os.utime(state)
    assert fit._last_sign_of_life(plan) == (1_700_000_300.0 if in_a_bucket else 1_700_000_100.0)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"image_size": 32, "channels": 3},
            ["WARNING: IMAGE_SIZE=32 is not used: it applies to DATASET=images:<dir> only"],
        ),
        ({"image_size": 32, "channels": 1}, ["WARNING: IMAGE_SIZE=32", "WARNING: CHANNELS=1"]),
        ({"image_size": 64}, []),  # the default, as a reproduce rerun gives it: nothing to say
        ({"cache": "file"}, ["WARNING: CACHE=file is not used: it applies to DATASET=images:<dir> only; mnist holds"]),
        ({"cache": "file", "dataset": "images:{tmp}"}, []),
        ({"image_size": 32, "dataset": "images:{tmp}"}, []),
        ({"smoke": True, "epochs": 5}, ["WARNING: EPOCHS=5 is not used: a smoke run trains one epoch"]),
        ({"smoke": True, "epochs": 3}, []),  # the default, as a reproduce rerun of a smoke run gives it
    ],
)
def test_a_setting_given_to_a_new_run_that_does_not_act_is_one_warning(tmp_path, caplog, values, said):
    from train.config import load_settings
    from train.training.fit import _warn_unused

    values = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in values.items()}
    with caplog.at_level("WARNING", logger="train"):
        _warn_unused(load_settings(values, env_file=None, environ={}))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == len(said) and all(w.startswith(s) for w, s in zip(warnings, said))


class _Worker:
    """The workers extra's `start` as fit finds it: `join` answers what a worker's start gives."""

    def __init__(self, answer):
        self.answer, self.joined = answer, []

    def join(self, settings, stop, epochs):
        self.joined.append((settings, stop, epochs))
        return self.answer


def _with_workers(monkeypatch, answer):
    from train import extras
    from train.training import fit

    worker, part = _Worker(answer), extras.part
    monkeypatch.setattr(
        fit.extras, "part", lambda extra, name: worker if (extra, name) == ("workers", "start") else part(extra, name)
    )
    return worker


class _Refused(Exception):
    pass


def _spy_plan_run(monkeypatch):
    """fit's plan_run replaced: what it was given, then a refusal (nothing of a run is made)."""
    from train.training import fit

    seen = {}

    def plan_run(settings, resume, force, restart, choose):
        seen.update(settings=settings, resume=resume, force=force, restart=restart, choose=choose)
        raise _Refused

    logging_calls = []
    setup_logging = fit.setup_logging
    monkeypatch.setattr(fit, "plan_run", plan_run)
    monkeypatch.setattr(fit, "setup_logging", lambda *a, **kw: (logging_calls.append((a, kw)), setup_logging(*a, **kw)))
    seen["logging"] = logging_calls
    return seen


def test_a_worker_that_trained_along_with_the_chief_returns_its_own_result_and_plans_nothing(tmp_path, monkeypatch):
    from train.training import fit
    from train.training.loop import Result

    done = Result(None, "completed", 3)
    worker = _with_workers(monkeypatch, done)
    seen = _spy_plan_run(monkeypatch)
    settings = tiny_settings(tmp_path, epochs=3)
    assert fit.fit(settings) is done
    ((given, stop, epochs),) = worker.joined
    assert given is settings and epochs == 3 and stop.__class__.__name__ == "StopFlag"
    assert "settings" not in seen and not seen["logging"]  # no plan, no held lines


def test_the_chief_plans_with_its_own_invocation_s_settings_and_holds_its_lines_prefixed(tmp_path, monkeypatch):
    from dataclasses import fields

    from builders import write_tiny_npz
    from helpers import tiny_values

    from train.config import Settings, as_given, given, load_settings
    from train.training import fit

    _with_workers(monkeypatch, object())  # the chief's joined device set-up
    seen = _spy_plan_run(monkeypatch)
    values = {
        k: v
        for k, v in tiny_values(tmp_path, write_tiny_npz(tmp_path)).items()
        if k not in ("batch_size", "learning_rate")
    }
    settings = load_settings({**values, "resume": "RUN-1"}, env_file=None, environ={})
    with pytest.raises(_Refused):
        fit.fit(settings, force=True, restart=True)
    assert seen["settings"] == as_given(settings) and given(seen["settings"]) == {f.name for f in fields(Settings)}
    # Every worker keeps the defaults (each loads its own settings): no choice of the batch.
    assert (seen["resume"], seen["force"], seen["restart"], seen["choose"]) == ("RUN-1", True, True, None)
    assert seen["logging"] == [((None,), {"prefix": "[worker 0] ", "hold": True})]


def test_one_process_plans_with_the_arguments_given_and_lets_the_machine_choose_an_unset_batch(tmp_path, monkeypatch):
    import dataclasses

    from builders import write_tiny_npz
    from helpers import tiny_values

    from train.config import load_settings
    from train.setup import devices
    from train.training import fit, flops

    seen = _spy_plan_run(monkeypatch)
    # A template without the workers extra (a fork may delete it): one process, nothing joined.
    part = fit.extras.part
    monkeypatch.setattr(fit.extras, "part", lambda extra, name: None if extra == "workers" else part(extra, name))
    probes = []
    monkeypatch.setattr(flops, "bf16_probe", lambda runs_dir: probes.append(runs_dir) or f"probe of {runs_dir}")
    asked = []
    monkeypatch.setattr(
        devices, "batch_choice", lambda s, probe: asked.append(s) or (64, 0.002, f"chosen with the {probe}")
    )
    values = {
        k: v
        for k, v in tiny_values(tmp_path, write_tiny_npz(tmp_path)).items()
        if k not in ("batch_size", "learning_rate")
    }
    settings = load_settings(values, env_file=None, environ={})
    with pytest.raises(_Refused):
        fit.fit(settings, resume="RUN-2", force=False, restart=True)
    assert probes == [settings.runs_dir]
    assert (seen["settings"], seen["resume"], seen["force"], seen["restart"]) == (settings, "RUN-2", False, True)
    assert seen["logging"] == [((None,), {"prefix": "", "hold": True})]
    chosen, record = seen["choose"](settings)
    assert asked == [settings]
    assert (chosen.batch_size, chosen.learning_rate) == (64, 0.002)
    assert record == {
        "batch_size": 64,
        "learning_rate": 0.002,
        "reason": f"chosen with the probe of {settings.runs_dir}",
    }
    # Given either value, or made in code: the settings' own pair, no choice.
    for other in (
        load_settings({**values, "batch_size": 32}, env_file=None, environ={}),
        dataclasses.replace(settings, seed=1),
    ):
        with pytest.raises(_Refused):
            fit.fit(other)
        assert seen["choose"] is None and (seen["resume"], seen["force"], seen["restart"]) == ("", False, False)


def test_a_new_run_and_its_resume_record_their_segments_data_split_and_labels(tmp_path, monkeypatch):
    """One epoch, then a resume to two, each with fit alone (no report, no export): what each start
    writes into manifest.json, config.json and labels.txt, and says in its log."""
    from builders import write_tiny_npz
    from helpers import tiny_values

    from train.config import load_settings
    from train.digest import sha256_file
    from train.setup import devices
    from train.training import fit

    monkeypatch.setattr(devices, "batch_choice", lambda s, probe: (32, 0.001, "the test's choice"))
    values = tiny_values(tmp_path, write_tiny_npz(tmp_path))
    values = {k: v for k, v in values.items() if k not in ("batch_size", "learning_rate")}
    first = fit.fit(load_settings({**values, "epochs": 1}, env_file=None, environ={}))
    run = first.run_dir
    assert first.status == "completed" and first.epochs_completed == 1
    m = json.loads((run / "manifest.json").read_text())
    assert m["run_id"] == run.name
    assert m["batch"] == {"batch_size": 32, "learning_rate": 0.001, "reason": "the test's choice"}
    (segment,) = m["segments"]
    assert (segment["epochs_planned"], segment["epoch_from"], segment["smoke"], segment["restart"]) == (
        1,
        0,
        False,
        False,
    )
    assert (segment["resumed_from"], segment["forced_changes"], segment["trains"]) == (None, [], True)
    assert segment["config_sha256"] == sha256_file(run / "config.json")
    assert segment["precision"] == "float32" and segment["data_fingerprint"] == m["data"]["fingerprint"]
    assert m["precision"]["policy"] == "float32" and m["precision"]["reason"] and m["precision"]["cpu"]
    assert {k: v for k, v in m["data"].items() if k != "fingerprint"} == {
        "dataset": values["dataset"],
        "source": values["dataset"][4:],
        "n_train": 384,
        "n_val": 42,
        "n_test": 128,
        "val_from": "train",
        "val_split": 0.1,
        "input_shape": [28, 28, 1],
        "class_names": ["0", "1", "2", "3"],
    }
    assert (run / "labels.txt").read_text().split() == m["data"]["class_names"]
    split = {"workers": 1, "worker_index": 0, "replicas": 1, "global_batch": 32, "per_replica_batch": 32}
    assert m["distribution"] == [{**split, "from_global_step": 0}]
    said = (run / "train.log").read_text().splitlines()
    assert [line for line in said if line.endswith(f" run {run.name}: {run}")]
    assert [
        line for line in said if line.endswith(" batch: 32, learning rate 0.001 (neither was set: the test's choice)")
    ]
    assert said[-1].endswith(f" run {run.name} ended: completed")
    logged = len(said)

    again = fit.fit(load_settings({**values, "epochs": 2}, env_file=None, environ={}), resume=run.name)
    assert again.run_dir == run and again.status == "completed" and again.epochs_completed == 2
    m = json.loads((run / "manifest.json").read_text())
    first_segment, segment = m["segments"]
    assert first_segment["status"] == "completed" and first_segment["epoch_to"] == 1
    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    assert segment["resumed_from"].startswith("ckpt-") and segment["resumed_from"].endswith(" (epoch 2, step 0)")
    assert (segment["epochs_planned"], segment["epoch_from"], segment["epoch_to"], segment["trains"]) == (2, 1, 2, True)
    assert segment["forced_changes"] == [] and segment["restart"] is False and segment["smoke"] is False
    assert segment["config_sha256"] == sha256_file(run / "config.json")
    assert json.loads((run / "config.json").read_text())["epochs"] == 2
    assert m["distribution"] == [{**split, "from_global_step": 0}, {**split, "from_global_step": 12}]
    assert m["epochs_completed"] == 2 and latest != segment["resumed_from"].split()[0]
    said = (run / "train.log").read_text().splitlines()[logged:]
    assert [line for line in said if line.endswith(f" run {run.name}: resuming {run}")]
    assert said[-1].endswith(f" run {run.name} ended: completed")
    assert not [line for line in said if " batch: " in line or " resuming with " in line]


class _Told:
    """A callback that keeps what fit told it at the end of a run."""

    def __init__(self):
        self.ended, self.closed = [], []

    def on_end(self, status, stop):
        self.ended.append((status, stop))

    def on_close(self, stop, error):
        self.closed.append((stop, error))


@pytest.mark.parametrize(
    ("raised", "status", "error"),
    [
        (ValueError("boom"), "failed", "ValueError: boom"),
        (KeyboardInterrupt(), "interrupted", "KeyboardInterrupt: "),
        (WorkerLostError("worker 1 is gone"), "interrupted", "WorkerLostError: worker 1 is gone"),
        (Interrupted("stopped in the export"), "interrupted", "Interrupted: stopped in the export"),
    ],
)
def test_a_run_that_fails_or_is_stopped_records_how_it_ended_and_tells_its_callbacks(
    tmp_path, monkeypatch, raised, status, error
):
    from train.training import fit

    monkeypatch.setattr(fit, "_run", lambda *args: (_ for _ in ()).throw(raised))
    told = _Told()
    with pytest.raises(type(raised)) as caught:
        fit.fit(tiny_settings(tmp_path), callbacks=[told])
    assert caught.value is raised
    (run,) = (tmp_path / "runs").glob("2*")
    m = json.loads((run / "manifest.json").read_text())
    (segment,) = m["segments"]
    assert (m["status"], m["error"], segment["status"], segment["error"]) == (status, error, status, error)
    assert 0 <= segment["seconds"] < 600  # this segment's own time
    (ended,) = told.ended
    ((stop, closed),) = told.closed
    assert ended == (status, stop) and closed == error
    lines = (run / "train.log").read_text().splitlines()
    # A failure's error is in train.log (the console prints it once, as the command's last line).
    assert [line for line in lines if line.endswith(f" {error}")] == ([lines[-2]] if status == "failed" else [])
    last = f" run {run.name} ended: {status}"
    if status == "interrupted":
        last += f"; to continue it: python -m train fit --resume {run.name}"
    assert lines[-1].endswith(last)


def _removed(run):
    run.rename(run.with_name("trash"))


@pytest.mark.parametrize("then", ["returns", "raises", "raises it gone"])
def test_a_run_whose_directory_is_removed_says_so_whatever_failed_first(tmp_path, monkeypatch, capsys, then):
    from train.errors import StorageError
    from train.training import fit
    from train.training.loop import Result

    failed = OSError(2, "No such file or directory")

    def run_and_remove(plan, *args):
        _removed(plan.run_dir)
        if then == "returns":
            return Result(plan.run_dir, "completed", 2)
        raise fit._gone(plan.run_dir) if then == "raises it gone" else failed

    monkeypatch.setattr(fit, "_run", run_and_remove)
    told = _Told()
    with pytest.raises(StorageError) as caught:
        fit.fit(tiny_settings(tmp_path), callbacks=[told])
    (run,) = (tmp_path / "runs").glob("trash")
    run = run.with_name(json.loads((run / "manifest.json").read_text())["run_id"])
    assert str(caught.value) == (
        f"cannot write {run}: the run directory was removed (or replaced) while the run was going, so nothing "
        "more of it can be saved and it cannot be resumed; start a new run, and keep RUNS_DIR out of clean-up "
        "jobs while runs train"
    )
    assert caught.value.run_dir_gone is True
    assert caught.value.__cause__ is (failed if then == "raises" else None)
    assert not told.ended  # nothing recorded: no report, no extras' ends
    ((_, error),) = told.closed
    assert error == f"StorageError: {caught.value}"
    out = capsys.readouterr().out.splitlines()
    said = f" run {run.name} ended: failed (its directory is gone, so nothing of it was recorded)"
    assert [line for line in out if line.endswith(said)]
    # The manifest in the removed folder is as the run started: nothing wrote to it after.
    assert json.loads((run.with_name("trash") / "manifest.json").read_text())["status"] == "running"


@pytest.fixture
def said():
    """The messages fit logs from now on (whatever handlers a run in this process left on "train")."""
    import logging

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    logger, lines = logging.getLogger("train"), Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    yield lines.lines
    logger.removeHandler(lines)
    logger.setLevel(level)


class _Group:
    def __init__(self):
        self.names = []

    def share_name(self, name):
        self.names.append(name)


@pytest.mark.parametrize("chief", [False, True])
def test_a_run_s_log_opens_naming_the_run_where_it_is_and_the_temp_files_a_kill_left(tmp_path, monkeypatch, chief):
    import types

    from train.run.train_log import close_logging
    from train.training import fit

    run_dir = tmp_path / "runs" / "20260101-000000-000001"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "ckpt-000000004.npz.tmp-123").write_bytes(b"half a state")
    (run_dir / "metrics.csv.tmp-9").write_text("half a row")
    setup = types.SimpleNamespace(group=_Group()) if chief else None
    remote = types.SimpleNamespace(url="s3://bucket/runs") if chief else None
    monkeypatch.setattr(fit, "for_run", lambda path: remote if path == run_dir else pytest.fail(str(path)))
    try:
        fit._open_log(types.SimpleNamespace(run_dir=run_dir, resumed=chief), setup)
    finally:
        close_logging()
    assert not list(run_dir.rglob("*.tmp-*"))
    lines = [line.split(" ", 2)[2] for line in (run_dir / "train.log").read_text().splitlines()]
    prefix = "[worker 0] " if chief else ""
    where = f"resuming s3://bucket/runs/{run_dir.name} (staged in {run_dir})" if chief else str(run_dir)
    assert lines[0] == f"{prefix}run {run_dir.name}: {where}"
    assert sorted(lines[1:]) == [
        f"{prefix}removed a temp file left by an interrupted write: {name}"
        for name in ("ckpt-000000004.npz.tmp-123", "metrics.csv.tmp-9")
    ]
    if chief:
        assert setup.group.names == [run_dir.name]  # every worker logs the chief's run id


@pytest.mark.parametrize(
    ("status", "continued"),
    [
        ("completed", ""),
        ("failed", ""),
        ("interrupted", "; to continue it: resume R-1"),
        (
            "budget",
            "; to continue it: resume R-1 (for another 2.5 minutes: MAX_MINUTES counts from each start; set another, "
            "or 0 for no limit)",
        ),
    ],
)
def test_a_stopped_run_s_last_words_give_the_command_that_continues_it(tmp_path, status, continued):
    import types

    from train.training import fit

    plan = types.SimpleNamespace(settings=types.SimpleNamespace(max_minutes=2.5), run_dir=tmp_path / "R-1")
    assert fit._continued(plan, status, lambda name: f"resume {name}") == continued


@pytest.mark.parametrize(
    ("status", "error", "line"),
    [
        ("failed", "ValueError: bad", "run R-1: resume not started; its config.json and manifest.json are unchanged"),
        ("failed", None, "run R-1: resume not started (failed); its config.json and manifest.json are unchanged"),
        (
            "interrupted",
            "KeyboardInterrupt: ",
            "run R-1: resume not started (interrupted); its config.json and manifest.json are unchanged; go on",
        ),
    ],
)
def test_a_resume_that_failed_before_it_changed_the_record_says_it_left_it_unchanged(
    tmp_path, said, status, error, line
):
    from train.training import fit

    fit._not_started(tmp_path / "R-1", status, error, "; go on" if status == "interrupted" else "")
    assert said == [line]


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), ValueError("bad")])
def test_a_resume_refused_before_its_record_changed_ends_with_the_line_that_says_so(
    tmp_path, monkeypatch, said, raised
):
    from train.training import fit

    first = tiny_settings(tmp_path)
    monkeypatch.setattr(fit, "_run", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        fit.fit(first)
    (run,) = (tmp_path / "runs").glob("2*")
    before = (run / "manifest.json").read_bytes(), (run / "config.json").read_bytes()
    monkeypatch.setattr(fit, "_run", lambda *args: (_ for _ in ()).throw(raised))
    said.clear()
    with pytest.raises(type(raised)):
        fit.fit(first, resume=run.name)
    unchanged = "its config.json and manifest.json are unchanged"
    # A failure's error has a line of its own (the console's last): this one does not repeat it.
    assert said[-1] == (
        f"run {run.name}: resume not started (interrupted); {unchanged}; to continue it: python -m train fit --resume {run.name}"
        if isinstance(raised, KeyboardInterrupt)
        else f"run {run.name}: resume not started; {unchanged}"
    )
    assert ((run / "manifest.json").read_bytes(), (run / "config.json").read_bytes()) == before


def test_devices_that_cannot_be_read_leave_the_batch_pair_at_its_defaults_and_say_why(tmp_path, monkeypatch):
    from train.setup import devices
    from train.training import fit

    def unreadable(settings, probe):
        raise RuntimeError(f"no driver for {probe}: " + "x" * 300 + "\nand a page of details")

    monkeypatch.setattr(devices, "batch_choice", unreadable)
    settings = tiny_settings(tmp_path, batch_size=48, learning_rate=0.004)
    chosen, record = fit._choose_batch(settings, "the probe")
    assert chosen == settings
    # The first line whole, however long: the manifest keeps why.
    why = "the defaults, as the devices could not be read (RuntimeError: no driver for the probe: " + "x" * 300 + ")"
    assert record == {"batch_size": 48, "learning_rate": 0.004, "reason": why}


@pytest.mark.parametrize(
    ("resumed", "restart", "recorded", "kept"),
    [
        (True, False, {"policy": "mixed_bfloat16", "reason": "faster here"}, ("mixed_bfloat16", "faster here")),
        (True, False, {"policy": "float32", "reason": ""}, ("float32", "no reason recorded")),
        (True, False, {"policy": "float32", "reason": 3}, ("float32", "no reason recorded")),
        (True, False, {"policy": "float32"}, ("float32", "no reason recorded")),
        (True, False, {"policy": 16, "reason": "r"}, None),
        (True, False, "float32", None),
        (True, True, {"policy": "float32", "reason": "r"}, None),  # a restart chooses anew
        (False, False, {"policy": "float32", "reason": "r"}, None),
    ],
)
def test_a_resume_keeps_the_precision_its_manifest_records_with_its_reason(resumed, restart, recorded, kept, said):
    import types

    from train.training import fit

    plan = types.SimpleNamespace(manifest={"precision": recorded}, resumed=resumed, restart=restart)
    assert fit._recorded_precision(plan) == kept
    setup = types.SimpleNamespace(precision="float32", precision_reason="the CPU has no bfloat16")
    fit._warn_precision_change(plan, setup)
    changed = kept is not None and kept[0] != "float32"
    assert said == (
        [
            "WARNING: this run trained in mixed_bfloat16 until now, and trains on in float32 (the CPU has no "
            "bfloat16): its metrics may step here; each segment's precision is in manifest.json"
        ]
        if changed
        else []
    )


def test_training_starts_from_the_newest_state_in_the_batch_size_config_json_gives(tmp_path, said):
    import types

    from train.training import fit
    from train.training.loop import LoopState

    settings = tiny_settings(tmp_path, batch_size=32)
    new = types.SimpleNamespace(settings=settings, saved_config=None)
    assert fit._starting_state(new, None) == LoopState(batch_size=32)
    meta = {"epoch": 1, "step": 3, "global_step": 15, "best": 0.5, "batch_halvings": 1, "variables": ["w"]}
    saved = types.SimpleNamespace(meta={**meta, "batch_size": 16})
    # An unchanged BATCH_SIZE keeps the checkpoint's, which AUTO_BATCH may have halved.
    kept = types.SimpleNamespace(settings=settings, saved_config={"batch_size": 32})
    assert fit._starting_state(kept, saved) == LoopState(1, 3, 15, 0.5, 16, 1)
    # A header without batch_size was trained with the recorded BATCH_SIZE; a config.json without one, with this run's.
    assert fit._starting_state(kept, types.SimpleNamespace(meta=meta)).batch_size == 32
    assert fit._starting_state(types.SimpleNamespace(settings=settings, saved_config={}), saved).batch_size == 16
    assert said == []
    forced = types.SimpleNamespace(settings=settings, saved_config={"batch_size": 16})
    state = fit._starting_state(forced, types.SimpleNamespace(meta={**meta, "step": 4}))
    assert state == LoopState(1, 2, 15, 0.5, 32, 0)
    assert said == ["BATCH_SIZE 16 -> 32 (--force): step 4 of epoch 2 in batches of 16 is step 2 in batches of 32"]


@pytest.mark.parametrize(("resumed", "before"), [(True, 2), (True, 1), (False, 2)])
def test_a_resume_on_another_worker_count_says_so_and_the_state_takes_the_new_count(resumed, before, said):
    from train.training import fit
    from train.training.loop import LoopState

    state = LoopState(batch_size=64, workers=before)
    fit._adopt_worker_count(state, resumed, 1)
    assert state.workers == 1
    told = resumed and before != 1
    assert said == (
        ["resuming with 1 worker(s); the saved state was trained by 2 (same global batch 64)"] if told else []
    )


@pytest.mark.parametrize("found", ["a list", "no list", "no manifest"])
def test_each_start_appends_how_it_splits_the_batch_to_the_manifest_s_distribution(tmp_path, said, found):
    import types

    from train.run.files import read_json, write_json
    from train.training import fit
    from train.training.loop import LoopState

    path = tmp_path / "manifest.json"
    earlier = {"workers": 1, "from_global_step": 0}
    if found != "no manifest":
        write_json(path, {"run_id": "R", "distribution": [earlier] if found == "a list" else {"workers": 1}})
    setup = types.SimpleNamespace(workers=2, worker_index=0, replicas=4)
    fit._record_distribution(path, setup, LoopState(global_step=30, batch_size=64))
    now = {
        "workers": 2,
        "worker_index": 0,
        "replicas": 4,
        "global_batch": 64,
        "per_replica_batch": 16,
        "from_global_step": 30,
    }
    assert read_json(path)["distribution"] == ([earlier, now] if found == "a list" else [now])
    assert type(read_json(path)["distribution"][-1]["per_replica_batch"]) is int  # 16, not 16.0
    assert said == [
        "distribution: 2 worker(s), this is worker 0, 4 replica(s) in sync, global batch 64, 16 per replica"
    ]


def test_a_manifest_that_cannot_be_closed_is_one_error_line_not_an_exception(tmp_path, said):
    from train.training import fit

    run = tmp_path / "R"
    (run / "manifest.json").mkdir(parents=True)  # a folder where the file was
    fit._close(run, run / "manifest.json", tiny_settings(tmp_path), "completed", None, 3.0)
    (line,) = said
    assert line.startswith("could not update the manifest: ") and "manifest.json" in line, line


def test_a_closed_segment_records_the_newest_state_s_epoch_and_best(tmp_path):
    from train.run.files import read_json, write_json
    from train.training import fit

    run = tmp_path / "R"
    (run / "checkpoints").mkdir(parents=True)
    meta = json.dumps({"epoch": 3, "step": 0, "best": 0.25}).encode()
    np.savez(run / "checkpoints" / "ckpt-000000036.npz", __meta__=np.frombuffer(meta, np.uint8))
    write_json(run / "manifest.json", {"run_id": "R", "status": "running", "segments": [{"status": "running"}]})
    settings = tiny_settings(tmp_path, monitor="val_loss")
    fit._close(run, run / "manifest.json", settings, "interrupted", "KeyboardInterrupt: ", 4.5)
    m = read_json(run / "manifest.json")
    assert (m["status"], m["error"], m["epochs_completed"], m["duration_seconds"]) == (
        "interrupted",
        "KeyboardInterrupt: ",
        3,
        4.5,
    )
    assert m["best"] == {"monitor": "val_loss", "value": 0.25}
    assert m["segments"][0]["epoch_to"] == 3


class _Plan:
    """What plan_run gives fit: here a run found in another RUNS_DIR, which it then releases."""

    def __init__(self, settings):
        self.settings, self.batch, self.released = settings, None, 0

    def release(self):
        self.released += 1


@pytest.mark.parametrize("elsewhere", [False, True])
def test_fit_hands_the_plan_its_callbacks_and_the_probe_of_the_run_s_own_runs_dir_to_the_training(
    tmp_path, monkeypatch, elsewhere
):
    from train.training import fit, flops

    settings = tiny_settings(tmp_path)
    found = settings.replace(runs_dir=str(tmp_path / "other")) if elsewhere else settings
    plan, probes, handed = _Plan(found), [], []
    monkeypatch.setattr(fit, "plan_run", lambda *args: plan)
    monkeypatch.setattr(flops, "bf16_probe", lambda runs_dir: probes.append(runs_dir) or f"probe of {runs_dir}")
    monkeypatch.setattr(fit, "_train", lambda *args: handed.append(args) or "the result")
    mine, own = object(), object()
    parts = []
    assert fit.fit(settings, force=True, callbacks=[mine], parts=lambda s: parts.append(s) or [own]) == "the result"
    assert probes == ([settings.runs_dir, found.runs_dir] if elsewhere else [settings.runs_dir])
    ((given, force, stop, setup, calls, continue_with, probe),) = handed
    assert (given, force, setup, probe) == (plan, True, None, f"probe of {found.runs_dir}")
    assert stop.__class__.__name__ == "StopFlag" and continue_with("R") == "python -m train fit --resume R"
    assert parts == [found] and calls.items[0] is own and calls.items[-1] is mine
    assert plan.released == 1
    handed.clear()
    fit.fit(settings)  # no parts: the callbacks given alone (no extras are on)
    assert handed[0][1] is False and handed[0][4].items == []


def test_a_runs_dir_in_a_store_brings_the_run_to_resume_before_it_is_planned(tmp_path, monkeypatch):
    import types

    from train.training import fit

    seen = _spy_plan_run(monkeypatch)
    brought, opened = [], []
    store = types.SimpleNamespace(bring=brought.append)
    monkeypatch.setattr(fit, "open_runs_dir", lambda s: opened.append(s) or store)
    settings = tiny_settings(tmp_path)
    with pytest.raises(_Refused):
        fit.fit(settings, resume="RUN-3")
    assert opened == [settings] and brought == ["RUN-3"] and seen["resume"] == "RUN-3"
    with pytest.raises(_Refused):
        fit.fit(settings)  # a new run: nothing to bring
    assert brought == ["RUN-3"]


class _ChiefGroup(_Group):
    def __init__(self):
        super().__init__()
        self.entered = []

    @contextlib.contextmanager
    def errors(self):
        self.entered.append("in")
        yield
        self.entered.append("out")


def test_the_chief_of_several_workers_names_its_run_to_them_and_trains_inside_the_group_s_errors(tmp_path, monkeypatch):
    import types

    from train.training import fit
    from train.training.loop import Result

    setup = types.SimpleNamespace(group=_ChiefGroup())
    _with_workers(monkeypatch, setup)
    trained = []

    def run(plan, force, manifest_path, stop, given, calls, probe):
        trained.append((force, given, probe, list(setup.group.entered)))
        return Result(plan.run_dir, "completed", 1)

    monkeypatch.setattr(fit, "_run", run)
    monkeypatch.setattr(fit.flops, "bf16_probe", lambda runs_dir: "the probe")
    result = fit.fit(tiny_settings(tmp_path, smoke=True, epochs=5), force=True)
    assert trained == [(True, setup, "the probe", ["in"])] and setup.group.entered == ["in", "out"]
    assert setup.group.names == [result.run_dir.name]
    lines = (result.run_dir / "train.log").read_text().splitlines()
    assert lines and all(line.split(" ", 2)[2].startswith("[worker 0] ") for line in lines)
    (segment,) = json.loads((result.run_dir / "manifest.json").read_text())["segments"]
    assert (segment["smoke"], segment["epochs_planned"]) == (True, 1)  # a smoke run trains one epoch


class _Devices:
    precision, precision_reason = "float32", "the test's"

    def describe(self):
        return "devices: the test's"


def test_the_devices_get_the_probe_and_a_resume_s_precision_and_only_a_new_run_warns_of_unused_settings(
    tmp_path, monkeypatch, said
):
    from train.run.files import read_json, write_json
    from train.setup import devices
    from train.training import fit

    set_up = []
    monkeypatch.setattr(fit.flops, "bf16_probe", lambda runs_dir: "the probe")
    monkeypatch.setattr(devices, "setup_devices", lambda s, **kw: set_up.append((s, kw)) or _Devices())
    monkeypatch.setattr(fit.checkpoints, "load_latest", lambda path: (_ for _ in ()).throw(_Refused()))
    settings = tiny_settings(tmp_path, image_size=32)
    with pytest.raises(_Refused):
        fit.fit(settings)
    (run,) = (tmp_path / "runs").glob("2*")
    ((given, kw),) = set_up
    assert given.to_dict() == settings.to_dict() and kw == {"bf16_speedup": "the probe", "kept": None}
    assert "devices: the test's" in said
    warned = [line for line in said if line.startswith("WARNING: IMAGE_SIZE=32 is not used")]
    assert len(warned) == 1

    # A resume: the precision its manifest records is the one to keep; its settings were checked when it started.
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "ckpt-000000012.npz").write_bytes(b"a state")  # load_latest never reads it here
    write_json(
        run / "manifest.json", {**read_json(run / "manifest.json"), "precision": {"policy": "float32", "reason": "r"}}
    )
    said.clear()
    with pytest.raises(_Refused):
        fit.fit(settings, resume=run.name)
    assert set_up[1][1] == {"bf16_speedup": "the probe", "kept": ("float32", "r")}
    assert not [line for line in said if line.startswith("WARNING: IMAGE_SIZE")]


def test_a_stop_while_the_model_factory_runs_ends_the_run_before_training_as_resumable(tmp_path, monkeypatch, said):
    from train.errors import ModelInterrupted
    from train.training import fit

    def stopped_in_the_factory(settings, run_dir, spec, setup, state, epochs, stop, **kw):
        stop.request("a test stop")
        raise ModelInterrupted("my_models:build", "SIGTERM")

    monkeypatch.setattr(fit, "start_loop", stopped_in_the_factory)
    result = fit.fit(tiny_settings(tmp_path))
    assert (result.status, result.epochs_completed) == ("interrupted", 0)
    m = json.loads((result.run_dir / "manifest.json").read_text())
    ended = "stopped before training started (a test stop)"
    assert m["status"] == "interrupted" and m["ended_because"] == f"{ended}: resumable"
    assert f"{ended}: nothing new to save" in said


def _fake_loop(monkeypatch, trains):
    """fit's start_loop replaced: the record written as a loop writes it (`trains` in turn), no model."""
    import types

    from train.training import fit
    from train.training.loop import Result

    restored = []

    def start_loop(settings, run_dir, spec, setup, state, epochs, stop, **kw):
        assert state.workers == 1  # one process trains on, whoever trained before
        assert kw["chief"] is True
        restored.append(kw["loaded"])
        kw["record"](trains.pop(0))
        loop = types.SimpleNamespace()
        # The loop tells the callbacks of each epoch and the end: fit hands them over.
        loop.run = lambda: Result(run_dir, "completed", epochs, history=list(loop.callbacks.items))
        return loop

    monkeypatch.setattr(fit, "start_loop", start_loop)
    return restored


def test_a_resume_s_segment_says_where_it_resumed_what_was_forced_and_ends_a_killed_one_at_its_last_state(
    tmp_path, monkeypatch, said
):
    import datetime
    import os
    import types

    from train.digest import sha256_file
    from train.run.files import read_json, write_json
    from train.training import fit

    restored = _fake_loop(monkeypatch, [True, False, True])
    settings = tiny_settings(tmp_path, val_from="test")
    run = fit.fit(settings).run_dir
    m = read_json(run / "manifest.json")
    assert (m["data"]["val_from"], m["data"]["val_split"]) == ("test", None)  # validated on the test split
    config = sha256_file(run / "config.json")
    # Killed after its state of global step 15 (epoch 2, step 3) was written.
    state = run / "checkpoints" / "ckpt-000000015.npz"
    state.parent.mkdir(exist_ok=True)
    state.write_bytes(b"a state")
    os.utime(state, (1_700_000_100, 1_700_000_100))
    m["status"] = "running"
    m["segments"][-1].update(status="running", ended_at=None, seconds=None)
    write_json(run / "manifest.json", m)
    meta = {"epoch": 1, "step": 3, "global_step": 15, "batch_size": 32, "workers": 2}  # trained by two workers
    loaded = types.SimpleNamespace(meta=meta, path=state)
    monkeypatch.setattr(fit.checkpoints, "load_latest", lambda path: loaded)
    # Forced to another SEED, with nothing left to train: config.json stays what trained the weights.
    fit.fit(tiny_settings(tmp_path, val_from="test", seed=7), resume=run.name, force=True)
    assert "resuming with 1 worker(s); the saved state was trained by 2 (same global batch 32)" in said
    assert restored == [None, loaded]  # the loop restores the newest state
    killed, resumed = read_json(run / "manifest.json")["segments"]
    ended = datetime.datetime.fromtimestamp(1_700_000_100, datetime.timezone.utc).isoformat(timespec="seconds")
    assert (killed["status"], killed["ended_at"]) == ("killed", ended)
    assert resumed["resumed_from"] == "ckpt-000000015.npz (epoch 2, step 3)"
    assert (resumed["epoch_from"], resumed["epochs_planned"], resumed["restart"], resumed["trains"]) == (
        1,
        2,
        False,
        False,
    )
    assert resumed["forced_changes"] and all("SEED" in change for change in resumed["forced_changes"])
    assert sha256_file(run / "config.json") == resumed["config_sha256"] == config
    # A restart (its states are gone) trains from the first epoch again: no state loaded, none to resume from.
    state.unlink()
    monkeypatch.setattr(fit.checkpoints, "load_latest", lambda path: pytest.fail("a restart loads no state"))
    # Here as a smoke run (forced): the segment says so, and that it trains one epoch.
    fit.fit(tiny_settings(tmp_path, val_from="test", smoke=True), resume=run.name, restart=True, force=True)
    restarted = read_json(run / "manifest.json")["segments"][-1]
    assert (restarted["resumed_from"], restarted["epoch_from"], restarted["restart"], restarted["trains"]) == (
        None,
        0,
        True,
        True,
    )
    assert (restarted["smoke"], restarted["epochs_planned"]) == (True, 1)


class _ChiefSetup:
    """The chief's device set-up once the cluster is joined: two workers, a replica each."""

    precision, precision_reason, cpu = "float32", "the test's", {"model": "test"}
    workers, worker_index, replicas = 2, 0, 1

    def __init__(self):
        self.group = _ChiefGroup()
        self.group.sent = []
        self.group.send_state = lambda spec, state, resumed: self.group.sent.append((spec.name, state.epoch, resumed))

    def describe(self):
        return "devices: two workers (test)"


@pytest.mark.parametrize("stopped", [False, True])
def test_the_chief_trains_on_through_a_stop_at_start_up_and_sends_the_workers_its_state(tmp_path, monkeypatch, stopped):
    """Several workers stop together, in the loop: a stop during start-up does not end the chief's run
    before it (the other workers would wait for it), and the loop's stop says it finishes a call of steps."""
    import types

    from train.training import fit
    from train.training.loop import Result
    from train.training.stop_flag import TRAINING

    setup = _ChiefSetup()
    worker = _with_workers(monkeypatch, setup)
    if stopped:  # a stop requested while the devices are described, before the data is loaded
        setup.describe = lambda: worker.joined[0][1].request("a test stop") or "devices: two workers (test)"
    seen = []

    def start_loop(settings, run_dir, spec, given, state, epochs, stop, **kw):
        seen.append((given, state.workers, stop.then, stop.check(), kw["chief"], kw["loaded"]))
        kw["record"](True)
        return types.SimpleNamespace(run=lambda: Result(run_dir, "completed", epochs))

    monkeypatch.setattr(fit, "start_loop", start_loop)
    settings = tiny_settings(tmp_path)
    result = fit.fit(settings)
    assert result.status == "completed"
    assert seen == [(setup, 2, TRAINING, stopped, True, None)]
    assert setup.group.sent == [(settings.dataset, 0, False)]
    (now,) = json.loads((result.run_dir / "manifest.json").read_text())["distribution"]
    assert (now["workers"], now["global_batch"], now["per_replica_batch"]) == (2, 32, 32)


def test_a_stop_while_the_chief_s_model_factory_runs_is_raised_for_the_workers_to_stop_together(tmp_path, monkeypatch):
    from train.errors import ModelInterrupted
    from train.training import fit

    _with_workers(monkeypatch, _ChiefSetup())
    factory = ModelInterrupted("my_models:build", "SIGTERM")
    monkeypatch.setattr(fit, "start_loop", lambda *args, **kw: (_ for _ in ()).throw(factory))
    with pytest.raises(ModelInterrupted) as caught:
        fit.fit(tiny_settings(tmp_path))
    assert caught.value is factory


def test_a_run_from_a_checkout_with_uncommitted_changes_warns_once(said):
    from train.training import fit

    fit._warn_dirty({"git": {"dirty": False, "commit": "0123456789abcdef"}})
    assert said == []
    fit._warn_dirty({"git": {"dirty": True, "commit": "0123456789abcdef"}})
    assert said == [
        "WARNING: the checkout has uncommitted changes on top of commit 0123456789ab: this run's code is in no "
        "commit (reproduce refuses it without --allow-dirty); commit, then train"
    ]


@pytest.mark.parametrize("during", ["the callbacks' start", "the device set-up", "the data's load"])
def test_a_stop_during_start_up_ends_the_run_at_the_next_check_before_anything_more_starts(
    tmp_path, monkeypatch, said, during
):
    import os
    import signal

    from train.inputs import pipeline
    from train.setup import devices
    from train.training import fit

    done, load_data = [], pipeline.load_data

    def stop_in(step, then):
        def call(*args, **kw):
            done.append(step)
            if step == during:
                os.kill(os.getpid(), signal.SIGTERM)  # fit's handler makes it a stop request
            return then(*args, **kw)

        return call

    class Started:
        on_start = staticmethod(stop_in("the callbacks' start", lambda run_dir: None))

    monkeypatch.setattr(devices, "setup_devices", stop_in("the device set-up", lambda s, **kw: _Devices()))
    monkeypatch.setattr(pipeline, "load_data", stop_in("the data's load", load_data))
    monkeypatch.setattr(fit, "start_loop", lambda *args, **kw: pytest.fail("no loop after a stop"))
    result = fit.fit(tiny_settings(tmp_path), callbacks=[Started()])
    steps = ["the callbacks' start", "the device set-up", "the data's load"]
    assert done == steps[: steps.index(during) + 1]
    assert (result.status, result.epochs_completed) == ("interrupted", 0)
    m = json.loads((result.run_dir / "manifest.json").read_text())
    assert m["ended_because"] == "stopped before training started (received SIGTERM): resumable"
    assert "stopped before training started (received SIGTERM): nothing new to save" in said


def test_a_resume_on_changed_data_is_refused_naming_its_source_unless_forced(tmp_path, monkeypatch):
    from builders import write_tiny_npz

    from train.errors import ResumeMismatchError
    from train.training import fit

    _fake_loop(monkeypatch, [True, True])
    settings = tiny_settings(tmp_path)
    run = fit.fit(settings).run_dir
    npz = write_tiny_npz(tmp_path, seed=1)  # new contents at the same path
    assert settings.dataset == f"npz:{npz}"
    with pytest.raises(ResumeMismatchError, match=rf"\({re.escape(str(npz))}\)\): the same path holds new contents"):
        fit.fit(settings, resume=run.name)
    began = []

    class Begun:
        def on_train_begin(self, run_dir):
            began.append(run_dir)

    told = Begun()
    assert fit.fit(settings, resume=run.name, force=True, callbacks=[told]).history == [told]
    assert began == [run]
    (change,) = json.loads((run / "manifest.json").read_text())["segments"][-1]["forced_changes"]
    assert change.startswith("DATA: fingerprint ") and change.endswith(f"... ({npz})")


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        (
            {"image_size": 32, "channels": 1, "cache": "file"},
            [
                "WARNING: IMAGE_SIZE=32 is not used: it applies to DATASET=images:<dir> only; mnist keeps its own "
                "images' size",
                "WARNING: CHANNELS=1 is not used: it applies to DATASET=images:<dir> only; mnist keeps its own "
                "images' size",
                "WARNING: CACHE=file is not used: it applies to DATASET=images:<dir> only; mnist holds its arrays in "
                "memory",
            ],
        ),
        (
            {"smoke": True, "epochs": 5},
            ["WARNING: EPOCHS=5 is not used: a smoke run trains one epoch (leave SMOKE off to train more)"],
        ),
        ({"smoke": True, "epochs": 1}, []),  # what a smoke run trains anyway
        ({"smoke": False, "epochs": 5}, []),
    ],
)
def test_each_unused_setting_s_warning_whole(said, values, warned):
    from train.config import load_settings
    from train.training import fit

    fit._warn_unused(load_settings(values, env_file=None, environ={}))
    assert said == warned
