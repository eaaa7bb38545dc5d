"""schedules: the cosine learning rate follows the position in the training, not the optimizer's step
count: exactly Keras's CosineDecay until a batch size changes, and still ending at zero at the end of
the last epoch after AUTO_BATCH halves the batch or a resume changes BATCH_SIZE."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from train.training.schedules import OverTraining, needs_schedule


def _rate(schedule, iteration: int) -> float:
    return float(schedule(tf.constant(iteration, tf.int64)).numpy())


def test_until_a_batch_size_changes_it_is_kerass_cosine_decay_bit_for_bit():
    ours, keras_own = OverTraining(1e-3, 3, 7), keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=21)
    got = [ours(tf.constant(i, tf.int64)).numpy() for i in range(25)]
    expected = [keras_own(i).numpy() for i in range(25)]
    np.testing.assert_array_equal(got, expected)
    # A resume at the same batch size, where the optimizer's step is the position: the same again.
    ours.begin(epoch=1, step=3, steps_per_epoch=7, iteration=10)
    np.testing.assert_array_equal([ours(tf.constant(i, tf.int64)).numpy() for i in range(25)], expected)


def _cosine(initial: float, fraction: float) -> float:
    return initial * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0)))


def test_after_a_halving_each_step_is_half_a_step_of_the_batch_it_was_built_for():
    """Built for 2 epochs of 6 steps; the state of step 4 (batch 64) continues as step 8 of 12
    (batch 32) with the optimizer at step 4: the last of 16 further steps ends at zero."""
    schedule = OverTraining(1e-3, 2, 6)
    schedule.begin(epoch=0, step=8, steps_per_epoch=12, iteration=4)
    assert _rate(schedule, 4) == pytest.approx(_cosine(1e-3, 4 / 12), rel=1e-6)
    assert _rate(schedule, 8) == pytest.approx(5e-4, rel=1e-6)  # end of epoch 1: halfway
    assert _rate(schedule, 14) == pytest.approx(_cosine(1e-3, 9 / 12), rel=1e-6)
    assert _rate(schedule, 20) == pytest.approx(0.0, abs=1e-9)  # end of epoch 2: the end
    # A step count that runs on (it never should) stays at the end rather than rising again.
    assert _rate(schedule, 30) == pytest.approx(0.0, abs=1e-9)


def test_a_resume_with_a_larger_batch_counts_each_step_as_more_of_the_training():
    """Built for batch 64 (12 steps an epoch) on a resume from batch 32 (24 steps an epoch); the
    optimizer made 30 steps of 32 before: epoch 2 starts halfway, epoch 3 ends at zero."""
    schedule = OverTraining(1e-3, 3, 12)
    schedule.begin(epoch=1, step=6, steps_per_epoch=12, iteration=30)
    assert _rate(schedule, 30) == pytest.approx(_cosine(1e-3, 18 / 36), rel=1e-6)
    assert _rate(schedule, 48) == pytest.approx(0.0, abs=1e-9)


def test_a_new_stretch_is_seen_by_a_step_compiled_before_it():
    """The position lives in variables: a tf.function traced before begin() reads the new one."""
    schedule = OverTraining(1e-3, 2, 6)
    rate = tf.function(lambda i: schedule(i))
    assert float(rate(tf.constant(6, tf.int64))) == pytest.approx(5e-4, rel=1e-6)
    schedule.begin(epoch=0, step=8, steps_per_epoch=12, iteration=4)
    assert float(rate(tf.constant(8, tf.int64))) == pytest.approx(5e-4, rel=1e-6)
    assert float(rate(tf.constant(6, tf.int64))) == pytest.approx(_cosine(1e-3, 5 / 12), rel=1e-6)


def test_a_warm_up_rises_linearly_from_a_tenth_then_the_cosine_starts_at_the_peak():
    """2 epochs of 10 steps with half an epoch of warm-up: 5 steps from 1e-4 to 1e-3, then a
    cosine over the other 15 to zero."""
    schedule = OverTraining(1e-3, 2, 10, "cosine", warmup_epochs=0.5)
    assert _rate(schedule, 0) == pytest.approx(1e-4, rel=1e-6)
    assert _rate(schedule, 2) == pytest.approx(1e-4 + 2 / 5 * 9e-4, rel=1e-6)
    assert _rate(schedule, 5) == pytest.approx(1e-3, rel=1e-6)
    assert _rate(schedule, 5 + 15 // 2) == pytest.approx(_cosine(1e-3, 7 / 15), rel=1e-5)
    assert _rate(schedule, 20) == pytest.approx(0.0, abs=1e-9)


def test_a_constant_rate_with_a_warm_up_stays_at_the_peak_after_it():
    schedule = OverTraining(1e-3, 3, 10, "constant", warmup_epochs=1)
    assert _rate(schedule, 0) == pytest.approx(1e-4, rel=1e-6)
    assert [_rate(schedule, i) for i in (10, 17, 30)] == pytest.approx([1e-3] * 3, rel=1e-6)
    assert OverTraining(1e-3, 3, 10, "constant")(tf.constant(0, tf.int64)).numpy() == pytest.approx(1e-3)


def test_the_warm_up_counts_steps_of_the_batch_it_was_built_for():
    """Built for 10 steps an epoch, continued at 20 (the batch halved): the warm-up ends after 20
    optimizer steps, one epoch as before."""
    schedule = OverTraining(1e-3, 3, 10, "constant", warmup_epochs=1)
    schedule.begin(epoch=0, step=0, steps_per_epoch=20, iteration=0)
    assert _rate(schedule, 10) == pytest.approx(1e-4 + 0.5 * 9e-4, rel=1e-6)
    assert _rate(schedule, 20) == pytest.approx(1e-3, rel=1e-6)


def test_a_warm_up_longer_than_the_training_leaves_its_last_step_for_the_cosine():
    schedule = OverTraining(1e-3, 1, 4, "cosine", warmup_epochs=3)
    assert _rate(schedule, 3) == pytest.approx(1e-3, rel=1e-6)
    assert _rate(schedule, 4) == pytest.approx(0.0, abs=1e-9)


def test_only_a_schedule_of_a_known_shape_is_built():
    with pytest.raises(ValueError, match="shape='linear'"):
        OverTraining(1e-3, 1, 4, "linear")
    assert not needs_schedule("constant", 0.0) and needs_schedule("constant", 0.3) and needs_schedule("cosine", 0)
