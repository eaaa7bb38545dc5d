"""stopping: the stop flag from the MAX_MINUTES budget (fake clock) and from real signals."""

from __future__ import annotations

import logging
import os
import pty
import signal
import subprocess
import threading

import pytest
from helpers import PYTHON, subprocess_env

from train.errors import SecondInterrupt
from train.training import stop_flag
from train.training.stop_flag import StopFlag


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(stop_flag.time, "monotonic", fake)
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
    with pytest.raises(SecondInterrupt):  # a KeyboardInterrupt the CLI tells from a first Ctrl-C
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


def test_a_signal_a_flag_inside_another_takes_is_passed_on_to_the_outer_one(capsys):
    """A sweep's flag around its trial's run: the run's flag takes the signal, and the sweep must hear
    of it too, or it starts its next trial after the run finished. Said once, by the run."""
    outer = StopFlag()
    with outer.installed():
        inner = StopFlag()
        with inner.installed():
            os.kill(os.getpid(), signal.SIGTERM)
        assert inner.reason == outer.reason == "received SIGTERM" and outer.status == "interrupted"
        assert outer.check()
    assert capsys.readouterr().out.count("received SIGTERM") <= 1


class _OneLineAtATime(logging.Handler):
    """A stream as io's buffered writers are: a write begun inside another write is refused. The line
    "writing" is where the signal lands, as Ctrl-C lands in whatever line a busy terminal is taking."""

    def __init__(self):
        super().__init__()
        self.lines, self.inside, self.reentered = [], False, False

    def emit(self, record):
        self.reentered |= self.inside
        self.inside = True
        try:
            if record.getMessage() == "writing":
                os.kill(os.getpid(), signal.SIGINT)
            self.lines.append(record.getMessage())
        finally:
            self.inside = False


def test_a_signal_that_lands_inside_a_log_line_is_said_after_it_not_inside_it():
    """Written from inside the line in progress, the signal's line made a "Logging error" traceback on a
    terminal (two workers of `invoke train --local --workers 2` share one)."""
    logger, handler = logging.getLogger("train"), _OneLineAtATime()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        flag = StopFlag()
        with flag.installed():
            logger.info("writing")
            assert flag.check()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not handler.reentered
    assert handler.lines == ["writing", f"received SIGINT: {flag.then}"]


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


# -- the run routes signals to the flag from its first moment -------------------------------------
class _NoDevices:
    strategy, replicas, precision, precision_reason = None, 1, "float32", "test"

    def describe(self):
        return "devices: none (test)"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_finishes_the_manifest_and_exits_75(tmp_path, monkeypatch, capsys, sig):
    """Before the epoch loop exists (here: during device set-up) a signal must still be a clean stop."""
    import json

    from helpers import tiny_settings

    from train import cli
    from train.commands import fit as fit_command
    from train.setup import devices

    settings = tiny_settings(tmp_path)

    def signalled_setup(_settings, **_probes):
        os.kill(os.getpid(), sig)  # delivered now, while start-up is in progress
        return _NoDevices()

    monkeypatch.setattr(devices, "setup_devices", signalled_setup)
    monkeypatch.setattr(fit_command, "settings_for", lambda _args: settings)
    assert cli.main(["fit"]) == 75
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]  # .cache holds the measured peak
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["ended_at"]
    # Why it ended is in the run's record, as for a stop mid-training (runs, the report's header).
    why = f"stopped before training started (received {sig.name}): resumable"
    assert manifest["ended_because"] == manifest["segments"][-1]["ended_because"] == why
    log = (run / "train.log").read_text()
    # What the stop does, said when the signal arrives: no steps run yet, so none to finish.
    assert f"received {sig.name}: stopping before training starts\n" in log, log
    assert "stopped before training started" in log and "call of steps" not in log
    assert "Stopped at once" not in capsys.readouterr().err  # one Ctrl-C is a clean stop, not exit 130


def test_a_stopped_run_ends_with_the_whole_command_that_continues_it(tmp_path, monkeypatch, capsys):
    from helpers import tiny_settings

    from train import cli
    from train.commands import fit as fit_command
    from train.setup import devices

    def signalled_setup(_settings, **_probes):
        os.kill(os.getpid(), signal.SIGTERM)
        return _NoDevices()

    monkeypatch.setattr(devices, "setup_devices", signalled_setup)
    monkeypatch.setattr(fit_command, "settings_for", lambda _args: tiny_settings(tmp_path))
    assert cli.main(["fit", "--epochs", "3"]) == 75
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    last = (run / "train.log").read_text().splitlines()[-1]
    # Under pytest the process is no `python -m train`: the command starts as the docs write it.
    assert last.endswith(
        f" run {run.name} ended: interrupted; to continue it: python -m train fit --epochs 3 --resume {run.name}"
    )


