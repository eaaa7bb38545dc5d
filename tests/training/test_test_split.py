"""test_split: the test split through the best and the final weights, once, at the end of a run."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FixedModel, batch


def test_mean_metrics_are_the_models_own_per_example_loss_and_metrics_averaged():
    from train.models import DEFAULT_ENTRY
    from train.training.test_split import mean_metrics

    probs = [[0.9, 0.1, 0.0], [0.2, 0.8, 0.0], [0.5, 0.25, 0.25]]
    data = [batch(probs[:2], [0, 0]), batch(probs[2:], [2])]
    got = mean_metrics(FixedModel(), data, DEFAULT_ENTRY)
    assert got["accuracy"] == pytest.approx(1 / 3)
    assert got["loss"] == pytest.approx(-(np.log(0.9) + np.log(0.2) + np.log(0.25)) / 3, rel=1e-3)
    assert mean_metrics(FixedModel(), [], DEFAULT_ENTRY) == {}


def test_a_data_set_without_a_separate_test_split_records_no_test(tmp_path):
    """An image folder, or a run recorded before validation was split off (its test split was its validation)."""
    from helpers import tiny_settings

    from train.inputs import pipeline as data
    from train.training.test_split import evaluate_test

    s = tiny_settings(tmp_path, val_from="test")
    assert evaluate_test(tmp_path, s, data.load_data(s), None, s.batch_size) is None  # nothing is built or read


def test_best_and_final_weights_of_the_same_bytes_take_one_pass_and_a_damaged_copy_is_still_refused(
    one_epoch_copy, monkeypatch
):
    from train import models
    from train.errors import WeightsError
    from train.inputs import pipeline as data
    from train.training import test_split

    s, run = one_epoch_copy  # one epoch: the best weights are the final ones
    passes = []
    real = test_split.mean_metrics
    monkeypatch.setattr(test_split, "mean_metrics", lambda *a: passes.append(1) or real(*a))
    spec = data.load_data(s)
    got = test_split.evaluate_test(run, s, spec, models, s.batch_size)
    assert len(passes) == 1 and got["weights"]["best"] == got["weights"]["final"]
    (run / "final.weights.h5").write_bytes(b"damaged")  # not loaded, but checked as a load checks it
    with pytest.raises(WeightsError, match="final.weights.h5"):
        test_split.evaluate_test(run, s, spec, models, s.batch_size)
