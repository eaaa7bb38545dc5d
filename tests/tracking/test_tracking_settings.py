"""train/tracking/settings.py: the MLflow section's hooks, as train/extras.py calls them."""

from __future__ import annotations

from train.config import Settings


def test_an_extra_adds_its_callback_only_when_its_setting_turns_it_on():
    from train import extras
    from train.tracking.mlflow_run import MlflowCallback

    def mlflow(settings):
        return [c for c in extras.callbacks(settings) if isinstance(c, MlflowCallback)]

    assert mlflow(Settings()) == []  # (an extra may be on in every run: the dvc extra looks at the data)
    (tracking,) = mlflow(Settings(mlflow_tracking_uri="http://127.0.0.1:5000"))
    assert tracking.tracker is None  # started at on_train_begin
