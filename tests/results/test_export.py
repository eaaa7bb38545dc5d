"""export: a failed parity check raises ExportError and leaves the previous export/ untouched.

The real fresh-process parity check (a second TensorFlow start) is covered end to end in training/test_fit.py;
here it is faked so the file stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import keras
import numpy as np
import pytest
from builders import write_run
from helpers import exec_in_process, first_fast, tiny_image_model

from train.errors import ExportError, Interrupted, NoWeightsError, RunRecordError, StorageError
from train.models import build_model
from train.results import export
from train.run.files import TMP_MARK, read_json


def _tiny_model():
    return tiny_image_model()


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "20260101-000000-aaaa"
    (run / "export").mkdir(parents=True)
    (run / "export" / "labels.txt").write_text("old\n")
    (run / "manifest.json").write_text(json.dumps({"status": "completed"}))
    return run


@pytest.mark.parametrize("rejected_before", [None, "file"])
def test_parity_failure_raises_and_keeps_the_previous_export(run_dir, monkeypatch, rejected_before):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 1e-3)
    rejected = run_dir / "export.rejected"  # kept for inspection (one only), named in the message
    if rejected_before:  # a file of that name is the user's: left as it is, and the line says why nothing is kept
        rejected.write_text("notes\n")
    with pytest.raises(ExportError, match="differs from the trained model by 0.001") as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 8 and "\n" not in str(info.value)
    assert [p.name for p in (run_dir / "export").iterdir()] == ["labels.txt"]
    assert (run_dir / "export" / "labels.txt").read_text() == "old\n"
    assert "export" not in read_json(run_dir / "manifest.json")
    assert not [p for p in run_dir.iterdir() if TMP_MARK in p.name]
    if rejected_before:
        assert f"the files are not kept: {rejected} is a file, not a folder; move it aside" in str(info.value)
        assert rejected.read_text() == "notes\n"
        return
    assert f"the files are left in {rejected} for inspection" in str(info.value)
    assert json.loads((rejected / "parity.json").read_text())["max_abs_diff"] == 1e-3


def test_passing_parity_replaces_the_export_and_records_it(run_dir, monkeypatch, caplog):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 0.0)
    (run_dir / "export" / "README.md").write_text("mine\n")  # added by hand: kept, and said
    (run_dir / "export" / "notes").mkdir()
    (run_dir / "export" / "notes" / "a.txt").write_text("a\n")
    os.mkfifo(run_dir / "export" / "pipe")  # no file to copy: left out, and said
    os.mkfifo(run_dir / "export" / "notes" / "pipe")
    with caplog.at_level(logging.INFO, logger="train"):
        report = export.export_model(_tiny_model(), run_dir, ["a", "b"])
    final = run_dir / "export"
    assert (final / "README.md").read_text() == "mine\n" and (final / "notes" / "a.txt").read_text() == "a\n"
    assert "note: export: kept README.md, notes, which export does not write, from the previous export" in caplog.text
    assert "left out pipe (a named pipe), notes/pipe (a named pipe) of the previous export" in caplog.text
    assert not (final / "notes" / "pipe").exists()
    assert sorted(p.name for p in final.iterdir()) == [
        "README.md",
        "labels.txt",
        "model.keras",
        "notes",
        "parity.json",
        "savedmodel",
        "source.json",
    ]
    assert (final / "labels.txt").read_text() == "a\nb\n"
    assert read_json(run_dir / "manifest.json")["export"] == report
    assert not any(TMP_MARK in p.name for p in run_dir.iterdir())


def test_a_writer_failure_removes_the_staging_directory(run_dir, monkeypatch):
    def boom(model, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "write_savedmodel", boom)
    with pytest.raises(StorageError, match="disk is full") as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert str(run_dir / "export") in str(info.value) and info.value.exit_code == 7
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]


@pytest.mark.parametrize("kind, says", [("file", "is a file"), ("link", "is a link to")])
def test_an_export_path_that_is_a_file_or_a_link_is_refused_and_left_as_it_was(
    run_dir, tmp_path, monkeypatch, kind, says
):
    monkeypatch.setattr(export, "check_parity", lambda *a: 0.0)
    final = run_dir / "export"
    shutil.rmtree(final)
    if kind == "file":
        final.write_text("notes\n")
    else:  # a serving folder elsewhere, linked: the export would replace the link, not fill the folder
        (tmp_path / "serving").mkdir()
        final.symlink_to(tmp_path / "serving")
    with pytest.raises(ExportError, match=says) as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 8 and str(final) in str(info.value)
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    assert final.is_symlink() if kind == "link" else final.read_text() == "notes\n"


def test_parity_batch_is_fixed_uint8():
    a, b = export._parity_batch((6, 6, 1)), export._parity_batch((6, 6, 1))
    assert a.dtype == np.uint8 and a.shape == (export.PARITY_BATCH, 6, 6, 1)
    np.testing.assert_array_equal(a, b)


def _failed_run(tmp_path):
    from train.config import Settings

    manifest = {"status": "failed", "error": "DataError: x_train is empty"}
    return write_run(tmp_path / "runs" / "20260101-000000-000001", Settings().to_dict(), manifest)


def test_rebuild_needs_weights_then_data(tmp_path):
    run = _failed_run(tmp_path)
    with pytest.raises(NoWeightsError) as info:
        export.rebuild_model(run)
    assert "has no weights" in str(info.value) and "its status: failed: DataError: x_train is empty" in str(info.value)
    assert f"--resume {run.name}" in str(info.value) and info.value.exit_code == 4
    build_model("cnn", (28, 28, 1), 2).save_weights(run / "final.weights.h5")
    with pytest.raises(RunRecordError, match="no data description"):
        export.rebuild_model(run)


@pytest.mark.parametrize("command", ["export", "predict"])
def test_export_and_predict_of_a_run_without_weights_say_so_in_one_line(tmp_path, capsys, command):
    from train import cli

    run = _failed_run(tmp_path)
    argv = [command, run.name, *(["x.png"] if command == "predict" else []), "--runs-dir", str(run.parent)]
    assert cli.main(argv) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"NoWeightsError: run {run.name} has no weights") and err.count("\n") == 1


@pytest.mark.parametrize("command", ["export", "predict"])
@pytest.mark.parametrize("name", ["config.json", "manifest.json"])
def test_export_and_predict_of_a_damaged_record_are_one_line_exit_4(tmp_path, capsys, command, name):
    from train import cli

    run = _failed_run(tmp_path)
    build_model("cnn", (28, 28, 1), 2).save_weights(run / "best.weights.h5")
    (run / name).write_text('{"truncat')
    argv = [command, run.name, *(["x.png"] if command == "predict" else []), "--runs-dir", str(run.parent)]
    assert cli.main(argv) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"RunRecordError: run {run.name}: ") and name in err and err.count("\n") == 1


def test_export_of_a_run_in_use_is_refused_naming_the_holder(tmp_path, capsys):
    from train import cli
    from train.run.lock import RunLock

    run = _failed_run(tmp_path)
    with RunLock(run):
        assert cli.main(["export", run.name, "--runs-dir", str(run.parent)]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"RunBusyError: run {run.name} is in use by another process (pid ")
    assert err.rstrip().endswith("then export again")  # not "then resume": the user was exporting


def test_float32_copy_keeps_weights_and_leaves_the_policy(monkeypatch, tmp_path):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        from train.models import build_model

        model = build_model("cnn", (28, 28, 1), 3)
        copy = export.float32_copy(model, "cnn")
        assert copy is not model and copy.dtype_policy.name == "float32"
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        for a, b in zip(model.get_weights(), copy.get_weights()):
            np.testing.assert_array_equal(a, b)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    # A float32 model is copied too, without its optimizer: the run's learning-rate schedule is
    # this package's own class, and a model.keras holding it would not load anywhere else.
    from train.models import build_model
    from train.training.schedules import OverTraining

    model32 = build_model("cnn", (28, 28, 1), 3)
    model32.compile(optimizer=keras.optimizers.Adam(OverTraining(1e-3, 2, 5)), loss="sparse_categorical_crossentropy")
    copy32 = export.float32_copy(model32, "cnn")
    assert copy32 is not model32 and getattr(copy32, "optimizer", None) is None
    for a, b in zip(model32.get_weights(), copy32.get_weights()):
        np.testing.assert_array_equal(a, b)
    copy32.save(tmp_path / "model.keras")
    assert keras.models.load_model(tmp_path / "model.keras").count_params() == model32.count_params()


@pytest.fixture
def reload_in_process(monkeypatch):
    """Run the fresh-process reload script in this process (same code, no second TensorFlow start)."""
    import subprocess
    import sys

    def run(cmd, **kw):
        assert cmd[:2] == [sys.executable, "-c"] and "tensorflow" in cmd[2] and "train" not in cmd[2]
        env = kw.pop("env")
        assert kw == {"capture_output": True, "text": True, "timeout": 600} and env["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert {k: v for k, v in env.items() if k != "TF_CPP_MIN_LOG_LEVEL"} == {
            k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"
        }  # the rest of the environment as is
        exec_in_process(cmd, monkeypatch)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(export.subprocess, "run", run)


def test_check_parity_measures_the_difference_to_the_savedmodel(tmp_path, reload_in_process):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(6, 6, 1), name="image")
    x = keras.layers.Dropout(0.5)(keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))  # dropout: inference mode matters
    export.write_savedmodel(model, tmp_path / "savedmodel")
    assert export.check_parity(model, tmp_path / "savedmodel", tmp_path) <= export.TOLERANCE
    x = export._parity_batch((6, 6, 1)).astype(np.float32)
    other = keras.models.clone_model(model)
    rng = np.random.default_rng(0)
    other.set_weights([w + rng.normal(0, 0.01, w.shape).astype(w.dtype) for w in model.get_weights()])
    expected = np.max(np.abs(np.asarray(other(x)) - np.asarray(model(x))))
    assert expected > 1e-3
    assert export.check_parity(other, tmp_path / "savedmodel", tmp_path) == pytest.approx(expected, rel=1e-3)


def test_a_savedmodel_that_does_not_load_is_an_export_error(tmp_path, monkeypatch):
    import subprocess

    stderr = iter(["Traceback (most recent call last):\n  File x\nOSError: SavedModel file does not exist\n", "", None])

    def run(cmd, **kw):
        if (err := next(stderr)) is None:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(export.subprocess, "run", run)
    for last_line in ("OSError: SavedModel file does not exist", "no output", "no answer within 600 s"):
        with pytest.raises(ExportError) as info:
            export.check_parity(_tiny_model(), tmp_path / "savedmodel", tmp_path)
        assert (
            str(info.value)
            == f"the SavedModel at {tmp_path / 'savedmodel'} does not load in a fresh process: {last_line}"
        )


@pytest.mark.parametrize("signum", [15, 2])
def test_a_parity_process_ended_by_the_group_stop_is_an_interruption_not_a_savedmodel_that_does_not_load(
    tmp_path, monkeypatch, signum
):
    import signal
    import subprocess

    # Ctrl-C or `timeout` signal the whole group: the parity check's process dies of it too.
    monkeypatch.setattr(export.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, -signum, "", ""))
    with pytest.raises(Interrupted) as info:
        export.check_parity(_tiny_model(), tmp_path / "savedmodel", tmp_path)
    assert info.value.exit_code == 75 and f"stopped by {signal.Signals(signum).name}" in str(info.value)
    assert "does not load" not in str(info.value)


@pytest.fixture
def trained_run(tmp_path):
    """A run directory as training leaves it, with best.weights.h5 from other weights than `model`."""
    from train.config import Settings
    from train.models import build_model

    run = tmp_path / "20260101-000000-bbbb"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings(model="cnn").to_dict()))
    (run / "manifest.json").write_text(json.dumps({"data": {"input_shape": [12, 12, 1], "class_names": ["a", "b"]}}))
    (run / "labels.txt").write_text("a\nb\n")
    keras.utils.set_random_seed(1)
    best = build_model("cnn", (12, 12, 1), 2)
    best.save_weights(run / "best.weights.h5")
    keras.utils.set_random_seed(2)
    return run, best, build_model("cnn", (12, 12, 1), 2)


def _exported(monkeypatch, run):
    seen = []

    def export_model(model, run_dir, labels, source, *formats):
        assert run_dir == run
        seen.append((model, labels))
        return {}

    monkeypatch.setattr(export, "export_model", export_model)
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    return seen


def test_export_run_exports_the_best_weights_not_the_model_in_memory(trained_run, monkeypatch, caplog):
    run, best, in_memory = trained_run
    seen = _exported(monkeypatch, run)
    with caplog.at_level(logging.INFO, logger="train"):
        export.export_run(run, model=in_memory)
    ((model, labels),) = seen
    assert model is not in_memory and labels == ["a", "b"]
    assert any(m.startswith("export: from best.weights.h5 (epoch None, sha256 ") for m in caplog.messages)
    for got, want, last in zip(model.get_weights(), best.get_weights(), in_memory.get_weights()):
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, last) or got.ndim == 1  # biases start at zero in both


@pytest.mark.parametrize("dataset", ["images:{}/moved-images", "npz:{}/moved.npz"])
def test_a_run_whose_data_moved_is_exported_from_its_weights_alone(trained_run, monkeypatch, tmp_path, dataset):
    from train.config import Settings

    run, best, _ = trained_run
    moved = Settings(model="cnn", dataset=dataset.format(tmp_path)).to_dict()  # written while it existed
    (run / "config.json").write_text(json.dumps(moved))
    seen = _exported(monkeypatch, run)
    export.export_run(run)  # a SavedModel needs the model and its weights, not the training data
    ((model, labels),) = seen
    assert labels == ["a", "b"]
    np.testing.assert_array_equal(model.get_weights()[0], best.get_weights()[0])


def test_export_run_without_best_weights_exports_a_float32_copy_of_the_model_in_memory(
    trained_run, monkeypatch, caplog
):
    from train.models import build_model

    run, _, _ = trained_run
    (run / "best.weights.h5").unlink()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        in_memory = build_model("cnn", (12, 12, 1), 2)  # trained in mixed precision: the copy is rebuilt by MODEL
    finally:
        keras.mixed_precision.set_global_policy(previous)
    seen = _exported(monkeypatch, run)
    with caplog.at_level(logging.INFO, logger="train"):
        export.export_run(run, model=in_memory)
    ((model, labels),) = seen
    assert labels == ["a", "b"] and model.dtype_policy.name == "float32"
    for got, want in zip(model.get_weights(), in_memory.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert "export: from the trained model" in caplog.messages


def test_export_model_serves_raw_images_and_records_what_it_wrote(
    run_dir, reload_in_process, capsys, monkeypatch, caplog
):
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = _tiny_model()
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="train"):
        report = export.export_model(model, run_dir, ["cat", "dog"])  # the real parity check, in this process
    final = run_dir / "export"
    diff = report["max_abs_diff"]
    assert report == {
        "savedmodel": str(final / "savedmodel"),
        "keras": str(final / "model.keras"),
        "labels": str(final / "labels.txt"),
        "max_abs_diff": diff,
        "tolerance": export.TOLERANCE,
        "source": {"file": None, "epoch": None, "sha256": None},
    }
    assert 0 <= diff <= export.TOLERANCE and read_json(run_dir / "manifest.json")["export"] == report
    assert read_json(final / "parity.json") == {"max_abs_diff": diff, "tolerance": export.TOLERANCE}
    assert f"export: {final} (fresh-process parity: max |diff| {diff:.2e})" in caplog.messages
    assert capsys.readouterr().out == ""  # no summary printed by the exporter
    loaded = tf.saved_model.load(str(final / "savedmodel"))
    assert hasattr(loaded, "serving_default")  # the endpoint by name, as well as the default signature
    serving = loaded.signatures["serving_default"]
    x = export._parity_batch((6, 6, 1))
    out = serving(images=tf.constant(x))
    assert list(out) == ["probabilities"] and out["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(out["probabilities"].numpy(), model(x.astype(np.float32)), atol=export.TOLERANCE)


def test_a_difference_of_exactly_the_tolerance_passes(run_dir, monkeypatch):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: export.TOLERANCE)
    assert export.export_model(_tiny_model(), run_dir, ["a", "b"])["max_abs_diff"] == export.TOLERANCE


def test_a_storage_failure_after_writing_removes_the_staging_directory(run_dir, monkeypatch):
    def full(model, path, work):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "check_parity", full)
    with pytest.raises(StorageError, match="disk is full"):
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    assert (run_dir / "export" / "labels.txt").read_text() == "old\n"


def test_the_parity_batch_spans_every_pixel_value():
    x = export._parity_batch((16, 16, 1))
    assert x.min() == 0 and x.max() == 255


def test_a_run_without_weights_or_status_is_said_to_have_the_status_unknown(tmp_path):
    run = _failed_run(tmp_path)
    (run / "manifest.json").write_text("{}")
    with pytest.raises(NoWeightsError) as info:
        export.rebuild_model(run)
    assert "its status: unknown) because" in str(info.value)


@pytest.mark.parametrize("command", ["export", pytest.param("serve", marks=pytest.mark.extra("serve"))])
def test_a_run_whose_weights_were_deleted_after_epochs_finished_is_not_said_to_have_finished_none(
    tmp_path, capsys, command
):
    from train import cli
    from train.config import Settings

    manifest = {"status": "completed", "epochs_completed": 3}
    run = write_run(tmp_path / "runs" / "20260101-000000-000002", Settings().to_dict(), manifest)
    assert cli.main([command, run.name, "--runs-dir", str(run.parent), "--env-file", ""]) == 4
    err = capsys.readouterr().err
    assert "no epoch finished" not in err and err.count("\n") == 1, err
    assert err.rstrip().endswith(
        "although 3 epoch(s) finished: the files were moved or deleted; put them back, or if its checkpoints are "
        f"there, `python -m train --resume {run.name} --runs-dir {run.parent}` writes final.weights.h5 from the last one"
    )


def test_any_other_failure_removes_the_staging_directory_and_propagates(run_dir, monkeypatch):
    def bug(model, path):
        raise ValueError("not a storage problem")

    monkeypatch.setattr(export, "write_savedmodel", bug)
    with pytest.raises(ValueError, match="not a storage problem"):
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]


@pytest.mark.parametrize("best", [True, False])
def test_export_takes_the_class_names_from_the_manifest_not_from_labels_txt(trained_run, monkeypatch, best):
    """The manifest is the one source; labels.txt is only a copy for people (both export paths)."""
    run, _, in_memory = trained_run
    (run / "labels.txt").write_text("stale\ncopy\n")
    if not best:
        (run / "best.weights.h5").unlink()
    seen = _exported(monkeypatch, run)
    export.export_run(run, model=in_memory)
    ((_, labels),) = seen
    assert labels == ["a", "b"]


# -- damaged weights, full disks, signals: a failed export never replaces the one in place --------
@pytest.fixture
def recorded_run(tmp_path):
    """A finished run as `fit` now leaves it: best and final weights with their sha256 recorded."""
    from train.config import Settings
    from train.run.weights import save_weights

    run = tmp_path / "runs" / "20260101-000000-000003"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(Settings(model="cnn").to_dict()))
    (run / "manifest.json").write_text(json.dumps({"data": {"input_shape": [12, 12, 1], "class_names": ["a", "b"]}}))
    keras.utils.set_random_seed(3)
    model = build_model("cnn", (12, 12, 1), 2)
    save_weights(model, run / "best.weights.h5", epoch=1)
    save_weights(model, run / "final.weights.h5", epoch=2)
    return run


def _tree(path):
    """Every file under `path` with its bytes: to show an export is exactly as it was."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _old_export(run):
    old = run / "export"
    (old / "savedmodel").mkdir(parents=True, exist_ok=True)
    (old / "savedmodel" / "saved_model.pb").write_bytes(b"the previous export")
    (old / "labels.txt").write_text("old\n")
    return _tree(old)


