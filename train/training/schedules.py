"""LR_SCHEDULE=cosine: a learning rate that follows how much of the training is done.

Keras's schedules count optimizer steps. An epoch's number of steps changes when AUTO_BATCH halves
the batch or a forced resume changes BATCH_SIZE, and a schedule counted in steps would then reach
its end too early (halfway through what is left, after one halving). This one counts in steps of the
batch size it was built for: the loop tells it where each stretch of training starts (`begin`),
and every optimizer step after that is worth `built_steps_per_epoch / steps_per_epoch` of them.
Until a batch size changes, it gives exactly Keras's CosineDecay at the optimizer's step.

It is never serialized: the export is an uncompiled copy of the model, checkpoints hold the
optimizer's variables only, and the loop calls `begin` from the saved position on every start.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class CosineOverTraining(keras.optimizers.schedules.LearningRateSchedule):
    """From `initial` to 0 along a cosine over `epochs` epochs of `steps_per_epoch` steps."""

    def __init__(self, initial: float, epochs: int, steps_per_epoch: int):
        self.steps_per_epoch = steps_per_epoch
        self.cosine = keras.optimizers.schedules.CosineDecay(initial, decay_steps=max(epochs * steps_per_epoch, 1))
        # Variables, not Python numbers: the compiled training step reads them, so a new stretch
        # needs no new trace. Build the schedule outside a strategy's scope: plain variables, which
        # every replica only reads and every process sets to the same values. No model or optimizer
        # tracks them, so no name, trainable flag or checkpoint is needed.
        self.start = tf.Variable(0.0)
        self.start_iteration = tf.Variable(0, dtype=tf.int64)
        self.scale = tf.Variable(1.0)

    def begin(self, epoch: int, step: int, steps_per_epoch: int, iteration: int) -> None:
        """Training continues at `step` of `epoch`, in epochs of `steps_per_epoch` steps, when the
        optimizer has made `iteration` steps."""
        scale = self.steps_per_epoch / steps_per_epoch  # exactly 1.0 at the batch size built for
        self.start.assign((epoch * steps_per_epoch + step) * scale)
        self.start_iteration.assign(iteration)
        self.scale.assign(scale)

    def __call__(self, step):
        # Integers below 2**24 are exact in float32, so at scale 1 this is the step itself.
        done = self.start + tf.cast(tf.cast(step, tf.int64) - self.start_iteration, tf.float32) * self.scale
        return self.cosine(done)
