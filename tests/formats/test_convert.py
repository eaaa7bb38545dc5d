"""LiteRT and ONNX exports: converted, run in a fresh process without TensorFlow, refused when they differ.

The SavedModel's own fresh-process reload runs in this process (as in tests/results/test_export.py); the LiteRT
and ONNX files are run for real in .venv-runtime-check. The default models in each format, through
a real training run, are the slow tests at the end.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys

import keras
import numpy as np
import pytest
from builders import write_run
from helpers import PROJECT_ROOT, exec_in_process, first_fast, runtime_check_python, subprocess_env, tiny_image_model

from train.config import load_settings
from train.errors import ConfigError, ExportError
from train.formats import convert as formats
from train.formats.settings import wanted as export_formats
from train.results import export
from train.run.rundir import read_json

BOTH = ("savedmodel", "litert", "onnx")


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "20260101-000000-aaaa", manifest={"status": "completed"})


@pytest.fixture(autouse=True)
def savedmodel_in_process(monkeypatch):
    """The SavedModel's reload script in this process; every other command (the runtime check) for real."""
    real = subprocess.run

    def run(cmd, **kw):
        if cmd[:2] != [sys.executable, "-c"] or "tf.saved_model.load(" not in cmd[2]:
            return real(cmd, **kw)
        exec_in_process(cmd, monkeypatch)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)


def _model_with(fn, seed=0):
    """The tiny image model with a layer that computes `fn` (times 0, so the answers stay the same)."""
    keras.utils.set_random_seed(seed)

    class Odd(keras.layers.Layer):
        def call(self, x):
            return x + 0.0 * fn(x)

    inputs = keras.Input(shape=(6, 6, 1), name="image")
    x = keras.layers.Flatten()(Odd(name="odd")(keras.layers.Rescaling(1 / 255)(inputs)))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


def _export(run_dir, model=None, fmts=BOTH, quantize="none", data=None, source=None):
    model = model or tiny_image_model(seed=0)
    wanted = formats.Formats(fmts[1:], quantize, runtime_check_python(), data)
    return export.export_model(model, run_dir, ["a", "b"], source, formats=wanted)


def test_litert_and_onnx_run_without_tensorflow_and_are_recorded_and_hashed(run_dir):
    model = tiny_image_model(seed=0)
    report = _export(run_dir, model)
    final = run_dir / "export"
    parity = read_json(final / "parity.json")
    for fmt, name in (("litert", "model.tflite"), ("onnx", "model.onnx")):
        record = parity["formats"][fmt]
        assert record["file"] == name and record["bytes"] == (final / name).stat().st_size
        assert 0 <= record["max_abs_diff"] <= formats.TOLERANCE[fmt] == record["tolerance"]
        assert name in read_json(final / "source.json")["files"]  # predict's integrity check covers it
    assert report["formats"] == parity["formats"] and report["failed"] == []
    assert read_json(run_dir / "manifest.json")["export"] == report
    # The same raw uint8 input and probabilities output as the SavedModel, in the runtime environment.
    x = export._parity_batch((6, 6, 1))
    np.save(run_dir / "x.npy", x)
    for fmt, name in (("litert", "model.tflite"), ("onnx", "model.onnx")):
        cmd = [runtime_check_python(), "-m", "train.formats.runtime_check", fmt, str(final / name)]
        subprocess.run([*cmd, str(run_dir / "x.npy"), str(run_dir / f"{fmt}.npy")], check=True, env=subprocess_env())
        np.testing.assert_allclose(np.load(run_dir / f"{fmt}.npy"), model(x.astype(np.float32)), atol=1e-4)


def test_the_runtime_environment_has_no_tensorflow():
    proc = subprocess.run([runtime_check_python(), "-c", "import tensorflow"], capture_output=True, text=True)
    assert proc.returncode != 0 and "No module named 'tensorflow'" in proc.stderr


