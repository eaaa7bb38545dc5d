"""The batcher: concurrent requests share one model call, closed by size or by the wait, never split."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from train.serve.batcher import Batcher


def _images(n: int, value: int = 0) -> np.ndarray:
    return np.full((n, 2, 2, 1), value, np.uint8)


class Model:
    def __init__(self):
        self.calls: list[int] = []
        self.threads: set[str] = set()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append(len(batch))
        self.threads.add(threading.current_thread().name)
        return batch.reshape(len(batch), -1)[:, :1].astype(np.float32)  # each row answers its own first pixel


async def _run(batcher: Batcher, requests: list[np.ndarray]) -> list[np.ndarray]:
    batcher.start()
    try:
        return await asyncio.gather(*(batcher.predict(r) for r in requests))
    finally:
        await batcher.stop()


def test_concurrent_requests_are_one_model_call_and_each_gets_its_own_rows():
    model = Model()
    # The wait is long: the batch closes because it is full, not because time passed.
    out = asyncio.run(
        _run(Batcher(model, max_batch=6, max_wait=600), [_images(1, v) for v in range(4)] + [_images(2, 9)])
    )
    assert model.calls == [6]
    assert [o[:, 0].tolist() for o in out] == [[0.0], [1.0], [2.0], [3.0], [9.0, 9.0]]
    assert model.threads and all(t.startswith("model") for t in model.threads)  # never the event loop's thread


def test_a_request_that_does_not_fit_opens_the_next_batch_whole():
    model = Model()
    out = asyncio.run(_run(Batcher(model, max_batch=4, max_wait=0), [_images(3, 1), _images(2, 2), _images(1, 3)]))
    assert model.calls == [3, 3] and [len(o) for o in out] == [3, 2, 1]


def test_without_batching_every_request_is_its_own_call():
    model = Model()
    asyncio.run(_run(Batcher(model, max_batch=1, max_wait=0), [_images(1) for _ in range(5)]))
    assert model.calls == [1] * 5


def test_a_failing_model_call_fails_its_requests_and_the_batcher_goes_on():
    calls = []

    def model(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return np.zeros((len(batch), 1), np.float32)

    async def scenario():
        batcher = Batcher(model, max_batch=8, max_wait=0)
        batcher.start()
        try:
            first = await asyncio.gather(
                batcher.predict(_images(1)), batcher.predict(_images(1)), return_exceptions=True
            )
            second = await batcher.predict(_images(1))
        finally:
            await batcher.stop()
        return first, second

    first, second = asyncio.run(scenario())
    assert all(isinstance(e, RuntimeError) for e in first) and second.shape == (1, 1)


@pytest.mark.parametrize("wait", [0.0, 0.001])
def test_a_lone_request_is_answered_after_at_most_the_wait(wait):
    model = Model()
    out = asyncio.run(_run(Batcher(model, max_batch=32, max_wait=wait), [_images(1, 5)]))
    assert model.calls == [1] and out[0][0, 0] == 5.0
