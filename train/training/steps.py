"""The compiled train and validation steps, run through a tf.distribute strategy.

One code path for every case: no strategy (TensorFlow's default strategy stands in), one
process with several replicas (MirroredStrategy) and several processes (MultiWorkerMirroredStrategy,
where Keras 3's `model.fit` fails: tensorflow/tensorflow#72388, keras-team/keras#20585).

Each dataset element is (images, labels, global_count): a replica's slice of one global batch and
the size of that global batch, so the loss is the mean over the global batch whatever the split
(`sum(per_example) / global_count`); the optimizer sums the replicas' gradients.

The loss and the metrics are the model's (train.models: per-example values; the defaults are
cross-entropy and accuracy). A train call runs `n` steps in a `tf.range` loop (STEPS_PER_EXECUTION)
and returns the sums of the loss, of each metric and of the examples over those steps, plus the
stop votes of all processes:
one all-reduce per call carries the metrics and the stop flag, so every process learns in the same
call that one of them was asked to stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tensorflow as tf


@dataclass
class Totals:
    """Sums over the steps of one epoch (or of a validation pass): [loss, *metrics, examples, votes]."""

    metrics: tuple[str, ...] = ("accuracy",)
    loss: float = 0.0
    sums: list[float] = field(default_factory=list)
    count: float = 0.0

    def add(self, values) -> None:
        k = len(self.metrics)
        self.loss += float(values[0])
        self.sums = [a + float(b) for a, b in zip(self.sums or [0.0] * k, values[1 : 1 + k])]
        self.count += float(values[1 + k])

    def logs(self, prefix: str = "") -> dict[str, float]:
        if not self.count:
            return {}
        return {
            f"{prefix}loss": self.loss / self.count,
            **{f"{prefix}{m}": v / self.count for m, v in zip(self.metrics, self.sums)},
        }


class Steps:
    """The model's compiled steps under `strategy` (None: TensorFlow's default strategy)."""

    def __init__(self, model, strategy=None, jit_compile: bool = False, task=None):
        from ..models import DEFAULT_ENTRY

        self.model, task = model, task or DEFAULT_ENTRY
        self.strategy = strategy or tf.distribute.get_strategy()
        # Per example: the step itself takes the mean over the global batch, whatever the replicas' share.
        self._loss, self._metrics = task.loss(reduction=None), dict(task.metrics)
        # JIT_COMPILE compiles the forward and backward pass with XLA; the optimizer update stays
        # outside it because it is a synchronisation point (a merge_call) under a strategy, which a
        # nested tf.function may not contain.
        wrap = (
            (lambda fn: tf.function(fn, jit_compile=True, reduce_retracing=True, autograph=False))
            if jit_compile
            else (lambda fn: fn)
        )
        self._forward_backward, self._forward = wrap(self._replica_grads), wrap(self._replica_eval)
        # No AutoGraph: the steps hold no Python control flow on tensors (the loop is a tf.while_loop),
        # and converting them cost a third of a second in every process that trains. A model's own
        # call is not converted either way: Keras' modules are outside AutoGraph's reach.
        self.train = tf.function(self._train_loop, autograph=False)
        self.evaluate = tf.function(self._eval_loop, autograph=False)

    # -- one replica, one step ----------------------------------------------------------------------
    def _sums(self, y, probs, per_example):
        metrics = [tf.reduce_sum(tf.cast(fn(y, probs), tf.float32)) for fn in self._metrics.values()]
        return tf.stack(
            [tf.reduce_sum(tf.cast(per_example, tf.float32)), *metrics, tf.cast(tf.shape(y)[0], tf.float32)]
        )

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
        return self._loop(iterator, n, self._replica_train, stop_vote)

    def _eval_loop(self, iterator, n):
        return self._loop(iterator, n, self._forward, tf.constant(0.0))

    def _loop(self, iterator, n, sums, vote):
        def replica(x, y, count, vote):
            return tf.concat([sums(x, y, count), [vote]], axis=0)

        def step(i, total):
            x, y, count = next(iterator)
            per_replica = self.strategy.run(replica, args=(x, y, count, vote))
            return i + 1, total + self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        start = (tf.constant(0), tf.zeros([len(self._metrics) + 3], tf.float32))
        _, total = tf.while_loop(lambda i, _: i < n, step, start)
        # [loss sum, each metric's sum, examples, stop votes (summed over replicas and steps)]
        return total
