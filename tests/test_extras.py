"""train.extras: a setting or command that needs an extra that is not installed is refused in one
line naming the command that adds it, before TensorFlow is imported. "Not installed" is made real by
a None in sys.modules, which is what an import of a missing package finds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from train import extras
from train.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_every_extra_has_its_requirements_file_and_names_the_modules_it_brings():
    for extra, modules in extras.PACKAGES.items():
        listed = (PROJECT_ROOT / "requirements" / f"{extra}.in").read_text().lower()
        assert modules and (PROJECT_ROOT / "requirements" / f"{extra}.lock").is_file()
        assert f"-r {extra}.in" in (PROJECT_ROOT / "requirements" / "all.in").read_text()
        # a module is its distribution's name or its top level (mlflow-skinny -> mlflow, tf2onnx brings onnx)
        assert any(m in listed for m in modules), (extra, modules)


@pytest.mark.parametrize("extra", sorted(extras.PACKAGES))
def test_a_missing_extra_is_refused_naming_it_and_the_command_that_adds_it(monkeypatch, extra):
    extras.require(extra, "SETTING", "value")  # the test environment has every extra
    module = extras.PACKAGES[extra][-1]
    monkeypatch.setitem(sys.modules, module, None)
    assert extras.missing(extra) == [module]
    with pytest.raises(ConfigError) as info:
        extras.require(extra, "SETTING", "value")
    message = str(info.value)
    assert message.startswith(f"SETTING='value' is not valid: needs the {extra} extra ({module} is not installed")
    assert f"`scripts/venv.sh --extra {extra}`" in message and f"-r requirements/{extra}.lock" in message
    assert "\n" not in message


def test_training_asks_for_mlflow_only_with_a_tracking_uri_and_for_onnx_only_when_exported(monkeypatch):
    from train.config import Settings

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    extras.require_for_training(Settings())  # neither asked for
    with pytest.raises(ConfigError, match=r"^MLFLOW_TRACKING_URI='http://\*\*\*@127.0.0.1:5000' .* mlflow extra"):
        extras.require_for_training(Settings(mlflow_tracking_uri="http://u:secret@127.0.0.1:5000"))
    with pytest.raises(ConfigError, match=r"^EXPORT_FORMATS='savedmodel,ONNX' .* onnx extra"):
        extras.require_for_training(Settings(export_formats="savedmodel,ONNX"))


# The commands, in a fresh process: refused with exit 2 and one line, and TensorFlow never imported.
CHILD = """
import json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from train.cli import main
code = main(sys.argv[2:])
print(json.dumps({"code": code, "tensorflow": "tensorflow" in sys.modules}))
"""


@pytest.mark.parametrize(
    ("blocked", "args", "said"),
    [
        (
            "obstore",
            ["fit", "--runs-dir", "s3://bucket/runs"],
            "RUNS_DIR='s3://bucket/runs' is not valid: needs the store",
        ),
        ("obstore", ["runs", "--runs-dir", "s3://bucket/runs"], "needs the store extra"),
        ("mlflow", ["fit", "--mlflow-tracking-uri", "http://127.0.0.1:5000"], "needs the mlflow extra"),
        ("tf2onnx", ["fit", "--export-formats", "onnx"], "EXPORT_FORMATS='onnx' is not valid: needs the onnx extra"),
        ("tf2onnx", ["export", "latest", "--format", "savedmodel,onnx"], "needs the onnx extra"),
        ("optuna", ["sweep", "space.toml"], "sweep='space.toml' is not valid: needs the sweep extra (optuna"),
    ],
)
def test_each_command_refuses_a_missing_extra_before_tensorflow(tmp_path, blocked, args, said):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, blocked, *args, "--env-file", ""],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT), "RUNS_DIR": str(tmp_path / "runs")},
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "tensorflow": False}, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert said in line and "scripts/venv.sh --extra" in line