def test_the_runtime_check_refuses_tensorflow_even_where_it_is_installed(tmp_path):
    # A "runtime" that needs TensorFlow, run by this environment's Python, which has TensorFlow.
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("import tensorflow\n")
    np.save(tmp_path / "x.npy", np.zeros((1, 6, 6, 1), np.uint8))
    cmd = [sys.executable, "-m", "train.formats.runtime_check", "onnx", "m.onnx", "x.npy", "out.npy"]
    env = subprocess_env(PYTHONPATH=f"{PROJECT_ROOT}:{tmp_path}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 3 and "tensorflow imported by the runtime check" in proc.stderr
    assert not (tmp_path / "out.npy").exists()


def test_fit_refuses_a_format_without_its_runtime_before_tensorflow_loads(tmp_path):
    # This Python has TensorFlow and neither LiteRT's nor ONNX Runtime's package (those are in
    # .venv-runtime-check), so the parity check of a LiteRT export could not run in it.
    code = (
        "import sys, train.cli as c; "
        "rc = c.main(['fit', '--env-file', '', '--export-formats', 'litert', '--export-check-python', sys.executable]); "
        "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    )
    env = subprocess_env(PYTHONPATH=str(PROJECT_ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ConfigError: EXPORT_FORMATS='litert' is not valid: litert is checked by running the file")
    assert "scripts/venv-runtime-check.sh" in line


def test_the_export_command_names_the_flag_or_the_setting_the_formats_came_from(tmp_path, monkeypatch, capsys):
    from train import cli

    monkeypatch.setenv("EXPORT_CHECK_PYTHON", sys.executable)  # no LiteRT runtime in this environment
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path), "--format", "litert"]) == 2
    assert capsys.readouterr().err.startswith("ConfigError: --format='litert' is not valid: litert is checked")
    # litert that only the quantisation asks for: the flag typed is what to change, not EXPORT_FORMATS.
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path), "--quantize", "int8"]) == 2
    assert capsys.readouterr().err.startswith("ConfigError: --quantize='int8' is not valid: litert is checked")
    monkeypatch.setenv("EXPORT_QUANTIZE", "dynamic")
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("ConfigError: EXPORT_QUANTIZE='dynamic' is not valid: litert is checked")
    monkeypatch.delenv("EXPORT_QUANTIZE")
    monkeypatch.setenv("EXPORT_FORMATS", "litert")
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("ConfigError: EXPORT_FORMATS='litert' is not valid: litert is checked")
    # A value the settings refuse is named as it was typed too.
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path), "--format", "bogus"]) == 2
    assert capsys.readouterr().err.startswith("ConfigError: --format='bogus' is not valid: 'bogus' is not a format")
    assert cli.main(["export", "latest", "--runs-dir", str(tmp_path), "--quantize", "int9"]) == 2
    assert capsys.readouterr().err == "ConfigError: --quantize='int9' is not valid: one of none, dynamic, int8\n"


def test_a_missing_runtime_names_the_environment_to_make(run_dir, monkeypatch):
    def no_runtime(cmd):
        return subprocess.CompletedProcess(
            cmd, 3, "", "the onnx runtime is not installed here (No module named 'onnxruntime')"
        )

    monkeypatch.setattr(formats, "_run", no_runtime)
    with pytest.raises(ExportError) as info:
        _export(run_dir, fmts=("savedmodel", "onnx"))
    assert "scripts/venv-runtime-check.sh" in str(info.value) and "EXPORT_CHECK_PYTHON" in str(info.value)
    assert not (run_dir / "export" / "model.onnx").exists()


def test_the_parity_check_runs_in_the_set_ups_runtime_environment_unless_told(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "RUNTIME_VENV", tmp_path / ".venv-runtime-check")
    assert formats.parity_python("") == sys.executable  # none made: this Python (TensorFlow refused at import)
    made = tmp_path / ".venv-runtime-check" / "bin" / "python"
    made.parent.mkdir(parents=True)
    made.write_text("")
    assert formats.parity_python("") == str(made)
    assert formats.parity_python("/opt/py/bin/python") == "/opt/py/bin/python"  # EXPORT_CHECK_PYTHON wins


def test_a_runtime_environment_this_user_cannot_look_into_is_one_config_error(tmp_path, monkeypatch):
    # Root reads any folder, so the refusal of a real mode-000 folder is made by the call that meets it.
    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(formats, "RUNTIME_VENV", tmp_path / ".venv-runtime-check")
    monkeypatch.setattr(type(tmp_path), "is_file", refused)
    with pytest.raises(ConfigError) as info:
        formats.parity_python("")
    text = str(info.value)
    assert text.startswith("EXPORT_CHECK_PYTHON='' is not valid: empty, and ") and "Permission denied" in text
    assert ".venv-runtime-check/bin/python" in text and "\n" not in text


def test_the_runtime_environment_is_found_beside_the_package():
    assert formats.RUNTIME_VENV == PROJECT_ROOT / ".venv-runtime-check"


