"""Dynamic batching: the images of concurrent requests gathered into one model call.

A batch starts with the first request waiting and closes when it holds `max_batch` images or
`max_wait` seconds have passed since that request came, whichever is first; requests that come
while the model runs form the next batch. The model runs in one worker thread, never on the event
loop, so the server keeps accepting and decoding while it computes. A request is never split: one
that does not fit in the batch being gathered opens the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from .work import Pool


class Batcher:
    def __init__(self, run: Callable[[np.ndarray], np.ndarray], max_batch: int, max_wait: float):
        self.run, self.max_batch, self.max_wait = run, max_batch, max_wait
        self._queue: asyncio.Queue = asyncio.Queue()
        self._next: tuple | None = None  # a request that did not fit the last batch: it opens the next
        self.pool = Pool(1, "model")  # its running call is counted: the server does not wait for it when it stops
        self._task: asyncio.Task | None = None
        self.batches = 0  # model calls made, and the images they held: for the log and the tests
        self.images = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.pool.shutdown()

    async def predict(self, images: np.ndarray) -> np.ndarray:
        """The model's output for `images` (N, H, W, C) uint8, computed in a batch with others."""
        done = asyncio.get_running_loop().create_future()
        await self._queue.put((images, done))
        return await done

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [self._next or await self._queue.get()]
            self._next = None
            size, deadline = len(batch[0][0]), loop.time() + self.max_wait
            while size < self.max_batch:
                item = await self._one_more(deadline - loop.time())
                if item is None:
                    break
                if size + len(item[0]) > self.max_batch:
                    self._next = item
                    break
                batch.append(item)
                size += len(item[0])
            await self._call(batch)

    async def _one_more(self, timeout: float):
        if not self._queue.empty():
            return self._queue.get_nowait()
        if timeout <= 0:
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def _call(self, batch: list) -> None:
        images = np.concatenate([b[0] for b in batch]) if len(batch) > 1 else batch[0][0]
        try:
            out = await self.pool.run(self.run, images)
        except Exception as exc:  # noqa: BLE001  (each waiting request gets the failure, the server lives on)
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
            return
        self.batches, self.images = self.batches + 1, self.images + len(images)
        start = 0
        for part, done in batch:
            if not done.done():  # a client that went away cancelled its future
                done.set_result(out[start : start + len(part)])
            start += len(part)
