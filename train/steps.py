"""The compiled train and validation steps, run through a tf.distribute strategy.

One code path for every case: no strategy (TensorFlow's default strategy stands in), one
process with several replicas (MirroredStrategy) and several processes (MultiWorkerMirroredStrategy,
where Keras 3's `model.fit` fails: tensorflow/tensorflow#72388, keras-team/keras#20585).

Each dataset element is (images, labels, global_count): a replica's slice of one global batch and
the size of that global batch, so the loss is the mean over the global batch whatever the split
(`sum(per_example) / global_count`); the optimizer sums the replicas' gradients.

A train call runs `n` steps in a `tf.range` loop (STEPS_PER_EXECUTION) and returns the sums of
loss, correct predictions and examples over those steps, plus the stop votes of all processes:
one all-reduce per call carries the metrics and the stop flag, so every process learns in the same
call that one of them was asked to stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import tensorflow as tf


@dataclass
class Totals:
    """Sums over the steps of one epoch (or of a validation pass)."""

    loss: float = 0.0
    correct: float = 0.0
    count: float = 0.0

    def add(self, values) -> None:
        self.loss += float(values[0])
        self.correct += float(values[1])
        self.count += float(values[2])

    def logs(self, prefix: str = "") -> dict[str, float]:
        if not self.count:
            return {}
        return {f"{prefix}loss": self.loss / self.count, f"{prefix}accuracy": self.correct / self.count}


class Steps:
    """The model's compiled steps under `strategy` (None: TensorFlow's default strategy)."""

    def __init__(self, model, strategy=None, jit_compile: bool = False):
        self.model = model
        self.strategy = strategy or tf.distribute.get_strategy()
        self._loss = keras.losses.SparseCategoricalCrossentropy(reduction=None)
        # JIT_COMPILE compiles the forward and backward pass with XLA; the optimizer update stays
        # outside it because it is a synchronisation point (a merge_call) under a strategy, which a
        # nested tf.function may not contain.
        wrap = (lambda fn: tf.function(fn, jit_compile=True, reduce_retracing=True)) if jit_compile else (lambda fn: fn)
        self._forward_backward, self._forward = wrap(self._replica_grads), wrap(self._replica_eval)
        self.train = tf.function(self._train_loop)
        self.evaluate = tf.function(self._eval_loop)

    # -- one replica, one step ----------------------------------------------------------------------
    def _sums(self, y, probs, per_example):
        correct = tf.cast(tf.equal(tf.cast(y, tf.int64), tf.argmax(probs, axis=-1)), tf.float32)
        return tf.stack([tf.reduce_sum(tf.cast(per_example, tf.float32)), tf.reduce_sum(correct),
                         tf.cast(tf.shape(y)[0], tf.float32)])

    def _replica_grads(self, x, y, global_count):
        model, optimizer = self.model, self.model.optimizer
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = self._loss(y, probs)
            # The mean over the global batch: each replica contributes its share of the sum.
            loss = tf.reduce_sum(tf.cast(per_example, tf.float32)) / tf.cast(global_count, tf.float32)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n([tf.cast(v, tf.float32) for v in model.losses]))
            scaled = optimizer.scale_loss(loss)  # mixed_float16: the LossScaleOptimizer's dynamic scale
        return tape.gradient(scaled, model.trainable_variables), self._sums(y, probs, per_example)

    def _replica_train(self, x, y, global_count):
        grads, sums = self._forward_backward(x, y, global_count)
        # Keras' optimizer sums the replicas' gradients (an all-reduce) before it applies them.
        self.model.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return sums

    def _replica_eval(self, x, y, global_count):
        probs = self.model(x, training=False)
        return self._sums(y, probs, self._loss(y, probs))

    # -- n steps, one call --------------------------------------------------------------------------
    def _train_loop(self, iterator, n, stop_vote):
        def replica(x, y, count, vote):
            return tf.concat([self._replica_train(x, y, count), [vote]], axis=0)

        return self._loop(iterator, n, replica, stop_vote)

    def _eval_loop(self, iterator, n):
        return self._loop(iterator, n, lambda x, y, count, vote: tf.concat([self._forward(x, y, count), [vote]], 0),
                          tf.constant(0.0))

    def _loop(self, iterator, n, replica, vote):
        total = tf.zeros([4], tf.float32)
        for _ in tf.range(n):
            x, y, count = next(iterator)
            per_replica = self.strategy.run(replica, args=(x, y, count, vote))
            total += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        # [loss sum, correct, examples, stop votes (summed over replicas and steps)]
        return total