def test_formats_whose_runtime_is_there_pass_the_check_before_converting():
    formats.require_runtimes(runtime_check_python(), ("savedmodel", "litert", "onnx"), "--format", "litert,onnx")
    formats.require_runtimes("/nonexistent/python", ("savedmodel",), "--format", "savedmodel")  # nothing to run


@pytest.mark.parametrize("python", [sys.executable])
def test_a_missing_runtime_is_one_config_error_before_anything_is_converted(python, monkeypatch):
    from train.formats import runtime_check

    monkeypatch.setitem(runtime_check.RUNTIMES, "litert", "no_such_runtime_here")
    with pytest.raises(ConfigError) as info:
        formats.require_runtimes(python, ("savedmodel", "litert", "onnx"), "EXPORT_FORMATS", "litert,onnx")
    text = str(info.value)
    assert text.startswith("EXPORT_FORMATS='litert,onnx' is not valid: litert ")
    assert f"{python} lacks no-such-runtime-here" in text and "scripts/venv-runtime-check.sh" in text


@pytest.mark.parametrize(
    "python, why",
    [
        ("/nonexistent/python", "does not exist"),
        ("/tmp", "is a directory"),
        ("/bin/true", "is not a Python that runs"),
        ("/bin/false", "is not a Python that runs"),
    ],
)
def test_a_check_python_that_is_no_python_is_named_before_anything_is_converted(python, why):
    # Not "lacks ai-edge-litert", and never the converter's fault after the conversion: the setting is wrong.
    with pytest.raises(ConfigError) as info:
        formats.require_runtimes(python, ("savedmodel", "litert"), "EXPORT_FORMATS", "litert")
    text = str(info.value)
    assert text.startswith(f"EXPORT_CHECK_PYTHON={python!r} is not valid: {why}"), text
    assert "leave it empty" in text and "converter" not in text and "\n" not in text


def test_a_runtime_probe_that_times_out_says_so_and_not_that_the_runtimes_are_missing(monkeypatch):
    def hangs(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(formats, "_ANSWERS", {})
    monkeypatch.setattr(subprocess, "run", hangs)
    with pytest.raises(ConfigError) as info:
        formats.require_runtimes(sys.executable, ("savedmodel", "litert"), "EXPORT_FORMATS", "litert")
    text = str(info.value)
    assert text.startswith(f"EXPORT_CHECK_PYTHON={sys.executable!r} is not valid: gave no answer within 120 s"), text
    assert "-c 'import ai_edge_litert'" in text and "lacks" not in text and "\n" not in text


def test_a_checker_that_ends_well_without_answers_is_blamed_on_the_setting_not_the_converter(tmp_path):
    x = np.zeros((2, 6, 6, 1), np.uint8)
    with pytest.raises(ExportError) as info:
        formats._answers(
            lambda cmd: subprocess.CompletedProcess(cmd, 0, "", ""), "/bin/true", "litert", tmp_path / "m", x, tmp_path
        )
    assert "EXPORT_CHECK_PYTHON" in str(info.value) and "converter" not in str(info.value), info.value

    def hangs(cmd):
        raise subprocess.TimeoutExpired(cmd, 600)

    with pytest.raises(ExportError) as info:  # the format's failure, not an error that ends the whole export
        formats._answers(hangs, "/py", "onnx", tmp_path / "model.onnx", x, tmp_path)
    assert str(info.value).startswith(
        "onnx: model.onnx does not run in /py without TensorFlow (no answer within 600 s)"
    )


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda y: y + 1e-3, "differs from the SavedModel by 0.001"),
        (lambda y: y * np.nan, "gives NaN/inf probabilities"),
    ],
)
def test_a_file_that_disagrees_is_removed_and_the_export_fails_with_exit_8(
    run_dir, monkeypatch, caplog, change, problem
):
    real = formats._run

    def off(cmd):
        proc = real(cmd)
        if cmd[3] == "onnx":
            np.save(cmd[-1], change(np.load(cmd[-1])))
        return proc

    monkeypatch.setattr(formats, "_run", off)
    with caplog.at_level("WARNING", logger="train"), pytest.raises(ExportError) as info:
        _export(run_dir)
    message = str(info.value)
    assert info.value.exit_code == 8 and "\n" not in message
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # said once: in the error, not before it too
    assert message.startswith(f"onnx: model.onnx {problem}") and "so it was removed" in message
    final = run_dir / "export"
    assert not (final / "model.onnx").exists() and (final / "model.tflite").is_file()
    assert "model.onnx" not in read_json(final / "source.json")["files"]
    assert read_json(run_dir / "manifest.json")["export"]["failed"] == [message.split(" (written and checked")[0]]
    assert "written and checked: savedmodel, litert in" in message


