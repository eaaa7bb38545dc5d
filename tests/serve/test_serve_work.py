"""The decoding threads: a call is counted while its thread runs, even once nobody awaits it."""

from __future__ import annotations

import asyncio
import threading
import time

from train.serve.work import Pool


def test_a_call_whose_request_was_answered_is_counted_until_its_thread_returns():
    pool, started, release = Pool(1, "test"), threading.Event(), threading.Event()

    def held():
        started.set()
        release.wait(60)

    async def scenario():
        call = asyncio.ensure_future(pool.run(held))
        while not started.is_set():
            await asyncio.sleep(0.01)
        call.cancel()  # the request was answered (the drain ended): the thread runs on
        await asyncio.gather(call, return_exceptions=True)
        return pool.running

    try:
        assert asyncio.run(scenario()) == 1
    finally:
        release.set()
        pool.shutdown()
    deadline = time.monotonic() + 60
    while pool.running and time.monotonic() < deadline:  # the thread returns once released
        time.sleep(0.01)
    assert pool.running == 0
