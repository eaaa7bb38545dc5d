"""early_stop: PATIENCE and MIN_DELTA as Keras counts them, a count that survives a resume, the best weights exported."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import tiny_settings

from train.config import load_settings
from train.errors import ConfigError
from train.training.early_stopping import Patience, record_ending
from train.training.loop import LoopState


def run(p: Patience, values) -> list[int]:
    state = LoopState()
    waits = []
    for v in values:
        p.update(state, v)
        waits.append(state.patience_wait)
    return waits


def test_max_mode_counts_epochs_without_an_improvement_larger_than_min_delta():
    p = Patience(2, 0.01, "max", "val_accuracy")
    # 0.905 is better than 0.90 but not by more than 0.01: no improvement; 0.915 is.
    assert run(p, [0.90, 0.905, 0.915, 0.92, float("nan"), None]) == [0, 1, 0, 1, 2, 3]
    state = LoopState()
    for v in (0.90, 0.905, 0.915):
        p.update(state, v)
    assert (state.patience_reference, state.patience_wait) == (0.915, 0)


def test_min_mode_and_a_zero_delta():
    p = Patience(1, 0.0, "min", "val_loss")
    assert run(p, [0.5, 0.5, 0.4, 0.41]) == [0, 1, 0, 1]


def test_min_mode_counts_only_a_decrease_larger_than_min_delta():
    # Binary fractions, so the boundary is exact: a decrease of 0.125 or of exactly 0.25 does not
    # count, one of 0.375 does; a larger value never does.
    p = Patience(3, 0.25, "min", "val_loss")
    assert run(p, [1.0, 0.875, 0.75, 0.625, 0.5, 1.5]) == [0, 1, 2, 0, 1, 2]
    state = LoopState()
    for v in (1.0, 0.875, 0.75, 0.625, 0.5):
        p.update(state, v)
    assert (state.patience_reference, state.patience_wait) == (0.625, 1)  # 0.5 is only 0.125 below 0.625


def test_min_mode_stops_after_patience_epochs_of_improvements_smaller_than_min_delta():
    p = Patience(2, 0.1, "min", "loss")
    state = LoopState()
    for v in (2.0, 1.95, 1.91):  # each step down is under MIN_DELTA=0.1
        p.update(state, v)
    assert p.exhausted(state) and state.patience_reference == 2.0
    p.update(state, 1.5)  # 0.5 below the reference: an improvement, the count starts again
    assert not p.exhausted(state) and (state.patience_reference, state.patience_wait) == (1.5, 0)


def test_an_improvement_of_exactly_min_delta_does_not_count_in_either_mode():
    # Binary fractions: reference + MIN_DELTA is exact, so "more than" is tested at its edge.
    assert run(Patience(2, 0.25, "max", "val_accuracy"), [0.5, 0.75, 0.875]) == [0, 1, 0]
    assert run(Patience(2, 0.25, "min", "val_loss"), [1.0, 0.875, 0.75, 0.5]) == [0, 1, 2, 0]


def test_a_first_epoch_without_a_value_starts_the_count_at_one():
    p = Patience(2, 0.0, "max", "val_accuracy")
    assert run(p, [None]) == [1] and run(p, [float("nan"), 0.5]) == [1, 0]


@pytest.mark.parametrize("patience, wait, stops", [(0, 99, False), (3, 2, False), (3, 3, True), (1, 1, True)])
def test_exhausted_and_zero_is_off(patience, wait, stops):
    p = Patience(patience, 0.0, "max", "val_accuracy")
    assert p.exhausted(LoopState(patience_wait=wait)) is stops
    assert p.exhausted(LoopState()) is False


def test_the_reason_names_monitor_delta_patience_and_best():
    p = Patience(3, 0.001, "max", "val_accuracy")
    assert p.reason(LoopState(patience_wait=3, best=0.98765)) == (
        "early stopping: val_accuracy has not improved by more than MIN_DELTA=0.001 for 3 epochs (PATIENCE=3); "
        "best val_accuracy 0.9877, its weights are in best.weights.h5"
    )


def test_the_reason_of_a_state_without_a_count_or_a_best():
    # A state saved before its first counted epoch: no wait yet, no best value.
    assert Patience(2, 0.0, "max", "val_accuracy").reason(LoopState()) == (
        "early stopping: val_accuracy has not improved by more than MIN_DELTA=0 for 0 epochs (PATIENCE=2); "
        "best val_accuracy -, its weights are in best.weights.h5"
    )


def test_the_ending_goes_to_the_run_and_its_latest_segment(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"status": "running", "segments": [{"ended_because": "old"}, {"status": "running"}]}))
    record_ending(path, "all 3 epochs trained")
    m = json.loads(path.read_text())
    assert m["ended_because"] == "all 3 epochs trained"
    assert [s.get("ended_because") for s in m["segments"]] == ["old", "all 3 epochs trained"]


def test_only_the_last_of_several_segments_gets_the_ending(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"segments": [{}, {}, {}]}))
    record_ending(path, "stopped")
    assert [s.get("ended_because") for s in json.loads(path.read_text())["segments"]] == [None, None, "stopped"]


@pytest.mark.parametrize("segments", [None, [], ["not a segment"], "abc"])
def test_a_manifest_without_usable_segments_still_gets_the_ending(tmp_path, segments):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"status": "running"} if segments is None else {"segments": segments}))
    record_ending(path, "stopped")
    m = json.loads(path.read_text())
    assert m["ended_because"] == "stopped" and m.get("segments") == segments


def test_a_missing_manifest_is_written_with_the_ending(tmp_path):
    path = tmp_path / "manifest.json"
    record_ending(path, "stopped")
    assert json.loads(path.read_text()) == {"ended_because": "stopped"}


def test_the_logged_error_names_the_manifest_and_the_error(tmp_path, caplog, monkeypatch):
    import logging

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    monkeypatch.setattr(logging.getLogger("train"), "handlers", [])
    path = tmp_path / "manifest.json"
    path.write_text("[1, 2]")
    with caplog.at_level("ERROR", logger="train"):
        record_ending(path, "stopped")
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"could not record why the run ended in {path}: ") and "None" not in message


@pytest.mark.parametrize("content", ['{"status": "runn', "[1, 2]"])
def test_a_damaged_manifest_is_logged_not_raised(tmp_path, caplog, monkeypatch, content):
    import logging

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)

    monkeypatch.setattr(logging.getLogger("train"), "handlers", [])  # no handler left by an earlier test
    path = tmp_path / "manifest.json"
    path.write_text(content)
    with caplog.at_level("ERROR", logger="train"):
        record_ending(path, "all 3 epochs trained")
    assert "could not record why the run ended" in caplog.text and path.read_text() == content


@pytest.mark.parametrize("name, value", [("PATIENCE", "-1"), ("PATIENCE", "two"), ("MIN_DELTA", "-0.1")])
def test_bad_values_are_config_errors(name, value):
    with pytest.raises(ConfigError, match=name):
        load_settings({}, env_file=None, environ={name: value})


# --- in a real run ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_stops_early_says_why_and_exports_its_best_weights(tmp_path):
    import keras

    from train import train

    # MIN_DELTA=1: no accuracy can improve by more than 1, so after the first epoch none counts.
    result = train(tiny_settings(tmp_path, epochs=6, patience=2, min_delta=1.0, report="quick", export=True))
    d = result.run_dir
    assert result.status == "completed" and result.epochs_completed == 3
    m = json.loads((d / "manifest.json").read_text())
    assert m["ended_because"].startswith("early stopping: val_accuracy has not improved by more than MIN_DELTA=1")
    assert m["segments"][-1]["ended_because"] == m["ended_because"] and m["epochs_completed"] == 3
    assert m["ended_because"] in (d / "train.log").read_text()
    assert "ended: early stopping" in (d / "report.html").read_text()
    assert "export: from best.weights.h5" in (d / "train.log").read_text()
    exported = keras.models.load_model(d / "export" / "model.keras")
    best = keras.models.clone_model(exported)
    best.load_weights(d / "best.weights.h5")
    for a, b in zip(exported.get_weights(), best.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_the_count_survives_a_resume(tmp_path):
    from train import train

    # Two epochs: the first sets the reference, the second counts 1 of PATIENCE=2; then more epochs.
    s = tiny_settings(tmp_path, epochs=2, patience=2, min_delta=1.0, export=False)
    first = train(s)
    assert first.epochs_completed == 2
    again = train(s.replace(epochs=6), resume=first.run_dir.name)
    # Counted from the saved state: one more epoch reaches 2. Counted afresh it would stop after epoch 5.
    assert again.status == "completed" and again.epochs_completed == 3
    m = json.loads((first.run_dir / "manifest.json").read_text())
    assert m["segments"][0]["ended_because"] == "all 2 epochs trained"
    assert m["segments"][-1]["ended_because"].startswith("early stopping")