@pytest.mark.parametrize(
    "fn, refused, written, op",
    [(keras.ops.sinh, "litert", "onnx", "tf.Sinh"), (lambda x: keras.ops.log(x + 1.0) * x, None, None, None)],
)
def test_an_op_a_converter_lacks_fails_that_format_only_in_one_line(run_dir, fn, refused, written, op):
    import tensorflow as tf

    if refused is None:  # ONNX lacks TensorFlow's Xlogy, LiteRT has it
        fn, refused, written, op = (lambda x: tf.math.xlogy(x, x + 1.0)), "onnx", "litert", "Xlogy"
    with pytest.raises(ExportError) as info:
        _export(run_dir, _model_with(fn))
    message = str(info.value)
    assert message.startswith(f"{refused}: ") and op in message and "odd" in message and "\n" not in message
    assert f"leave {refused} out of EXPORT_FORMATS" in message and info.value.exit_code == 8
    final = run_dir / "export"
    assert not (final / formats.FILES[refused]).exists()
    assert (final / formats.FILES[written]).is_file() and (final / "savedmodel").is_dir()
    assert written in read_json(final / "parity.json")["formats"]


def test_a_failed_format_never_takes_away_the_good_file_of_the_previous_export(run_dir):
    same = {"file": "best.weights.h5", "epoch": 1, "sha256": "w0"}  # made from the same weights: still not kept
    _export(run_dir, fmts=("savedmodel", "litert"), source=same)
    before = (run_dir / "export" / "model.tflite").read_bytes()
    with pytest.raises(ExportError) as info:
        _export(run_dir, _model_with(keras.ops.sinh), fmts=("savedmodel", "litert"), source=same)
    assert "the previous export, which has model.tflite, is unchanged" in str(info.value)
    assert (run_dir / "export" / "model.tflite").read_bytes() == before
    assert (run_dir / "export.rejected" / "savedmodel").is_dir()
    assert not (run_dir / "export.rejected" / "model.tflite").exists()


@pytest.mark.parametrize("mode", first_fast("int8", "dynamic"))
def test_quantised_litert_records_its_file_size_and_accuracy_change(run_dir, mode):
    rng = np.random.default_rng(0)
    calibration = rng.integers(0, 256, (64, 6, 6, 1), dtype=np.uint8)
    x_val = rng.integers(0, 256, (50, 6, 6, 1), dtype=np.uint8)
    y_val = rng.integers(0, 2, 50)
    report = _export(run_dir, fmts=("savedmodel", "litert"), quantize=mode, data=lambda: (calibration, x_val, y_val))
    record = report["formats"][f"litert-{mode}"]
    path = run_dir / "export" / f"model.{mode}.tflite"
    assert record["file"] == path.name and record["bytes"] == path.stat().st_size
    assert record["validation_images"] == 50 and record["tolerance"] is None
    assert record["accuracy_change"] == pytest.approx(record["accuracy_quantized"] - record["accuracy"])
    assert path.name in read_json(run_dir / "export" / "source.json")["files"]


def test_export_formats_setting():
    assert export_formats("onnx") == ("savedmodel", "onnx")
    assert export_formats(" LiteRT , savedmodel,onnx") == BOTH
    with pytest.raises(ConfigError, match=r"EXPORT_FORMATS='savedmodel,tflite' is not valid: 'tflite' is not a format"):
        load_settings({"export_formats": "savedmodel,tflite"}, env_file=None, environ={})
    with pytest.raises(ConfigError, match="EXPORT_QUANTIZE='int16' is not valid: one of none, dynamic, int8"):
        load_settings({"export_quantize": "int16"}, env_file=None, environ={})


def test_export_command_rejects_an_unknown_format_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "train", "export", "latest", "--runs-dir", str(tmp_path), "--format", "tflite"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("ConfigError: --format='tflite' is not valid")


