"""11. Export formats on the CPU: file size, load time and images/s of LiteRT and ONNX against the
SavedModel in TensorFlow, and the accuracy change of the quantised LiteRT files.

One CNN is trained (quick mode: 2,048 images, one epoch), exported to every format with
EXPORT_QUANTIZE=dynamic and then int8, and each file is timed in a fresh process of the runtime it
is meant for (format_speed.py). Needs .venv-runtime-check (scripts/venv-runtime-check.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import common
import numpy as np
import pytest


def _runtime_python() -> str:
    python = common.ROOT / ".venv-runtime-check" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-runtime-check: run scripts/venv-runtime-check.sh")
    return str(python)


def _speed(python: str, fmt: str, path, x_path, seconds: float) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(common.ROOT)}
    script = str(common.ROOT / "benchmarks" / "format_speed.py")
    proc = subprocess.run(
        [python, script, fmt, str(path), str(x_path), str(seconds)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.processes
def test_export_formats_size_load_and_speed(benchmark, quick, mnist_npz, tmp_path):
    from train import train
    from train.results.export import export_run

    python = _runtime_python()
    epochs = 1 if quick else 2
    s = common.settings(
        dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"), epochs=epochs, export=False, report="off"
    )
    run = train(s).run_dir
    records = {}
    modes = ("int8",) if quick else ("dynamic", "int8")  # quick: each converter and runtime once
    for mode in modes:
        wanted = s.replace(export_formats="savedmodel,litert,onnx", export_quantize=mode, export_check_python=python)
        report = export_run(run, settings=wanted)
        records.update(report["formats"])
        (run / "export" / f"model.{mode}.tflite").rename(tmp_path / f"model.{mode}.tflite")  # kept for timing
    x = np.random.default_rng(0).integers(0, 256, (64, 28, 28, 1), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    seconds = 0.5 if quick else 3.0
    export = run / "export"
    files = {
        "savedmodel": (sys.executable, export / "savedmodel"),
        "litert": (python, export / "model.tflite"),
        **{f"litert-{mode}": (python, tmp_path / f"model.{mode}.tflite") for mode in modes},
        "onnx": (python, export / "model.onnx"),
    }
    figures = {}

    def measure():
        for name, (py, path) in files.items():
            fmt = name.split("-")[0]
            figures[name] = _speed(py, fmt, path, tmp_path / "x.npy", seconds)
            size = (
                sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
            )
            figures[name]["mb"] = size / 1e6
            if name in records and "accuracy_change" in records[name]:
                figures[name]["accuracy_change"] = records[name]["accuracy_change"]
                figures[name]["validation_images"] = records[name]["validation_images"]

    common.once(benchmark, measure)
    sm = figures["savedmodel"]
    for f in figures.values():
        f["batch1_vs_savedmodel"] = common.ratio(f["batch1_ips"], sm["batch1_ips"])
        f["batch64_vs_savedmodel"] = common.ratio(f["batch64_ips"], sm["batch64_ips"])
    common.record(
        benchmark,
        "11. export formats: LiteRT images/s at batch 1 / SavedModel in TensorFlow",
        "reported, not a goal",
        figures["litert"]["batch1_vs_savedmodel"],
        None,
        formats=figures,
        epochs=epochs,
    )
    print(json.dumps(figures, indent=1))
