"""loop: the pure decisions of the epoch loop (monitor mode, improvement, divergence, OOM, AUTO_BATCH position,
steps per compiled call, progress mode, the typed state).

Training itself is covered end to end by test_fit.py and test_reliability.py.
"""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import pytest

from train.errors import DivergedError, OutOfMemoryError
from train.loop import (EpochLoop, LoopState, _improved, _monitor_mode, position_after_halving, progress_verbose,
                        steps_until)


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
                                 setup=types.SimpleNamespace(workers=1),
                                 state=LoopState(batch_size=64, epoch=1, step=3))


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
    loop.state = dataclasses.replace(loop.state, **state)
    with pytest.raises(OutOfMemoryError) as info:
        EpochLoop._out_of_memory(loop, 1, RuntimeError("OOM"))
    assert f"batch size {loop.state.batch_size}" in str(info.value) and "BATCH_SIZE" in str(info.value)


def test_oom_with_several_workers_is_an_error_even_with_auto_batch():
    loop = _loop(auto_batch=True)
    loop.setup.workers = 2
    with pytest.raises(OutOfMemoryError):
        EpochLoop._out_of_memory(loop, 1, RuntimeError("OOM"))


@pytest.mark.parametrize("saved, old, expected_step", [
    (LoopState(step=5, batch_size=32), 32, 10),  # 160 examples in, batches of 16
    (LoopState(step=5, batch_size=16), 16, 10),  # a second halving counts in the saved state's own batches
    (LoopState(step=3, batch_size=0), 32, 6),  # an old header without batch_size: the batch in use
    (LoopState(step=7, batch_size=9), 9, 15),  # odd batch: whole batches of the new size, never past the position
])
def test_auto_batch_position_carries_over_in_examples(saved, old, expected_step):
    got = position_after_halving(saved, old, halvings=2)
    assert got.batch_size == old // 2 and got.step == expected_step and got.batch_halvings == 2
    assert got.step * got.batch_size <= saved.step * (saved.batch_size or old)


@pytest.mark.parametrize("left, per_exec, global_step, every, expected", [
    (100, 1, 0, 4, 1), (100, 8, 0, 0, 8), (3, 8, 0, 0, 3),  # never past the epoch's end
    (100, 8, 6, 4, 2),  # stops on the next checkpoint boundary (global step 8)
    (100, 4, 24, 8, 4),
])
def test_steps_per_call(left, per_exec, global_step, every, expected):
    assert steps_until(left, per_exec, global_step, every) == expected


def test_progress_bar_on_a_terminal_one_line_otherwise():
    assert progress_verbose("auto", True) == 1 and progress_verbose("auto", False) == 0
    assert progress_verbose("bar", False) == 1 and progress_verbose("line", True) == 0


def test_state_from_a_checkpoint_header_keeps_known_keys_only():
    meta = {"epoch": 2, "step": 4, "global_step": 28, "best": 0.5, "batch_halvings": 0, "model_variables": [[1]]}
    state = LoopState.from_meta(meta, default_batch=32)
    assert state == LoopState(epoch=2, step=4, global_step=28, best=0.5, batch_size=32)
    assert "model_variables" not in state.to_dict()
