"""Export: a SavedModel that takes raw uint8 images, a `.keras` file and labels, checked for parity.

After writing, the SavedModel is loaded by plain TensorFlow in a fresh Python process (no import
of this package) and its predictions on a fixed batch are compared with the in-memory model; the
largest difference goes into the manifest and anything above 1e-5 fails the export.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ExportError, NoWeightsError
from .manifest import update_manifest
from .rundir import ExportDir, RunDir, labels_text, make_temp_dir, read_run_settings, storage_error

log = logging.getLogger("train")
TOLERANCE = 1e-5
PARITY_BATCH = 32

# Runs in a fresh interpreter: only TensorFlow and numpy, exactly what a serving user has.
_RELOAD = """
import sys, numpy as np, tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
x = np.load(sys.argv[2])
out = model.signatures["serving_default"](images=tf.constant(x))
np.save(sys.argv[3], next(iter(out.values())).numpy())
"""


def _parity_batch(input_shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(PARITY_BATCH, *input_shape), dtype=np.uint8)


def write_savedmodel(model, path: Path) -> None:
    import keras
    import tensorflow as tf

    shape = [None, *model.inputs[0].shape[1:]]
    archive = keras.export.ExportArchive()
    archive.track(model)

    def serve(images):
        # Preprocessing lives in the artefact: raw uint8 pixels in, float32 probabilities out.
        return {"probabilities": tf.cast(model(tf.cast(images, tf.float32), training=False), tf.float32)}

    archive.add_endpoint(
        name="serving_default", fn=serve, input_signature=[tf.TensorSpec(shape, tf.uint8, name="images")]
    )
    archive.write_out(str(path), verbose=False)


def check_parity(model, savedmodel: Path, workdir: Path) -> float:
    x = _parity_batch(tuple(model.inputs[0].shape[1:]))
    expected = np.asarray(model(x.astype(np.float32), training=False), dtype=np.float32)
    np.save(workdir / "x.npy", x)
    proc = subprocess.run(
        [sys.executable, "-c", _RELOAD, str(savedmodel), str(workdir / "x.npy"), str(workdir / "y.npy")],
        capture_output=True,
        text=True,
        timeout=600,
        env=_quiet_env(),
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ExportError(f"the SavedModel at {savedmodel} does not load in a fresh process: {tail[0]}")
    got = np.load(workdir / "y.npy")
    return float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))


def _quiet_env() -> dict[str, str]:
    import os

    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def float32_copy(model, model_name: str):
    """The same network and weights under the float32 policy, uncompiled.

    The export serves in float32 whatever the training precision: it runs on any CPU or GPU, and
    its fresh-process parity can be held to 1e-5 (bfloat16 keeps ~3 significant digits, so a
    mixed-precision graph and the eager model already differ by ~1e-3 after fusion). A copy also
    in float32: model.keras then never carries the training optimizer, whose learning-rate
    schedule (train.schedules) only this package could load.
    """
    import keras

    from .models import build_model

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        copy = build_model(model_name, tuple(model.inputs[0].shape[1:]), int(model.outputs[0].shape[-1]))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    copy.set_weights(model.get_weights())
    return copy


def export_model(model, run_dir: Path, labels: list[str]) -> dict[str, Any]:
    """Write run_dir/export/{savedmodel/, model.keras, labels.txt} atomically and verify parity.

    `labels` are the run's class names (RunDir.data_description); export/labels.txt is a copy of
    them for serving code that has only the export folder.
    """
    files = RunDir(run_dir)
    final = files.export.path
    # A staging folder with the export's layout, renamed into place when complete.
    staging = ExportDir(make_temp_dir(run_dir, final.name))  # readable by others as the umask allows
    try:
        write_savedmodel(model, staging.savedmodel)
        model.save(staging.keras)
        staging.labels.write_text(labels_text(labels), encoding="utf-8")
        with tempfile.TemporaryDirectory() as work:
            diff = check_parity(model, staging.savedmodel, Path(work))
        staging.parity.write_text(json.dumps({"max_abs_diff": diff, "tolerance": TOLERANCE}) + "\n")
        if diff > TOLERANCE:
            raise ExportError(
                f"the exported SavedModel differs from the trained model by {diff:.3g} (> {TOLERANCE}); "
                f"the files are left in {staging.path} for inspection"
            )
        if final.exists():
            shutil.rmtree(final)
        staging.path.rename(final)
    except OSError as exc:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise storage_error(final, exc) from exc
    except ExportError:
        raise
    except BaseException:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise
    report = {
        "savedmodel": str(files.export.savedmodel),
        "keras": str(files.export.keras),
        "labels": str(files.export.labels),
        "max_abs_diff": diff,
        "tolerance": TOLERANCE,
    }
    update_manifest(files.manifest, export=report)
    log.info("export: %s (fresh-process parity: max |diff| %.2e)", final, diff)
    return report


def rebuild_model(run_dir: Path):
    """The run's model with its best (else final) weights, under the run's precision policy."""
    import keras

    from .models import build_model

    files = RunDir(run_dir)
    settings = read_run_settings(run_dir)
    manifest = files.read_manifest()
    weights = files.weights()
    if not weights:
        ended = manifest.get("status") or "unknown"
        error = f": {manifest['error']}" if manifest.get("error") else ""
        raise NoWeightsError(
            f"run {run_dir.name} has no weights (no {files.best_weights.name} or {files.final_weights.name}; "
            f"it ended {ended}{error}) "
            f"because no epoch finished: resume it with `python -m train --resume {run_dir.name}`, or train a new run"
        )
    class_names, input_shape = files.data_description()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")  # see float32_copy: the export serves in float32
    try:
        model = build_model(settings.model, input_shape, len(class_names))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.load_weights(weights[0])
    return model, class_names, weights[0].name


def export_run(run_dir: Path, model=None) -> dict[str, Any]:
    """Export a run's best weights (else `model`'s current ones, else final.weights.h5) in float32.

    The trained model passed in is never modified: the export is a float32 copy of it.
    """
    run_dir = Path(run_dir)
    if model is None or RunDir(run_dir).best_weights.is_file():
        export, labels, source = rebuild_model(run_dir)
    else:
        settings = read_run_settings(run_dir)
        export, source = float32_copy(model, settings.model), "the trained model"
        labels = RunDir(run_dir).data_description()[0]
    log.info("export: from %s", source)
    return export_model(export, run_dir, labels)
