"""loop: the pure decisions of the epoch loop (monitor mode, improvement, divergence, OOM without AUTO_BATCH).

Training itself is covered end to end by test_fit.py and test_reliability.py.
"""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest

from train.errors import DivergedError, OutOfMemoryError
from train.loop import EpochLoop, _improved, _monitor_mode


def _settings(**kw):
    base = {"monitor": "val_accuracy", "monitor_mode": "auto", "learning_rate": 1e-3, "auto_batch": False}
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("monitor, mode, expected", [
    ("val_accuracy", "auto", "max"), ("accuracy", "auto", "max"), ("val_loss", "auto", "min"),
    ("loss", "auto", "min"), ("val_loss", "max", "max"), ("val_accuracy", "min", "min"),
])
def test_monitor_mode(monitor, mode, expected):
    assert _monitor_mode(_settings(monitor=monitor, monitor_mode=mode)) == expected


def test_improved():
    assert _improved(0.5, None, "max") and _improved(0.6, 0.5, "max") and not _improved(0.5, 0.5, "max")
    assert _improved(0.4, 0.5, "min") and not _improved(0.6, 0.5, "min")
    assert not _improved(None, None, "max")
    assert not _improved(math.nan, None, "max") and not _improved(math.inf, 1.0, "max")


def _loop(**settings):
    return types.SimpleNamespace(s=_settings(**settings), run_dir=Path("/runs/r1"),
                                 state={"batch_size": 64, "epoch": 1, "step": 3})


@pytest.mark.parametrize("key", ["loss", "val_loss"])
def test_non_finite_loss_is_diverged_naming_what_to_change(key):
    with pytest.raises(DivergedError) as info:
        EpochLoop._check_finite(_loop(), {"loss": 0.1, key: math.nan}, epoch=1)
    msg = str(info.value)
    assert f"{key} is nan in epoch 2" in msg and "/runs/r1/checkpoints" in msg and "LEARNING_RATE (now 0.001)" in msg


def test_finite_losses_pass():
    EpochLoop._check_finite(_loop(), {"loss": 0.1, "val_loss": 0.2, "accuracy": math.nan}, epoch=0)


@pytest.mark.parametrize("auto_batch, state", [(False, {}), (True, {"batch_halvings": 3}), (True, {"batch_size": 1})])
def test_out_of_memory_without_room_to_halve_names_the_remedies(auto_batch, state):
    loop = _loop(auto_batch=auto_batch)
    loop.state.update(state)
    with pytest.raises(OutOfMemoryError) as info:
        EpochLoop._out_of_memory(loop, 1, RuntimeError("OOM"))
    assert f"batch size {loop.state['batch_size']}" in str(info.value) and "BATCH_SIZE" in str(info.value)
