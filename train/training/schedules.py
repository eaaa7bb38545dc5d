"""The learning rate over the training: a linear warm-up, then constant or a cosine to zero.

Keras's schedules count optimizer steps. An epoch's number of steps changes when AUTO_BATCH halves
the batch or a forced resume changes BATCH_SIZE, and a schedule counted in steps would then reach
its end too early (halfway through what is left, after one halving). This one counts in steps of the
batch size it was built for: the loop tells it where each stretch of training starts (`begin`),
and every optimizer step after that is worth `built_steps_per_epoch / steps_per_epoch` of them.
Until a batch size changes, it gives exactly Keras's CosineDecay at the optimizer's step.

The warm-up is counted in epochs, not as a share of EPOCHS, so a resume that changes EPOCHS (free
under a constant schedule) leaves the first steps' rates as they were. It starts from a tenth of
the rate: Adam's first updates are the largest relative to the weights, and a large rate scaled up
with the batch size would throw the untrained model far from where it started.

It is never serialized: the export is an uncompiled copy of the model, checkpoints hold the
optimizer's variables only, and the loop calls `begin` from the saved position on every start.
"""

from __future__ import annotations

import keras
import tensorflow as tf

WARMUP_START = 0.1  # the warm-up rises from this fraction of the rate


class OverTraining(keras.optimizers.schedules.LearningRateSchedule):
    """`warmup_epochs` of linear rise to `initial`, then `shape` ("cosine": to 0 at the end of
    `epochs` epochs of `steps_per_epoch` steps; "constant": `initial` to the end)."""

    def __init__(self, initial: float, epochs: int, steps_per_epoch: int, shape: str = "cosine", warmup_epochs=0.0):
        if shape not in ("cosine", "constant"):
            raise ValueError(f"shape={shape!r}: cosine or constant")
        self.steps_per_epoch = steps_per_epoch
        total = max(epochs * steps_per_epoch, 1)
        warmup = min(round(warmup_epochs * steps_per_epoch), total - 1)
        # alpha is where the cosine ends, as a fraction of the rate: 1.0 keeps it constant.
        alpha = 0.0 if shape == "cosine" else 1.0
        if warmup > 0:
            self.curve = keras.optimizers.schedules.CosineDecay(
                initial * WARMUP_START, total - warmup, alpha=alpha, warmup_target=initial, warmup_steps=warmup
            )
        else:
            self.curve = keras.optimizers.schedules.CosineDecay(initial, total, alpha=alpha)
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
        return self.curve(done)


def needs_schedule(lr_schedule: str, warmup_epochs: float) -> bool:
    """Whether the rate moves at all: a constant rate without warm-up is a plain number."""
    return lr_schedule != "constant" or warmup_epochs > 0
