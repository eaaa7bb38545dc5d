"""train/workers/settings.py: what the workers extra adds to the settings, and which of them every worker must share."""

from __future__ import annotations

from train.config import Settings, of_kind
from train.workers.settings import shared

# Read by each worker's own loop: when it checkpoints and when it stops.
LOOP = {"epochs", "patience", "min_delta", "checkpoint_every", "steps_per_execution"}


def test_every_setting_that_changes_the_result_is_shared_but_those_taken_from_the_chief_or_local():
    names = set(shared(Settings()))
    assert {"seed", "learning_rate", "model", "val_split", "smoke", "shuffle_buffer"} <= names
    # Taken from the chief at the join, or naming what is on this host alone.
    assert not names & {"batch_size", "precision", "dataset", "cache", "runs_dir", "data_dir", "worker_index"}
    assert names - LOOP <= of_kind("result")


def test_image_size_and_channels_are_shared_only_for_an_image_folder():
    assert not set(shared(Settings())) & {"image_size", "channels"}  # unused for MNIST: a leftover is harmless
    assert {"image_size", "channels"} <= set(shared(Settings(dataset="images:/data/flowers")))


def test_the_settings_each_workers_loop_reads_are_shared():
    """Another EPOCHS or CHECKPOINT_EVERY on one worker left the other in a collective for ever."""
    names = set(shared(Settings()))
    assert LOOP <= names
    assert shared(Settings(epochs=5)) != shared(Settings(epochs=3))
    assert shared(Settings(smoke=True, epochs=5)) == shared(Settings(smoke=True, epochs=3))  # SMOKE: one epoch
