"""train/workers/settings.py: what the workers extra adds to the settings, and which of them every worker must share."""

from __future__ import annotations

from train.config import Settings, of_kind
from train.workers.settings import shared


def test_every_setting_that_changes_the_result_is_shared_but_those_taken_from_the_chief_or_local():
    names = set(shared(Settings()))
    assert {"seed", "learning_rate", "model", "val_split", "smoke", "shuffle_buffer"} <= names
    # Taken from the chief at the join, or naming what is on this host alone.
    assert not names & {"batch_size", "precision", "dataset", "cache", "runs_dir", "data_dir", "worker_index"}
    assert names <= of_kind("result")


def test_image_size_and_channels_are_shared_only_for_an_image_folder():
    assert not set(shared(Settings())) & {"image_size", "channels"}  # unused for MNIST: a leftover is harmless
    assert {"image_size", "channels"} <= set(shared(Settings(dataset="images:/data/flowers")))
