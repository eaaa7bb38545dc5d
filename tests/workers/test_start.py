"""start: every worker of a run trains in the chief's precision.

Only the chief measures PRECISION=auto's bfloat16 probe; a worker whose own choice differs takes
the chief's at the join. The real collective between two worker processes runs in the slow tests
of test_worker.py; here a stand-in strategy of one worker's replicas (test_sync.py) carries it.
"""

from __future__ import annotations

from types import SimpleNamespace

import keras
from test_sync import ReplicasOfOneWorker

from train.workers import start, sync


def _setup(precision: str, reason: str, strategy=None):
    keras.mixed_precision.set_global_policy(precision)
    return SimpleNamespace(strategy=strategy, precision=precision, precision_reason=reason)


def test_a_worker_whose_own_choice_differs_takes_the_chiefs_and_says_so(monkeypatch):
    monkeypatch.setattr(sync, "text_from_chief", lambda strategy, text: "float32")
    setup = _setup("mixed_bfloat16", "CPU has native bfloat16 (avx512_bf16)")
    start.take_the_chiefs_precision(setup)
    assert setup.precision == "float32" and keras.mixed_precision.global_policy().name == "float32"
    assert setup.precision_reason == (
        "the chief's choice; this worker alone would run mixed_bfloat16 (CPU has native bfloat16 (avx512_bf16))"
    )


def test_the_chief_keeps_its_own_choice_and_its_reason():
    reason = "CPU has native bfloat16 (avx512_bf16), but its bfloat16 convolution ran 0.55x float32's (a probe)"
    setup = _setup("float32", reason, ReplicasOfOneWorker([0]))  # replica 0: the chief's own text comes back
    start.take_the_chiefs_precision(setup)
    assert (setup.precision, setup.precision_reason) == ("float32", reason)
    assert keras.mixed_precision.global_policy().name == "float32"
