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


def test_mlflows_own_experiment_variables_are_refused_unless_they_name_the_same_experiment():
    """MLFLOW_EXPERIMENT_NAME is what MLflow's docs tell a user to set; the client here never reads it."""
    import pytest

    from train.config import load_settings
    from train.errors import ConfigError

    on = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000"}
    with pytest.raises(ConfigError, match=r"MLFLOW_EXPERIMENT_NAME='mnist'.*set MLFLOW_EXPERIMENT=mnist, and unset"):
        load_settings(env_file=None, environ={**on, "MLFLOW_EXPERIMENT_NAME": "mnist"})
    with pytest.raises(ConfigError, match=r"MLFLOW_EXPERIMENT_ID='7'.*set MLFLOW_EXPERIMENT to its name"):
        load_settings(env_file=None, environ={**on, "MLFLOW_EXPERIMENT": "mnist", "MLFLOW_EXPERIMENT_ID": "7"})
    same = {**on, "MLFLOW_EXPERIMENT": "mnist", "MLFLOW_EXPERIMENT_NAME": "mnist"}
    assert load_settings(env_file=None, environ=same).mlflow_experiment == "mnist"
    assert load_settings(env_file=None, environ={"MLFLOW_EXPERIMENT_NAME": "mnist"}).mlflow_tracking_uri == ""
