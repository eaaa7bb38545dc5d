"""sync: what the chief knows reaches every worker, in one process.

The real case (two worker processes) is covered by the slow tests of test_worker.py. Here a
stand-in strategy runs the replica function as given replicas of one worker, which is enough to
check that only replica 0 contributes; the helpers built on `from_chief` are checked against a
stand-in for it that returns what the chief would send.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from train.workers import sync


class ReplicasOfOneWorker:
    """The part of tf.distribute a worker sees: its replicas run the function, the results are summed."""

    def __init__(self, replica_ids):
        self.replica_ids = replica_ids

    def run(self, fn):
        import tensorflow as tf

        results = []
        real = tf.distribute.get_replica_context
        for rid in self.replica_ids:
            context = SimpleNamespace(replica_id_in_sync_group=tf.constant(rid))
            tf.distribute.get_replica_context = lambda context=context: context
            try:
                results.append(fn())
            finally:
                tf.distribute.get_replica_context = real
        return results

    def reduce(self, op, per_replica, axis):
        import tensorflow as tf

        assert op == tf.distribute.ReduceOp.SUM and axis is None
        return tf.add_n(per_replica)


def test_the_chiefs_replica_sends_its_values_exactly():
    import tensorflow as tf

    values = np.array([1.5, -2.0, 2.0**52 + 1, 0.0])
    got = sync.from_chief(ReplicasOfOneWorker([0]), values)
    assert got.dtype == np.float64 and got.tolist() == values.tolist()
    assert sync.from_chief(ReplicasOfOneWorker([0]), [2**40 + 1, 3]).dtype == np.float64  # integers too
    # TensorFlow's default strategy (one process, one replica) is the chief's replica too.
    assert sync.from_chief(tf.distribute.get_strategy(), values).tolist() == values.tolist()


def test_every_other_replica_sends_zeros():
    values = np.array([3.0, 4.0])
    assert sync.from_chief(ReplicasOfOneWorker([1]), values).tolist() == [0.0, 0.0]
    assert sync.from_chief(ReplicasOfOneWorker([0, 1, 2]), values).tolist() == [3.0, 4.0]


def test_one_strategy_traces_its_broadcast_once_whatever_the_length():
    strategy = ReplicasOfOneWorker([0])
    for n in (128, 3, 1, 40):  # a run id, the loop state, the last wait, some variables
        assert sync.from_chief(strategy, np.arange(n, dtype=np.float64)).tolist() == list(range(n))
    assert sync.from_chief(strategy, np.ones((2, 3))).shape == (2, 3)
    assert sync._broadcast(strategy).experimental_get_tracing_count() == 1


def _chief_sends(monkeypatch, array):
    """from_chief stand-in: whatever this process passes, the chief's `array` comes back."""
    seen = []

    def fake(strategy, values):
        seen.append(np.asarray(values))
        assert seen[-1].shape == np.shape(array)
        return np.array(array, np.float64)

    monkeypatch.setattr(sync, "from_chief", fake)
    return seen


def test_text_arrives_whole_and_is_cut_to_its_fixed_size(monkeypatch):
    run_id = "20260101-120000-mnist-é\x01"  # every byte but NUL arrives
    raw = np.zeros(sync.RUN_ID_BYTES)
    raw[: len(run_id.encode())] = np.frombuffer(run_id.encode(), np.uint8)
    seen = _chief_sends(monkeypatch, raw)
    assert sync.text_from_chief(None, "") == run_id
    assert not seen[-1].any()  # a worker without the text sends zeros
    assert sync.text_from_chief(None, "ab").startswith(run_id)
    assert seen[-1][:3].tolist() == [ord("a"), ord("b"), 0]

    monkeypatch.undo()
    assert sync.text_from_chief(ReplicasOfOneWorker([0]), "x" * (sync.RUN_ID_BYTES + 5)) == "x" * sync.RUN_ID_BYTES


def test_numbers_keep_none_as_none(monkeypatch):
    seen = _chief_sends(monkeypatch, [2.0, math.nan, -1.0])
    got = sync.numbers_from_chief(None, [0.0, None, 7])
    assert got == [2.0, None, -1.0] and all(v is None or type(v) is float for v in got)
    assert seen[-1][0] == 0.0 and math.isnan(seen[-1][1]) and seen[-1][2] == 7.0

    monkeypatch.undo()
    assert sync.numbers_from_chief(ReplicasOfOneWorker([0]), [None, 1.25]) == [None, 1.25]


def test_variables_take_the_chiefs_values_in_order_shape_and_dtype(monkeypatch):
    import tensorflow as tf

    a = tf.Variable(np.zeros((2, 3), np.float32))
    b = tf.Variable(np.zeros(4, np.float16))
    c = tf.Variable(np.int64(0))
    seen = _chief_sends(monkeypatch, np.arange(11) + 0.5)
    sync.variables_from_chief(None, iter([a, b, c]))  # any iterable of variables
    assert seen[-1].tolist() == [0.0] * 11
    assert a.numpy().tolist() == [[0.5, 1.5, 2.5], [3.5, 4.5, 5.5]]
    assert b.numpy().dtype == np.float16 and b.numpy().tolist() == [6.5, 7.5, 8.5, 9.5]
    assert c.numpy() == 10


def test_no_variables_send_nothing(monkeypatch):
    seen = _chief_sends(monkeypatch, [])
    sync.variables_from_chief(None, [])
    assert seen == []


def test_variables_keep_their_values_on_the_chief():
    import tensorflow as tf

    v = tf.Variable(np.array([[1.0, -3.25]], np.float32))
    sync.variables_from_chief(ReplicasOfOneWorker([0]), [v])
    assert v.numpy().tolist() == [[1.0, -3.25]]


def test_workers_with_names_every_worker_that_raises_the_flag():
    # Each worker's replicas contribute at that worker's index; the sum names who raised it.
    assert sync.workers_with(ReplicasOfOneWorker([0]), 2, 3, True) == [2]
    assert sync.workers_with(ReplicasOfOneWorker([0, 1]), 1, 3, True) == [1]
    assert sync.workers_with(ReplicasOfOneWorker([0, 1]), 0, 3, False) == []
