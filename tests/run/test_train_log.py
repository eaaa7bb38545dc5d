"""run/train_log: the console's lines beside a progress bar, and a console that hung up."""

from __future__ import annotations

import errno
import io
import logging

import pytest

from train.run import train_log


def _console(stream) -> logging.Handler:
    handler = train_log._Console(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


def _record(text: str) -> logging.LogRecord:
    return logging.LogRecord("train", logging.INFO, __file__, 1, text, None, None)


def test_a_line_logged_while_a_progress_bar_is_open_starts_a_line_of_its_own():
    stream = io.StringIO()
    handler = _console(stream)
    stream.write(" 8/106 [==>....]")  # the bar's line, not ended
    train_log.progress_line(True)
    handler.emit(_record("received SIGTERM"))
    handler.emit(_record("saved"))
    assert stream.getvalue() == " 8/106 [==>....]\nreceived SIGTERM\nsaved\n"


class _HungUp(io.StringIO):
    def write(self, text):
        raise OSError(errno.EIO, "Input/output error")


def test_a_console_that_hung_up_is_let_go_and_the_run_goes_on(monkeypatch):
    """Its writes fail with EIO until the SIGHUP that follows stops the run: failing the run there would
    lose its save. Other write errors are still errors."""
    gone = []
    monkeypatch.setattr(train_log, "terminal_gone", lambda: gone.append(True))
    with train_log.on_the_console():
        _HungUp().write("8/106")
    assert gone == [True]
    train_log.progress_line(True)
    handler = _console(_HungUp())
    monkeypatch.setattr(handler, "handleError", lambda record: gone.append(record.getMessage()))
    handler.emit(_record("received SIGHUP"))  # a logged line's failed write is the handler's, as always
    assert gone == [True, "received SIGHUP"]
    with pytest.raises(OSError, match="No space left"), train_log.on_the_console():
        raise OSError(errno.ENOSPC, "No space left on device")
