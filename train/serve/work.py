"""Where request bodies become images: threads of the server's own, in two lanes, each bounded.

A request is light while its body is at most LIGHT_BYTES and its image files declare at most
LIGHT_PIXELS (what a few milliseconds of decoding cost); anything more is heavy. Light requests
are parsed and decoded in threads heavy ones never take, so a stream of large or hostile requests
cannot make a small valid one wait behind it; heavy ones run at most `heavy` at a time (half the
cores), with as many more waiting. Past that a request is refused at once with 503 and Retry-After,
never queued without end; a request whose files declare more than SERVE_MAX_PIXELS in all is
refused (413) before any of it is decoded. Each request runs in one thread at a time.

A heavy body is only read with a slot of its own (twice the heavy lane's, as many more waiting), taken
by its Content-Length before a byte is read, or once a chunked body passes LIGHT_BYTES: past that a
large upload is refused (503) unread, so many clients posting large bodies at once cannot take the
server's memory with bodies its heavy lane would refuse anyway.

Every call's thread is counted until it returns, even after its request was answered: a decode or
a model call cannot be interrupted, so the server knows what it would wait for when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from .payloads import Pending, RequestError

T = TypeVar("T")
LIGHT_BYTES = 1_000_000  # a JSON body this size parses in about 20 ms
LIGHT_PIXELS = 4_000_000  # images of this many pixels in all decode in about 15 ms on one core
LIGHT_WAITING = 128  # light requests in line before the next is refused (each holds at most LIGHT_BYTES)


class Pool:
    """A thread pool whose calls still running are counted, whether or not anyone awaits them."""

    def __init__(self, threads: int, name: str):
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._calls: set[Future] = set()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        future = self._executor.submit(fn, *args)
        self._calls.add(future)
        future.add_done_callback(self._calls.discard)
        return await asyncio.wrap_future(future)

    @property
    def running(self) -> int:
        return sum(1 for call in list(self._calls) if call.running())

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)  # a running call cannot be stopped anyway


class Lane:
    """At most `slots` requests at once and `waiting` more in line; the next is refused (503)."""

    def __init__(self, slots: int, waiting: int, busy: str):
        self._free, self._waiting, self.limit, self.busy = asyncio.Semaphore(slots), 0, waiting, busy

    @contextlib.asynccontextmanager
    async def slot(self):
        if self._free.locked() and self._waiting >= self.limit:
            raise RequestError("server", None, f"busy with {self.busy}; retry in a second", 503, retry_after=1)
        self._waiting += 1
        try:
            await self._free.acquire()
        finally:
            self._waiting -= 1
        try:
            yield
        finally:
            self._free.release()


class Decoder:
    """The two lanes, their threads and the pixel budget of one request (SERVE_MAX_PIXELS)."""

    def __init__(self, max_pixels: int, cpus: int | None = None):
        cpus = cpus or len(os.sched_getaffinity(0))
        light, heavy = max(2, cpus), max(1, cpus // 2)
        self.max_pixels = max_pixels
        self.pool = Pool(light + heavy, "decode")
        self.light = Lane(light, LIGHT_WAITING, f"{LIGHT_WAITING} requests waiting")
        large = f"large requests (over {LIGHT_BYTES // 1_000_000} MB or {LIGHT_PIXELS // 1_000_000} million pixels)"
        self.heavy = Lane(heavy, heavy, large)
        self.reading = Lane(2 * heavy, 2 * heavy, large)

    async def images(self, size: int, parse: Callable[[], tuple[Pending, T]]) -> tuple[np.ndarray, T]:
        """(images, what else `parse` returns): `parse` (of a body of `size` bytes) and the decoding in
        a thread of the lane the request's cost puts it in."""
        if size > LIGHT_BYTES:
            async with self.heavy.slot():
                return await self.pool.run(self._parse, parse, True)
        async with self.light.slot():
            images, rest = await self.pool.run(self._parse, parse, False)
        if isinstance(images, Pending):  # its files declare more pixels than a light request's
            async with self.heavy.slot():
                images = await self.pool.run(images.decode)
        return images, rest

    def _parse(self, parse: Callable[[], tuple[Pending, T]], heavy: bool) -> tuple[np.ndarray | Pending, T]:
        pending, rest = parse()
        if pending.pixels > self.max_pixels:
            raise RequestError(
                "images",
                f"{pending.pixels:,} pixels",
                f"more than SERVE_MAX_PIXELS={self.max_pixels:,} in one request; resize the images before "
                f"sending (the model takes {'x'.join(map(str, pending.shape))}) or split the request",
                status=413,
            )
        if heavy or pending.pixels <= LIGHT_PIXELS:
            return pending.decode(), rest
        return pending, rest

    @property
    def running(self) -> int:
        return self.pool.running

    def shutdown(self) -> None:
        self.pool.shutdown()
