"""`python -m train predict <run> <images>`: class and probability for each image file.

Uses the run's exported SavedModel (what a serving user gets) when it exists, else rebuilds the
model from the run's best weights; images go through the same decode/resize as training. A run
without either says so (NoWeightsError, exit 4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ExportError
from .rundir import RunDir


def predict_files(run_dir: Path, files: list[str]) -> list[dict]:
    from .data import load_image_file

    run_files = RunDir(run_dir)
    savedmodel = run_files.export.savedmodel
    if savedmodel.is_dir():
        import tensorflow as tf

        labels = run_files.data_description()[0]  # the run's one list of class names, as every reader
        serve = tf.saved_model.load(str(savedmodel)).signatures["serving_default"]
        shape = tuple(serve.structured_input_signature[1]["images"].shape[1:])
        width = next(iter(serve.structured_outputs.values())).shape[-1]
        if width != len(labels):
            raise ExportError(
                f"the export of run {run_files.name} predicts {width} classes but the run has "
                f"{len(labels)} (it was exported before the run trained on other data): "
                f"export it again with `python -m train export {run_files.name}`"
            )

        def run(batch):
            return next(iter(serve(images=tf.constant(batch)).values())).numpy()
    else:
        from .export import rebuild_model

        model, labels, _ = rebuild_model(run_dir)
        shape = tuple(model.inputs[0].shape[1:])

        def run(batch):
            return np.asarray(model(batch.astype(np.float32), training=False))

    batch = np.stack([load_image_file(f, shape) for f in files])
    probs = run(batch)
    out = []
    for f, p in zip(files, probs):
        k = int(np.argmax(p))
        out.append(
            {"file": str(f), "class": labels[k] if k < len(labels) else str(k), "index": k, "probability": float(p[k])}
        )
    return out


def format_predictions(rows: list[dict]) -> str:
    width = max(len(r["file"]) for r in rows)
    return "\n".join(f"{r['file']:<{width}}  {r['class']}  {r['probability']:.4f}" for r in rows)
