"""What the chief knows, sent to every worker through the strategy: no shared disk needed.

The chief alone reads the run directory (run id, checkpoint); the other workers receive the same
values by an all-reduce in which only replica 0 (on the chief) contributes. Values travel as
float64, exact for float32/float16 weights and for integers below 2**53.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import tensorflow as tf

RUN_ID_BYTES = 128


# One broadcast function a strategy, traced once for every length: a new function at every call
# (a resume makes a few) has TensorFlow warn of "excessive retracing" on stderr at the run's end.
_BROADCASTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _broadcast(strategy):
    if strategy not in _BROADCASTS:

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
        def broadcast(local):
            def replica():
                ctx = tf.distribute.get_replica_context()
                return tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), local, tf.zeros_like(local))

            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica), axis=None)

        _BROADCASTS[strategy] = broadcast
    return _BROADCASTS[strategy]


def from_chief(strategy, values: np.ndarray) -> np.ndarray:
    """`values` as the chief has them (others pass an array of the same shape; its content is ignored)."""
    local = np.asarray(values, dtype=np.float64)
    return _broadcast(strategy)(tf.constant(local.ravel())).numpy().reshape(local.shape)


def text_from_chief(strategy, text: str) -> str:
    raw = text.encode()[:RUN_ID_BYTES]
    arr = np.zeros(RUN_ID_BYTES, np.float64)
    arr[: len(raw)] = np.frombuffer(raw, np.uint8)
    got = from_chief(strategy, arr).astype(np.uint8)
    return bytes(got[got > 0]).decode()


def numbers_from_chief(strategy, numbers: list[float | None]) -> list[float | None]:
    """A short list of numbers (None travels as NaN and comes back as None)."""
    arr = np.array([math.nan if v is None else float(v) for v in numbers], np.float64)
    return [None if math.isnan(v) else float(v) for v in from_chief(strategy, arr)]


def variables_from_chief(strategy, variables) -> None:
    """Give every worker the chief's values of `variables` (model and optimizer state after a restore)."""
    variables = list(variables)
    if not variables:
        return
    flat = np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in variables])
    flat = from_chief(strategy, flat)
    offset = 0
    for v in variables:
        size = int(np.prod(v.shape))
        dtype = np.dtype(getattr(v.dtype, "name", v.dtype))
        v.assign(flat[offset : offset + size].reshape(tuple(v.shape)).astype(dtype))
        offset += size


def workers_with(strategy, index: int, workers: int, flag: bool) -> list[int]:
    """The indices of the workers that pass flag=True; every worker calls it at the same point."""
    local = np.zeros(workers, np.float64)
    local[index] = float(flag)
    local = tf.constant(local)

    @tf.function
    def gather():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(local)), axis=None)

    return [j for j, v in enumerate(gather().numpy()) if v > 0]
