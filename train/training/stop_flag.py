"""A stop flag raised by SIGTERM/SIGINT/SIGHUP or by the MAX_MINUTES budget, checked at step boundaries.

The handler is installed when a run starts (before the run directory, TensorFlow and the data), so
a signal at any moment only sets the flag: start-up checks it between its parts, the training step
in progress finishes, a resumable state is saved when there is a model to save, and the run returns
with status 'interrupted' or 'budget' (exit code 75 at the CLI). A second SIGINT falls back to
Python's default (KeyboardInterrupt) for a user who really means it. A flag installed inside
another's (a sweep's trial runs with its own) passes a signal on to the outer one, which would
otherwise never hear of it: the sweep must not start its next trial after its run took a SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time

from ..errors import SecondInterrupt
from ..run.train_log import terminal_gone

log = logging.getLogger("train")

STARTING = "stopping before training starts"
TRAINING = "finishing the current call of steps, then saving"


class StopFlag:
    def __init__(self, max_minutes: float = 0.0, started: float | None = None):
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + max_minutes * 60 if max_minutes else None
        self.reason: str | None = None
        self.status = "interrupted"
        # What a stop does now, said when it arrives: start-up stops at its next check, before any step
        # of this start (the loop says "steps" once it runs them); once training is over none are left.
        self.then = STARTING
        self._installed = False
        self._interrupts = 0  # Ctrl-Cs received
        self._saying: threading.Thread | None = None  # a signal's line, said from a thread of its own

    def request(self, reason: str, status: str = "interrupted", from_handler: bool = False) -> None:
        if self.reason is None:
            self.reason, self.status = reason, status
            if not from_handler:
                log.info("%s: %s", reason, self.then)
                return
            # A signal can land while this thread is inside a log line's write: writing another line to
            # the same stream from there is refused ("reentrant call"), and logging prints that error
            # with its traceback. A thread of its own waits for the line in progress to end instead.
            self._saying = threading.Thread(target=log.info, args=("%s: %s", reason, self.then), name="stop-line")
            self._saying.start()

    def passed_on(self, reason: str) -> None:
        """A signal that a flag installed inside this one took: set, without saying it a second time."""
        if self.reason is None:
            self.reason, self.status = reason, "interrupted"

    def check(self) -> bool:
        """True when the loop should stop now (a signal arrived, or the budget is spent)."""
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.request("MAX_MINUTES reached", status="budget")
        if self._saying is not None:  # the signal's line comes before whatever the stop does next
            self._saying.join()
            self._saying = None
        return self.reason is not None

    @contextlib.contextmanager
    def installed(self):
        """Route SIGTERM/SIGINT/SIGHUP to the flag while training (only possible in the main thread)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            yield self  # already routed (the run installs it first, the loop again), or not possible
            return

        def handler(signum, _frame):
            name = signal.Signals(signum).name
            if signum == signal.SIGINT:
                # Only a second Ctrl-C stops at once: a SIGTERM to a whole service (systemd signals every
                # process) reaches the run, then the Ctrl-C that invoke makes of its own SIGTERM.
                self._interrupts += 1
                if self._interrupts > 1:
                    raise SecondInterrupt
            if signum == signal.SIGHUP:
                terminal_gone()  # the terminal hung up: writing to it would fail the run
            self.request(f"received {name}", from_handler=True)
            outer = getattr(previous.get(signum), "stop_flag", None)
            if outer is not None:
                outer.passed_on(f"received {name}")

        handler.stop_flag = self  # type: ignore[attr-defined]  (how a flag installed inside this one finds it)
        previous: dict = {}  # filled as each is replaced: a signal may come between the two
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            # SIGHUP: the terminal went away (an SSH connection dropped). Under nohup it stays ignored.
            if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, handler)
        self._installed = True
        try:
            yield self
        finally:
            self._installed = False
            for sig, old in previous.items():
                signal.signal(sig, old)
