"""predict: class and probability per image file, from a run's best weights (no export) or its SavedModel."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from train.config import Settings
from train.models import build_model
from train.predict import format_predictions, predict_files


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "20260101-000000-aaaa"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings(model="cnn").to_dict()))
    (run / "manifest.json").write_text(
        json.dumps({"data": {"input_shape": [28, 28, 1], "class_names": ["cat", "dog", "eel"]}})
    )
    model = build_model("cnn", (28, 28, 1), 3)
    model.save_weights(run / "best.weights.h5")
    return run, model


def _png(path, value):
    Image.fromarray(np.full((28, 28), value, np.uint8)).save(path)
    return str(path)


def test_predict_from_best_weights_matches_the_model(run_dir, tmp_path):
    run, model = run_dir
    files = [_png(tmp_path / "a.png", 0), _png(tmp_path / "b.png", 200)]
    rows = predict_files(run, files)
    expected = np.asarray(model(np.stack([np.full((28, 28, 1), v, np.float32) for v in (0, 200)]), training=False))
    for row, probs in zip(rows, expected):
        k = int(np.argmax(probs))
        assert row["index"] == k and row["class"] == ["cat", "dog", "eel"][k]
        assert row["probability"] == pytest.approx(float(probs[k]), rel=1e-5)
    assert [r["file"] for r in rows] == files


def test_format_predictions_aligns_the_columns():
    out = format_predictions(
        [
            {"file": "a.png", "class": "cat", "probability": 0.5},
            {"file": "long/b.png", "class": "dog", "probability": 0.98765},
        ]
    )
    assert out.splitlines() == ["a.png       cat  0.5000", "long/b.png  dog  0.9877"]


def test_predict_with_the_export_names_classes_from_the_manifest(run_dir, tmp_path):
    """export/labels.txt is a copy for serving code; predict reads the manifest like every reader."""
    from train.errors import ExportError
    from train.export import write_savedmodel

    run, model = run_dir
    write_savedmodel(model, run / "export" / "savedmodel")
    (run / "export" / "labels.txt").write_text("x\ny\nz\n")
    (run / "best.weights.h5").unlink()  # the export is what predicts
    rows = predict_files(run, [_png(tmp_path / "a.png", 0)])
    assert rows[0]["class"] == ["cat", "dog", "eel"][rows[0]["index"]]
    # An export older than a change of data (other classes) is refused, not mislabelled.
    data = {"input_shape": [28, 28, 1], "class_names": ["cat", "dog"]}
    (run / "manifest.json").write_text(json.dumps({"data": data}))
    with pytest.raises(ExportError, match="predicts 3 classes but the run has 2.*python -m train export"):
        predict_files(run, [_png(tmp_path / "a.png", 0)])