def test_the_report_shows_each_file_its_size_and_the_quantised_accuracy_change():
    from train.results.report import format_rows

    export_record = {
        "formats": {
            "litert": {"file": "model.tflite", "bytes": 901352, "max_abs_diff": 5.5e-7, "tolerance": 1e-4},
            "litert-int8": {
                "file": "model.int8.tflite",
                "bytes": 235544,
                "max_abs_diff": 0.079,
                "tolerance": None,
                "validation_images": 128,
                "accuracy": 0.98,
                "accuracy_quantized": 0.97,
                "accuracy_change": -0.01,
            },
        },
        "failed": ["onnx: ONNX has no op for TensorFlow's Xlogy (in m/odd): ..."],
    }
    assert format_rows(export_record) == [
        ("export litert", "model.tflite, 0.90 MB, max |diff| 5.50e-07 (tolerance 0.0001)"),
        (
            "export litert-int8",
            "model.int8.tflite, 0.24 MB, max |diff| 7.90e-02 (quantised: no tolerance); "
            "validation accuracy 0.9800 -> 0.9700 (-0.0100, 128 images)",
        ),
        ("export failed", "onnx: ONNX has no op for TensorFlow's Xlogy (in m/odd): ..."),
    ]
    assert format_rows({"max_abs_diff": 0.0}) == []  # a SavedModel-only export adds no rows


# --- the models of the registry, trained for real (tiny data, one epoch) --------------------------


def _trained(tmp_path, **changes):
    from helpers import tiny_settings

    from train import train

    settings = tiny_settings(
        tmp_path,
        epochs=1,
        report="off",
        export_formats="savedmodel,litert,onnx",
        export_check_python=runtime_check_python(),
        **{"export": True, **changes},
    )
    return train(settings)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["cnn", "cnn_bn", "resnet_small"])
def test_each_model_exports_to_every_format_at_the_end_of_training(tmp_path, model):
    result = _trained(tmp_path, model=model)
    final = result.run_dir / "export"
    parity = read_json(final / "parity.json")
    assert sorted(parity["formats"]) == ["litert", "onnx"]
    for fmt, record in parity["formats"].items():
        assert (final / record["file"]).is_file() and record["max_abs_diff"] <= formats.TOLERANCE[fmt]
    assert result.export["failed"] == []


@pytest.mark.slow
def test_a_mixed_precision_run_exports_its_float32_copy_to_every_format(tmp_path):
    result = _trained(tmp_path, model="cnn", precision="mixed_bfloat16")
    assert read_json(result.run_dir / "manifest.json")["precision"]["policy"] == "mixed_bfloat16"
    parity = read_json(result.run_dir / "export" / "parity.json")
    for fmt in ("litert", "onnx"):
        assert parity["formats"][fmt]["max_abs_diff"] <= formats.TOLERANCE[fmt]