def _flip_kernel_bits(path):
    """Bit rot inside a kernel of an HDF5 weights file: the file still loads, the values are NaN."""
    import h5py

    with h5py.File(path, "r") as f:
        kernels = []
        f.visititems(lambda n, o: kernels.append(o) if isinstance(o, h5py.Dataset) and o.ndim >= 2 else None)
        head = kernels[-1]  # the last layer's kernel: NaN there reaches every probability
        offset, size = head.id.get_offset(), head.size
    data = bytearray(path.read_bytes())
    data[offset : offset + 4 * size] = np.full(size, np.nan, np.float32).tobytes()
    path.write_bytes(bytes(data))


def test_export_of_bit_rotted_best_weights_is_refused_naming_both_hashes(recorded_run, capsys):
    from train import cli
    from train.run.weights import records, sha256_file

    before = _old_export(recorded_run)
    best = recorded_run / "best.weights.h5"
    _flip_kernel_bits(best)
    assert cli.main(["export", recorded_run.name, "--runs-dir", str(recorded_run.parent)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("WeightsError: ") and err.count("\n") == 1
    assert str(best) in err and sha256_file(best) in err and records(recorded_run)[best.name]["sha256"] in err
    assert "final.weights.h5 (epoch 2), which is intact" in err
    assert _tree(recorded_run / "export") == before


def test_nan_outputs_fail_parity_and_the_previous_export_stays(recorded_run, reload_in_process):
    """A run written before hashes were kept: bit rot is only seen as NaN, which must not pass."""
    before = _old_export(recorded_run)
    manifest = read_json(recorded_run / "manifest.json")
    del manifest["weights"]
    (recorded_run / "manifest.json").write_text(json.dumps(manifest))
    _flip_kernel_bits(recorded_run / "best.weights.h5")
    with pytest.raises(ExportError, match="gives NaN/inf probabilities on the parity batch") as info:
        export.export_run(recorded_run)
    assert info.value.exit_code == 8
    assert _tree(recorded_run / "export") == before
    assert (recorded_run / "export.rejected" / "savedmodel").is_dir()  # named in the message, for inspection
    assert not [p for p in recorded_run.iterdir() if TMP_MARK in p.name]


def test_an_export_records_the_weights_it_came_from_and_its_files(recorded_run, reload_in_process):
    from train.run.weights import records, sha256_file

    report = export.export_run(recorded_run)
    recorded = records(recorded_run)["best.weights.h5"]
    source = read_json(recorded_run / "export" / "source.json")
    assert source["weights"] == {"file": "best.weights.h5", "epoch": 1, "sha256": recorded["sha256"]}
    assert report["source"] == source["weights"] == read_json(recorded_run / "manifest.json")["export"]["source"]
    files = source["files"]
    assert "savedmodel/saved_model.pb" in files and "model.keras" in files and "source.json" not in files
    assert all(sha256_file(recorded_run / "export" / rel) == digest for rel, digest in files.items())


def _no_space(*_args, **_kw):
    import tensorflow as tf

    raise tf.errors.ResourceExhaustedError(
        None, None, "/runs/x/export.tmp-1/savedmodel/variables/variables.index; No space left on device"
    )


def _quota(*_args, **_kw):
    raise OSError(122, "Disk quota exceeded")


def _hdf5_full(*_args, **_kw):
    raise OSError("Can't write data (file write failed: errno = 28, error message = 'No space left on device')")


@pytest.mark.parametrize(
    "where, fail, says",
    [
        ("write_savedmodel", _no_space, "the disk is full"),
        ("write_savedmodel", _quota, "the disk quota is exceeded"),
        ("write_source", _hdf5_full, "the disk is full"),
        ("check_parity", _no_space, "the disk is full"),
    ],
)
def test_a_full_disk_during_the_export_is_one_storage_line_and_the_previous_export_stays(
    run_dir, monkeypatch, reload_in_process, where, fail, says
):
    before = _tree(run_dir / "export")
    monkeypatch.setattr(export, where, fail)
    with pytest.raises(StorageError, match=says) as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 7 and "\n" not in str(info.value)
    assert _tree(run_dir / "export") == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]


def test_keras_save_on_a_full_disk_is_a_storage_error(run_dir, monkeypatch):
    model = _tiny_model()
    monkeypatch.setattr(export, "check_parity", lambda *a: 0.0)
    monkeypatch.setattr(model, "save", _quota)
    with pytest.raises(StorageError, match="disk quota"):
        export.export_model(model, run_dir, ["a", "b"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]


@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs of a given size (as root); skipped where mounting is not allowed."""
    import subprocess

    mounts = []

    def mount(kib: int):
        where = tmp_path / f"disk{len(mounts)}"
        where.mkdir()
        # Popen, not run: the reload_in_process fixture replaces subprocess.run.
        proc = subprocess.Popen(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)], stderr=subprocess.PIPE
        )
        _, err = proc.communicate()
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {err.decode().strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.Popen(["umount", "-l", str(where)]).wait()


@pytest.mark.parametrize("room", first_fast(0.25, 0.6, 0.8, 0.95))
def test_a_real_full_disk_during_the_export_keeps_the_previous_export(
    recorded_run, small_disk, reload_in_process, tmp_path, room
):
    import shutil

    # The export's own size, measured on a normal disk first.
    probe = tmp_path / "probe" / recorded_run.name
    shutil.copytree(recorded_run, probe)
    export.export_run(probe)
    needed = sum(p.stat().st_size for p in (probe / "export").rglob("*") if p.is_file())
    run_bytes = sum(p.stat().st_size for p in recorded_run.rglob("*") if p.is_file())
    # Room for the run, a previous export of the same size, and a part of a new one: the writes
    # fail at different points (SavedModel variables, its graph, model.keras, source.json).
    disk = small_disk((run_bytes + needed + int(needed * room)) // 1024 + 64)
    run = disk / recorded_run.name
    shutil.copytree(recorded_run, run)
    shutil.copytree(probe / "export", run / "export")
    before = _tree(run / "export")
    with pytest.raises(StorageError, match="the disk is full") as info:
        export.export_run(run)
    assert str(run / "export") in str(info.value) and info.value.exit_code == 7
    assert _tree(run / "export") == before
    assert not [p for p in run.iterdir() if TMP_MARK in p.name]


def test_the_export_is_swapped_in_without_exchange_too_and_a_half_swap_is_repaired(run_dir, monkeypatch):
    monkeypatch.setattr(export, "check_parity", lambda *a: 0.0)
    monkeypatch.setattr(export, "_exchange", lambda a, b: False)
    export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert (run_dir / "export" / "labels.txt").read_text() == "a\nb\n"
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    # A kill between the two renames: export.previous is all there is; the next start puts it back.
    (run_dir / "export").rename(run_dir / "export.previous")
    assert export.clean_stale_exports(run_dir) == []
    assert (run_dir / "export" / "labels.txt").read_text() == "a\nb\n"


def test_stale_staging_folders_are_removed_at_the_next_export(recorded_run, reload_in_process):
    stale = recorded_run / f"export{TMP_MARK}deadbeef"
    (stale / "savedmodel").mkdir(parents=True)
    export.export_run(recorded_run)
    assert not stale.exists() and (recorded_run / "export" / "source.json").is_file()


def test_a_signal_during_the_export_removes_the_staging_folder(run_dir, monkeypatch):
    import signal

    before = _tree(run_dir / "export")

    def terminated(model, path, work):
        # SIGTERM's default would kill the process at once, leaving the staging folder behind.
        assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, "no handler during the export"
        signal.raise_signal(signal.SIGTERM)  # noted here, raised between the steps
        return 0.0

    monkeypatch.setattr(export, "check_parity", terminated)
    with pytest.raises(Interrupted, match="export stopped by SIGTERM: the previous export is unchanged") as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 75 and str(info.value).endswith(f"run `python -m train export {run_dir.name}` again")
    assert _tree(run_dir / "export") == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def _start_export(run, tmp_path):
    import subprocess
    import sys

    from faults import env

    out = open(tmp_path / "export.out", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "train", "export", run.name, "--runs-dir", str(run.parent)],
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    out.close()
    return proc


def _staging(run):
    return [p for p in run.iterdir() if p.name.startswith(f"export{TMP_MARK}")]


@pytest.mark.slow
def test_sigterm_on_the_export_command_exits_75_and_leaves_no_staging_folder(recorded_run, tmp_path):
    import signal

    from faults import wait_until

    before = _old_export(recorded_run)
    proc = _start_export(recorded_run, tmp_path)
    assert wait_until(lambda: bool(_staging(recorded_run)), proc), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("Interrupted: export stopped by SIGTERM: the previous export is unchanged")
    assert last.endswith(f" export {recorded_run.name} --runs-dir {recorded_run.parent}` again")  # as typed
    assert not _staging(recorded_run) and _tree(recorded_run / "export") == before


@pytest.mark.slow
def test_a_staging_folder_left_by_sigkill_is_removed_by_the_next_export(recorded_run, tmp_path):
    import signal

    from faults import wait_until

    _old_export(recorded_run)
    proc = _start_export(recorded_run, tmp_path)
    assert wait_until(lambda: bool(_staging(recorded_run)), proc), proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    (left,) = _staging(recorded_run)
    from train.results.export import export_run

    export_run(recorded_run)  # the next export, here in the test's process: the same code as the command's
    assert not left.exists() and not _staging(recorded_run)
    assert read_json(recorded_run / "export" / "source.json")["weights"]["epoch"] == 1


@pytest.mark.slow
def test_fit_removes_staging_folders_left_in_its_run(one_epoch_copy):
    from train import train

    settings, run = one_epoch_copy
    stale = run / f"export{TMP_MARK}0badf00d"
    (stale / "savedmodel").mkdir(parents=True)
    train(settings, resume=run.name)
    assert not stale.exists()


def test_ctrl_c_on_the_export_command_is_the_same_interruption(run_dir, monkeypatch):
    import signal

    def interrupted(model, path, work):
        signal.raise_signal(signal.SIGINT)
        return 0.0

    monkeypatch.setattr(export, "check_parity", interrupted)
    with pytest.raises(Interrupted, match="export stopped by SIGINT"):
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_terminal_that_hangs_up_on_the_export_command_is_the_same_interruption(run_dir, monkeypatch):
    import signal

    before = _tree(run_dir / "export")

    def hung_up(model, path, work):
        # SIGHUP's default would end the process at once (an SSH connection dropped), staging folder and all.
        assert signal.getsignal(signal.SIGHUP) != signal.SIG_DFL, "no SIGHUP handler during the export"
        signal.raise_signal(signal.SIGHUP)
        return 0.0

    monkeypatch.setattr(export, "check_parity", hung_up)
    with pytest.raises(Interrupted, match="export stopped by SIGHUP: the previous export is unchanged") as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 75 and _tree(run_dir / "export") == before
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_inside_fit_signals_stay_with_the_stop_flag(run_dir, monkeypatch):
    import signal
    import subprocess

    from train.training.stop_flag import StopFlag

    seen, real = [], export.check_parity
    monkeypatch.setattr(export, "check_parity", lambda *a: seen.append(signal.getsignal(signal.SIGTERM)) or 0.0)
    stop = StopFlag(0)
    with stop.installed():
        handler = signal.getsignal(signal.SIGTERM)
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
        assert seen == [handler]
        # Ctrl-C or `timeout` signals the group, the parity process too: the run is named, not RUN.
        monkeypatch.setattr(export, "check_parity", real)
        monkeypatch.setattr(export.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, -15, "", ""))
        with pytest.raises(Interrupted) as info:
            export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert str(info.value).endswith(f"run `python -m train export {run_dir.name}` again")


def test_a_signal_while_waiting_for_the_parity_process_stops_at_once(run_dir, monkeypatch):
    import signal

    def waiting(cmd, **kw):  # subprocess.run kills its child when the wait is interrupted by an exception
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the wait for the parity process went on after SIGTERM")

    monkeypatch.setattr(export.subprocess, "run", waiting)
    with pytest.raises(Interrupted, match="export stopped by SIGTERM"):
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["export", "manifest.json"]


def test_a_named_pipe_for_the_previous_source_json_is_never_waited_on(tmp_path):
    from types import SimpleNamespace

    from train.run.rundir import ExportDir

    previous, staging = ExportDir(tmp_path / "export"), ExportDir(tmp_path / "staging")
    previous.path.mkdir()
    staging.path.mkdir()
    (previous.path / "model.onnx").write_bytes(b"onnx")
    os.mkfifo(previous.source)  # nobody writes it: the export blocked on it forever
    formats = SimpleNamespace(files=("model.onnx",), asked=(), again=lambda dropped, run: f"export {run} makes them")
    kept, dropped = export.keep_other_formats(previous, staging, {"sha256": "ab"}, formats)
    assert kept == {} and dropped.startswith(  # it said they were made from other weights
        f"model.onnx of the previous export cannot be checked against these weights ({previous.source} cannot be read)"
    )