def test_a_budget_stop_ends_with_the_command_and_the_budget_it_gives(tmp_path, monkeypatch):
    from helpers import tiny_settings

    from train import cli
    from train.commands import fit as fit_command

    # A budget spent before training starts: the same record and last line as one spent mid-epoch.
    monkeypatch.setattr(fit_command, "settings_for", lambda _args: tiny_settings(tmp_path, max_minutes=1e-6))
    assert cli.main(["fit", "--max-minutes", "1e-06"]) == 75
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    last = (run / "train.log").read_text().splitlines()[-1]
    assert last.endswith(
        f" run {run.name} ended: budget; to continue it: python -m train fit --max-minutes 1e-06 --resume {run.name} "
        "(for another 1e-06 minutes: MAX_MINUTES counts from each start; set another, or 0 for no limit)"
    )


def test_the_handler_is_installed_before_the_run_directory_is_made(tmp_path, monkeypatch):
    from helpers import tiny_settings

    from train.training import fit

    seen = []

    def spy(*args, **kwargs):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise RuntimeError("stop here")

    monkeypatch.setattr(fit, "plan_run", spy)
    with pytest.raises(RuntimeError):
        fit.fit(tiny_settings(tmp_path))
    assert seen and seen[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)
    assert signal.getsignal(signal.SIGTERM) is not seen[0]  # restored afterwards


def test_a_stop_after_training_says_training_is_over_not_that_it_saves_after_a_call_of_steps(tmp_path, capsys):
    """A SIGTERM while the run's record and uploads are being finished (a store's last files) has no
    steps left to finish: what it says matches what it does."""
    from helpers import tiny_settings

    from train import train

    class SignalAtTheEnd:
        def on_end(self, status, stop):
            os.kill(os.getpid(), signal.SIGTERM)

    result = train(tiny_settings(tmp_path, epochs=1), callbacks=[SignalAtTheEnd()])
    assert result.status == "completed"
    said = [line for line in capsys.readouterr().out.splitlines() if "received SIGTERM" in line]
    assert len(said) == 1 and said[0].endswith(
        "received SIGTERM: training is over; cutting short what is left of the run's record and uploads"
    ), said


def test_a_stop_once_every_epoch_is_trained_says_what_still_finishes_not_a_call_of_steps(tmp_path, capsys):
    """A Ctrl-C during the test split or the export: no steps are left and nothing is saved for a
    resume; the line says what still finishes (the export too, when EXPORT is on)."""
    from helpers import tiny_settings

    from train import train

    class SignalOnComplete:
        def on_complete(self, result):
            os.kill(os.getpid(), signal.SIGTERM)

    result = train(tiny_settings(tmp_path, epochs=1, export=False), callbacks=[SignalOnComplete()])
    assert result.status == "completed"
    said = [line for line in capsys.readouterr().out.splitlines() if "received SIGTERM" in line]
    assert len(said) == 1 and said[0].endswith(
        "received SIGTERM: training is over; the final weights and the test split still finish"
    ), said


def test_a_hangup_stops_the_run_but_under_nohup_stays_ignored(monkeypatch):
    """SIGHUP is a terminal that went away (an SSH connection dropped); nohup's ignoring it is kept, so a
    run started with nohup (`invoke train --detach`) goes on when its terminal closes."""
    gone = []  # this process's own stdout and stderr stay where they are (tests/test_reliability.py: a real one)
    monkeypatch.setattr(stop_flag, "terminal_gone", lambda: gone.append(True))
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopFlag().installed() as flag:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert not flag.check()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with StopFlag().installed() as flag:
            os.kill(os.getpid(), signal.SIGHUP)
            assert flag.check() and flag.reason == "received SIGHUP" and gone == [True]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


HANGUP_BY_HAND = """
import os, signal
from train.training.stop_flag import StopFlag
with StopFlag().installed() as flag:
    os.kill(os.getpid(), signal.SIGHUP)
    assert flag.check()
print("the stop's lines still shown", flush=True)
"""


def test_a_hangup_sent_by_hand_leaves_a_terminal_that_is_still_there_its_lines():
    """`kill -HUP` to a run in a live terminal stops it as a hangup does, but the terminal did not go away:
    pointed at /dev/null, it showed nothing more, not the line with the command that resumes the run."""
    master, slave = pty.openpty()
    try:
        try:
            proc = subprocess.run(
                [PYTHON, "-c", HANGUP_BY_HAND], stdout=slave, stderr=subprocess.PIPE, env=subprocess_env(), timeout=60
            )
        finally:
            os.close(slave)
        shown, chunk = b"", b"-"
        while chunk:  # what the terminal got: reading fails (EIO) once it is empty and no one holds it
            try:
                chunk = os.read(master, 65536)
            except OSError:
                chunk = b""
            shown += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0, proc.stderr
    assert b"the stop's lines still shown" in shown, shown


def test_a_sigterm_then_one_ctrl_c_still_saves():
    """systemd signals every process of a service: the run gets SIGTERM, then the Ctrl-C invoke makes of
    its own SIGTERM. That is one Ctrl-C, not a second: stopping at once there lost the save."""
    flag = StopFlag()
    with flag.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except SecondInterrupt:
            pytest.fail("one Ctrl-C after a SIGTERM stopped the run at once")
        assert flag.check() and flag.reason == "received SIGTERM"
        with pytest.raises(SecondInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