@pytest.mark.slow
def test_export_command_quantises_litert_int8_on_training_images(tmp_path, monkeypatch, capsys):
    from train.cli import main

    result = _trained(tmp_path, model="cnn", export=False)
    run = result.run_dir
    cmd = [sys.executable, "-m", "train", "export", run.name, "--runs-dir", str(run.parent)]
    cmd += ["--format", "savedmodel", "--quantize", "int8"]  # the float LiteRT file comes with it
    # The first two exports run the command's CLI in this process (no TensorFlow start of their own);
    # the last one, whose warning line is the stderr of a fresh process, is the command's own process.
    monkeypatch.setenv("EXPORT_CHECK_PYTHON", runtime_check_python())
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(cmd[3:]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "exported litert: model.tflite" in out and "exported litert-int8: model.int8.tflite" in out
    record = read_json(run / "export" / "parity.json")["formats"]["litert-int8"]
    assert record["validation_images"] == 42 and -1 <= record["accuracy_change"] <= 1  # VAL_SPLIT of the 426
    assert record["bytes"] < read_json(run / "export" / "parity.json")["formats"]["litert"]["bytes"] / 2
    assert not (run / "export" / "model.onnx").exists()
    # The SavedModel alone again: the LiteRT files of these weights stay, and the command says so.
    assert main(cmd[3:-4]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "kept (the same weights) litert-int8: model.int8.tflite (0.2" in out
    assert "kept (the same weights) litert: model.tflite" in out
    # Made from other weights than these: left out, in one warning line as the package's others read.
    source = read_json(run / "export" / "source.json")
    (run / "export" / "source.json").write_text(json.dumps({**source, "weights": {"sha256": "other"}}))
    env = subprocess_env(EXPORT_CHECK_PYTHON=runtime_check_python())
    proc = subprocess.run(cmd[:-4], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        f"WARNING: export: model.int8.tflite, model.tflite of the previous export were made from other weights and "
        f"are not in the new one; export {run.name} --runs-dir {shlex.quote(str(run.parent))} --format litert "
        "--quantize int8 makes them from these weights"
    ) in proc.stderr.splitlines()


def test_quantising_without_the_runs_data_fails_that_file_only(run_dir):
    from train.errors import DataError

    def gone():
        raise DataError("npz:/data/tiny.npz does not exist: restore it or set DATASET")

    with pytest.raises(ExportError) as info:
        _export(run_dir, fmts=("savedmodel", "litert"), quantize="dynamic", data=gone)
    assert str(info.value).startswith("litert-dynamic: npz:/data/tiny.npz does not exist")
    assert (run_dir / "export" / "model.tflite").is_file() and not (
        run_dir / "export" / "model.dynamic.tflite"
    ).exists()


# --- a previous export's files, kept or named -------------------------------------------------------


def _export_with_litert_files(run_dir, weights: str):
    """The export in place: a SavedModel-less stand-in with LiteRT files made from `weights`."""
    from train.digest import sha256_file

    old = run_dir / "export"
    old.mkdir(exist_ok=True)
    (old / "model.tflite").write_bytes(b"float litert")
    (old / "model.int8.tflite").write_bytes(b"int8 litert")
    records = {
        "litert": {"file": "model.tflite", "bytes": 12, "max_abs_diff": 1e-7},
        "litert-int8": {"file": "model.int8.tflite", "bytes": 11, "max_abs_diff": 0.01},
    }
    (old / "parity.json").write_text(json.dumps({"max_abs_diff": 0.0, "formats": records}))
    files = {n: sha256_file(old / n) for n in ("model.tflite", "model.int8.tflite")}
    (old / "source.json").write_text(json.dumps({"weights": {"sha256": weights}, "files": files}))
    return records


def test_an_export_of_one_format_keeps_the_files_of_another_made_from_the_same_weights(run_dir, monkeypatch):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 0.0)
    records = _export_with_litert_files(run_dir, "w1")
    source = {"file": "best.weights.h5", "epoch": 2, "sha256": "w1"}
    report = export.export_model(tiny_image_model(), run_dir, ["a", "b"], source, formats.Formats())
    final = run_dir / "export"
    assert (final / "model.tflite").read_bytes() == b"float litert"
    assert (final / "model.int8.tflite").read_bytes() == b"int8 litert"
    assert {"model.tflite", "model.int8.tflite"} <= set(read_json(final / "source.json")["files"])
    kept = {key: {**r, "kept": True} for key, r in records.items()}
    assert read_json(final / "parity.json")["formats"] == kept == report["formats"]
    assert read_json(run_dir / "manifest.json")["export"]["formats"] == kept
    # An ONNX file that fails now: the LiteRT files are still kept, and said to be kept, not written.
    monkeypatch.setattr(formats.Formats, "write", lambda *a, **k: ({}, [ExportError("onnx: it failed")]))
    with pytest.raises(ExportError) as info:
        export.export_model(tiny_image_model(), run_dir, ["a", "b"], source, formats.Formats(("onnx",)))
    assert str(info.value) == (
        f"onnx: it failed (written and checked: savedmodel in {final}; kept from the previous export: litert, litert-int8)"
    )


@pytest.mark.parametrize(
    ("weights", "edit", "why"),
    [("w0", False, "were made from other weights"), ("w1", True, "differ from what its source.json records")],
)
def test_files_of_another_format_that_would_not_fit_are_named_when_left_out(
    run_dir, monkeypatch, caplog, weights, edit, why
):
    monkeypatch.setattr(export, "check_parity", lambda model, path, work: 0.0)
    _export_with_litert_files(run_dir, weights)
    if edit:
        (run_dir / "export" / "model.int8.tflite").write_bytes(b"edited")
        (run_dir / "export" / "model.tflite").write_bytes(b"edited")
    source = {"file": "best.weights.h5", "epoch": 5, "sha256": "w1"}
    with caplog.at_level(logging.WARNING, logger="train"):
        report = export.export_model(
            tiny_image_model(), run_dir, ["a", "b"], source, formats.Formats(), runs_dir="my runs"
        )
    assert not list((run_dir / "export").glob("*.tflite")) and "formats" not in report
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [  # the run was found through --runs-dir: the command names it, as pasted it looks there
        f"WARNING: export: model.int8.tflite, model.tflite of the previous export {why} and are not in the new "
        f"one; export {run_dir.name} --runs-dir 'my runs' --format litert --quantize int8 makes them from these weights"
    ]
    # --quantize takes one mode: the files of two are made again by two commands, each one that runs
    assert formats.Formats.again(["model.dynamic.tflite", "model.int8.tflite", "model.onnx"], "r") == (
        "`export r --format litert,onnx --quantize dynamic` then `export r --quantize int8` make them"
    )
