"""stopping: the stop flag from the MAX_MINUTES budget (fake clock) and from real signals."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from train import stopping
from train.stopping import StopFlag


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(stopping.time, "monotonic", fake)
    return fake


def test_budget_expires_only_after_max_minutes(clock):
    flag = StopFlag(max_minutes=2)
    assert flag.deadline == 1000.0 + 120
    clock.t += 119
    assert not flag.check()
    clock.t += 1
    assert flag.check()
    assert (flag.status, flag.reason) == ("budget", "MAX_MINUTES reached")


def test_budget_counts_from_the_given_start(clock):
    flag = StopFlag(max_minutes=1, started=900.0)
    assert flag.check() and flag.status == "budget"


def test_no_budget_never_expires(clock):
    flag = StopFlag()
    clock.t += 1e9
    assert flag.deadline is None and not flag.check()


def test_first_request_wins(clock):
    flag = StopFlag(max_minutes=1)
    flag.request("received SIGTERM")
    clock.t += 3600
    assert flag.check()
    flag.request("something else", status="budget")
    assert (flag.reason, flag.status) == ("received SIGTERM", "interrupted")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_flag_and_handlers_are_restored(sig):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    flag = StopFlag()
    with flag.installed():
        os.kill(os.getpid(), sig)
        assert flag.check()
    assert flag.reason == f"received {signal.Signals(sig).name}" and flag.status == "interrupted"
    assert {s: signal.getsignal(s) for s in before} == before


def test_second_sigint_raises_keyboard_interrupt_and_still_restores():
    before = signal.getsignal(signal.SIGINT)
    flag = StopFlag()
    with pytest.raises(KeyboardInterrupt):
        with flag.installed():
            os.kill(os.getpid(), signal.SIGINT)
            assert flag.reason == "received SIGINT"
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_second_sigterm_only_keeps_the_flag():
    flag = StopFlag()
    with flag.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    assert flag.reason == "received SIGTERM"


def test_outside_the_main_thread_nothing_is_installed():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def worker():
        with StopFlag().installed() as flag:
            seen.append((flag, signal.getsignal(signal.SIGTERM)))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert isinstance(seen[0][0], StopFlag) and seen[0][1] is before
