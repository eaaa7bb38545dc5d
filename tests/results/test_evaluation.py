"""evaluation: confusion matrix, per-class accuracy and the most wrong images, from a run's best weights."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FixedModel, batch

from train.errors import NoWeightsError
from train.results.evaluation import _predict, evaluate_best


def test_matrix_per_class_and_the_most_wrong_across_batches():
    batches = [
        batch([[0.8, 0.2, 0.0], [0.6, 0.4, 0.0], [0.2, 0.0, 0.8]], [0, 1, 1]),  # p(true): 0.8, 0.4, 0.0
        batch([[0.0, 1.0, 0.0], [0.0, 0.2, 0.8], [0.1, 0.0, 0.9]], [1, 1, 2]),  # 1.0, 0.2, 0.9
        batch([[0.0, 0.4, 0.6], [1.0, 0.0, 0.0]], [1, 2]),  # 0.4, 0.0
    ]
    ev = _predict(FixedModel(), batches, ["a", "b", "c"], k=3)
    assert ev.matrix.tolist() == [[1, 0, 0], [1, 1, 3], [1, 0, 1]]
    assert ev.n == 8 and ev.accuracy == pytest.approx(3 / 8)
    # Least probability on the true class first; of equals, the earlier example first.
    assert ev.wrong_true.tolist() == [1, 2, 1] and ev.wrong_pred.tolist() == [2, 0, 2]
    assert ev.wrong_prob.tolist() == pytest.approx([0.8, 1.0, 0.8])
    assert ev.wrong_images.dtype == np.uint8 and ev.wrong_images.shape == (3, 2, 3, 1)
    assert ev.wrong_images[1, 0, :, 0].tolist() == [255, 0, 0]  # the image itself, not a copy of another
    per = ev.per_class()
    assert per[0] == {"class": "a", "examples": 1, "correct": 1, "accuracy": 1.0, "confused_with": None}
    assert per[1]["accuracy"] == pytest.approx(0.2) and per[1]["confused_with"] == ("c", 3)
    assert per[2]["confused_with"] == ("a", 1)


def test_no_mistakes_and_an_empty_class():
    ev = _predict(FixedModel(), [batch([[1.0, 0.0, 0.0]], [0])], ["a", "b", "c"], k=5)
    assert ev.wrong_images.shape == (0, 2, 3, 1) and ev.accuracy == 1.0
    assert ev.per_class()[1] == {"class": "b", "examples": 0, "correct": 0, "accuracy": None, "confused_with": None}


def test_a_run_without_best_weights_says_so(tmp_path):
    with pytest.raises(NoWeightsError, match="best.weights.h5 is missing: no epoch finished"):
        evaluate_best(tmp_path)
    # Moved aside, as a damaged file's message says to: the run did finish epochs.
    (tmp_path / "manifest.json").write_text('{"epochs_completed": 3}')
    with pytest.raises(NoWeightsError, match="is missing: moved or deleted, though 3 epoch.s. finished: put it back"):
        evaluate_best(tmp_path)


def test_the_class_names_are_the_runs_and_data_with_other_classes_is_refused(tmp_path):
    import json

    from builders import write_tiny_npz

    from train.config import Settings
    from train.errors import DataError
    from train.models import build_model

    npz = write_tiny_npz(tmp_path, classes=3)  # names 0, 1, 2
    run = tmp_path / "20260101-000000-000001"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings(dataset=f"npz:{npz}", model="cnn", batch_size=64).to_dict()))
    build_model("cnn", (28, 28, 1), 3).save_weights(run / "best.weights.h5")
    (run / "labels.txt").write_text("stale\ncopy\nhere\n")  # never read
    for names in (["0", "1", "2"], ["0", "1", "2", "3"]):
        (run / "manifest.json").write_text(json.dumps({"data": {"class_names": names, "input_shape": [28, 28, 1]}}))
        if len(names) == 3:
            assert evaluate_best(run).class_names == names
        else:
            with pytest.raises(
                DataError,
                match=rf"{npz} now holds other classes \(0, 1, 2\) than run {run.name} "
                r"trained on \(0, 1, 2, 3\): evaluate it on the data",
            ):
                evaluate_best(run)
    # The same classes, other examples: the data's fingerprint is not the one the run recorded.
    recorded = {"class_names": ["0", "1", "2"], "input_shape": [28, 28, 1], "fingerprint": "f" * 64}
    (run / "manifest.json").write_text(json.dumps({"data": recorded}))
    with pytest.raises(DataError, match=rf"{npz} is not the data run {run.name} trained on \(fingerprint \w{{12}}, "):
        evaluate_best(run)


def test_best_weights_that_are_not_the_ones_training_recorded_are_not_evaluated(tmp_path):
    import json

    from builders import write_tiny_npz

    from train.config import Settings
    from train.errors import WeightsError
    from train.models import build_model
    from train.run.weights import save_weights

    npz = write_tiny_npz(tmp_path, classes=3)
    run = tmp_path / "20260101-000000-000001"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings(dataset=f"npz:{npz}", model="cnn", batch_size=64).to_dict()))
    (run / "manifest.json").write_text(
        json.dumps({"data": {"class_names": ["0", "1", "2"], "input_shape": [28, 28, 1]}})
    )
    save_weights(build_model("cnn", (28, 28, 1), 3), run / "best.weights.h5", epoch=1)  # recorded in the manifest
    assert evaluate_best(run).n > 0
    build_model("cnn", (28, 28, 1), 3).save_weights(run / "best.weights.h5")  # other weights, a valid file
    with pytest.raises(WeightsError, match=f"run {run.name}: .*best.weights.h5"):
        evaluate_best(run)


def test_the_datas_warnings_said_in_training_are_not_said_again(tmp_path, caplog):
    """A fit with REPORT=full evaluates after training: the image folder's left-out files are one warning
    of the training, not a second one from the report."""
    import json

    from builders import write_image_dir

    from train.config import Settings
    from train.models import build_model
    from train.run.weights import save_weights

    root = write_image_dir(tmp_path / "images", classes=2, per_class=8, size=16)
    (root / "README.md").write_text("beside the class folders")
    (root / "class_0" / "notes.txt").write_text("not an image")
    run = tmp_path / "20260101-000000-000001"
    run.mkdir()
    settings = Settings(dataset=f"images:{root}", model="cnn", image_size=16, channels=3, batch_size=8)
    (run / "config.json").write_text(json.dumps(settings.to_dict()))
    (run / "manifest.json").write_text(
        json.dumps({"data": {"class_names": ["class_0", "class_1"], "input_shape": [16, 16, 3]}})
    )
    save_weights(build_model("cnn", (16, 16, 3), 2), run / "best.weights.h5", epoch=1)
    with caplog.at_level("INFO", logger="train"):
        assert evaluate_best(run).n > 0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
