"""Console + train.log: the same lines in both, one format for every process of a run."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import sys
from pathlib import Path

log = logging.getLogger("train")


class _Console(logging.StreamHandler):
    """stdout: a log line that comes while a progress bar's line is open (a stop signal's, mid-epoch)
    starts a line of its own instead of being glued to the bar."""

    line_open = False  # a progress bar wrote its line without the newline yet (one console per process)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "file_only", False):  # the command's edge prints it (an error's one line)
            return
        super().emit(record)

    def format(self, record: logging.LogRecord) -> str:
        # Here, not in emit: StreamHandler.emit handles a failed write (a console that hung up) for it.
        if _Console.line_open:
            _Console.line_open = False
            return "\n" + super().format(record)
        return super().format(record)


def progress_line(is_open: bool) -> None:
    """Say whether a progress bar on the console has written its line without ending it."""
    _Console.line_open = is_open


def end_progress_line() -> None:
    """End a progress bar's line left open (a stop or an error before the epoch's last step)."""
    if _Console.line_open:
        _Console.line_open = False
        with on_the_console():
            print(flush=True)


@contextlib.contextmanager
def on_the_console():
    """Writes to the console, which may have hung up (its SSH connection dropped): then every write
    to it fails (EIO) until the SIGHUP that follows stops the run, and the run must not fail while it
    saves. Such a console is let go (terminal_gone); train.log has every line."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        terminal_gone()


def terminal_gone() -> None:
    """Point stdout and stderr, where they are a terminal that hung up, at /dev/null. (A character
    device that is no tty to isatty any more; a pipe or a file is left as it is, and so is a terminal
    still there: a SIGHUP sent by hand, `kill -HUP`, stops the run, and its lines must still be shown.)"""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # closed: nothing to point anywhere
                if stat.S_ISCHR(os.fstat(fd).st_mode) and not os.isatty(fd):
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _File(logging.FileHandler):
    """train.log: the run's own file handler (a handler someone else put on the logger is left alone)."""


class _Held(logging.Handler):
    """The lines logged before a run's train.log exists (RESUME=auto's decision, a new run's batch, the
    probe's warnings): the console shows them at once, train.log gets them when it opens."""

    def __init__(self, records=()) -> None:
        super().__init__()
        self.records = list(records)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def setup_logging(log_file: Path | None, prefix: str = "", hold: bool = False) -> None:
    """One format for the console and train.log; replaces handlers from an earlier run in-process.

    `prefix` tells workers apart when several processes train together ("[worker 1] "). `hold`: the
    console only, keeping every line from now on for the train.log a later call opens (which writes
    them first, at their own times); without a file, lines held so far stay held."""
    held = [r for h in log.handlers if isinstance(h, _Held) for r in h.records] if not hold else []
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(message)s", "%Y-%m-%d %H:%M:%S")
    for h in list(log.handlers):
        if isinstance(h, (_Console, _File, _Held)):  # a notebook's own handler on "train" stays, and gets the lines
            log.removeHandler(h)
            h.close()
    console = _Console(sys.stdout)
    console.setFormatter(fmt)
    log.addHandler(console)
    if log_file is not None:
        fh = _File(log_file, encoding="utf-8")
        fh.setFormatter(fmt)
        for record in held:
            fh.handle(record)
        log.addHandler(fh)
    elif hold or held:
        log.addHandler(_Held(held))
    log.setLevel(logging.INFO)
    log.propagate = False


def log_to_file_only(line: str) -> None:
    """A line for train.log that the console gets from elsewhere: the error a run ended with, which
    the command line prints once as its last line (an API caller gets the exception)."""
    log.error("%s", line, extra={"file_only": True})


def close_logging() -> None:
    """train.log closed, and lines no longer held for one: the console alone goes on."""
    for h in list(log.handlers):
        h.flush()
        if isinstance(h, (_File, _Held)):
            log.removeHandler(h)
            h.close()
