"""The temporary git worktree a rerun trains from, and the child process that trains: neither outlives `reproduce`.

SIGTERM/SIGINT/SIGHUP during a reproduce are passed on to the training child (which saves a resumable
state and stops, as any run does), the worktree and its `git worktree` registration are removed,
and the command ends with Interrupted (exit 75). A reproduce killed outright (SIGKILL) cannot clean
up: each worktree carries a lock file held by its reproduce and by the child that runs its code, and
the next reproduce in the same clone removes every worktree whose lock nobody holds any more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import Interrupted, ReproduceError
from ..run.train_log import terminal_gone

PREFIX = "reproduce-"  # the temporary folder: <tmp>/reproduce-XXXX/{src,owner.lock}
OWNER = "owner.lock"
_HELD: dict[Path, int] = {}  # worktree -> fd of its lock, passed on to the child that runs its code


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)


class Stop:
    """SIGTERM/SIGINT/SIGHUP while reproducing: forwarded to the running child, else the command stops here."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.child: subprocess.Popen | None = None
        self.deferred = 0  # > 0 while cleaning up: a signal then only ends the command afterwards

    def handle(self, signum: int, _frame) -> None:
        if signum == signal.SIGHUP:
            terminal_gone()  # the terminal hung up: the command's last line must not fail writing to it
        first = self.signum is None
        self.signum = self.signum or signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)  # a second Ctrl-C reaches it too: it stops at once
        elif first and not self.deferred:
            raise self.interrupted()

    def interrupted(self, rerun: Path | None = None) -> Interrupted:
        name = signal.Signals(self.signum or signal.SIGTERM).name
        left = f"; the unfinished rerun {rerun.name} keeps its saved state (delete it, or --resume it)" if rerun else ""
        return Interrupted(
            f"reproduce stopped by {name}: no verdict; the original run is untouched{left}; run reproduce again"
        )

    def check(self) -> None:
        if self.signum is not None:
            raise self.interrupted()

    @contextlib.contextmanager
    def cleaning(self) -> Iterator[None]:
        self.deferred += 1
        try:
            yield
        finally:
            self.deferred -= 1


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Stop]:
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach only the main thread: nothing to route
        return
    # SIGHUP: the terminal hung up. The child, in a session of its own, hears of it only from here, and
    # would train on to its end after this command died of it. Under nohup it stays ignored.
    hangup = [signal.SIGHUP] if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN else []
    previous = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGTERM, signal.SIGINT, *hangup)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_child(cmd: list[str], stop: Stop, code: Path | None = None, **kw) -> int:
    """Run `cmd` to its end with the signals forwarded; its exit code.

    In a session of its own, so a Ctrl-C at the terminal reaches it once, through `stop`, not twice."""
    fds = (_HELD[code],) if code in _HELD else ()
    stop.check()
    with stop.cleaning():  # between the start and `stop.child` being set, a signal must not be lost
        proc = subprocess.Popen(cmd, start_new_session=True, pass_fds=fds, **kw)
        stop.child = proc
    try:
        if stop.signum is not None and proc.poll() is None:
            proc.send_signal(stop.signum)  # it arrived while the child was being started
        return proc.wait()
    finally:
        with stop.cleaning():
            if proc.poll() is None:  # only when waiting itself failed: never leave it behind
                proc.kill()
                proc.wait()
            stop.child = None


def _unowned(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove(root: Path, path: Path) -> None:
    # The folder and its registration in the clone. Twice --force: a reproduce killed during
    # `git worktree add` leaves the worktree locked ("initializing"), which one --force keeps.
    _git(root, "worktree", "remove", "--force", "--force", str(path))
    shutil.rmtree(path.parent, ignore_errors=True)


def clean_stale_worktrees(root: Path) -> list[Path]:
    """Remove the worktrees of reproduces that were killed outright (their lock is free, or their folder gone)."""
    listed = _git(root, "worktree", "list", "--porcelain")
    removed = []
    for line in listed.stdout.decode(errors="replace").splitlines():
        path = Path(line[len("worktree ") :]) if line.startswith("worktree ") else None
        if path is None or path.name != "src" or not path.parent.name.startswith(PREFIX):
            continue
        if _unowned(path.parent / OWNER):
            _remove(root, path)
            removed.append(path)
    return removed


@contextlib.contextmanager
def worktree(root: Path, commit: str, stop: Stop | None = None) -> Iterator[Path]:
    """A detached worktree of `commit` in a temporary folder, removed (with its registration) on every path."""
    stop = stop or Stop()
    with stop.cleaning():
        clean_stale_worktrees(root)
        parent = Path(tempfile.mkdtemp(prefix=PREFIX))
        path = parent / "src"
        fd = os.open(parent / OWNER, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
    try:
        with stop.cleaning():
            added = _git(root, "worktree", "add", "--detach", str(path), commit)
        stop.check()
        if added.returncode != 0:
            raise ReproduceError(
                f"could not check out commit {commit[:12]}: {added.stderr.decode(errors='replace').strip()}"
            )
        _HELD[path] = fd
        yield path
    finally:
        with stop.cleaning():
            _HELD.pop(path, None)
            _remove(root, path)
            os.close(fd)
