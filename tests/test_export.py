"""export: a failed parity check raises ExportError and leaves the previous export/ untouched.

The real fresh-process parity check (a second TensorFlow start) is covered end to end in test_fit.py;
here it is faked so the file stays fast.
"""

from __future__ import annotations

import json
import logging
import os

import keras
import numpy as np
import pytest

from train import export
from train.errors import ExportError, NoWeightsError, RunRecordError, StorageError
from train.models import build_model
from train.rundir import TMP_MARK, read_json


def _tiny_model():
    inputs = keras.Input(shape=(6, 6, 1), name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="probabilities")(x))


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "20260101-000000-aaaa"
    (run / "export").mkdir(parents=True)
    (run / "export" / "labels.txt").write_text("old\n")
    (run / "manifest.json").write_text(json.dumps({"status": "completed"}))
    return run


def test_parity_failure_raises_and_keeps_the_previous_export(run_dir, monkeypatch):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 1e-3)
    with pytest.raises(ExportError, match="differs from the trained model by 0.001") as info:
        export.export_model(_tiny_model(), run_dir, ["a", "b"])
    assert info.value.exit_code == 8
    assert [p.name for p in (run_dir / "export").iterdir()] == ["labels.txt"]
    assert (run_dir / "export" / "labels.txt").read_text() == "old\n"
    assert "export" not in read_json(run_dir / "manifest.json")
    assert not [p for p in run_dir.iterdir() if TMP_MARK in p.name]
    rejected = run_dir / "export.rejected"  # kept for inspection (one only), named in the message
    assert str(rejected) in str(info.value)
    assert json.loads((rejected / "parity.json").read_text())["max_abs_diff"] == 1e-3


def test_passing_parity_replaces_the_export_and_records_it(run_dir, monkeypatch):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 0.0)
    report = export.export_model(_tiny_model(), run_dir, ["a", "b"])
    final = run_dir / "export"
    assert sorted(p.name for p in final.iterdir()) == [
        "labels.txt",
        "model.keras",
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


def test_parity_batch_is_fixed_uint8():
    a, b = export._parity_batch((6, 6, 1)), export._parity_batch((6, 6, 1))
    assert a.dtype == np.uint8 and a.shape == (export.PARITY_BATCH, 6, 6, 1)
    np.testing.assert_array_equal(a, b)


def _failed_run(tmp_path):
    from train.config import Settings

    run = tmp_path / "runs" / "20260101-000000-000001"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(Settings().to_dict()))
    (run / "manifest.json").write_text(json.dumps({"status": "failed", "error": "DataError: x_train is empty"}))
    return run


def test_rebuild_needs_weights_then_data(tmp_path):
    run = _failed_run(tmp_path)
    with pytest.raises(NoWeightsError) as info:
        export.rebuild_model(run)
    assert "has no weights" in str(info.value) and "it ended failed: DataError: x_train is empty" in str(info.value)
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
    from train.runlock import RunLock

    run = _failed_run(tmp_path)
    with RunLock(run):
        assert cli.main(["export", run.name, "--runs-dir", str(run.parent)]) == 4
    assert capsys.readouterr().err.startswith(f"RunBusyError: run {run.name} is in use by another process (pid ")


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
    from train.schedules import CosineOverTraining

    model32 = build_model("cnn", (28, 28, 1), 3)
    model32.compile(
        optimizer=keras.optimizers.Adam(CosineOverTraining(1e-3, 2, 5)), loss="sparse_categorical_crossentropy"
    )
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
        monkeypatch.setattr(sys, "argv", ["-c", *cmd[3:]])
        exec(cmd[2], {"__name__": "__main__"})
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

    stderr = iter(["Traceback (most recent call last):\n  File x\nOSError: SavedModel file does not exist\n", ""])
    monkeypatch.setattr(
        export.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", next(stderr))
    )
    for last_line in ("OSError: SavedModel file does not exist", "no output"):
        with pytest.raises(ExportError) as info:
            export.check_parity(_tiny_model(), tmp_path / "savedmodel", tmp_path)
        assert (
            str(info.value)
            == f"the SavedModel at {tmp_path / 'savedmodel'} does not load in a fresh process: {last_line}"
        )


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

    def export_model(model, run_dir, labels, source):
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


def test_a_run_without_weights_or_status_is_said_to_have_ended_unknown(tmp_path):
    run = _failed_run(tmp_path)
    (run / "manifest.json").write_text("{}")
    with pytest.raises(NoWeightsError) as info:
        export.rebuild_model(run)
    assert "it ended unknown) because" in str(info.value)


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
