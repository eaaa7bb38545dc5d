"""reproduce_worktree: the rerun's worktree never outlives reproduce; signals reach the training child."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from train.errors import Interrupted
from train.reproduce.worktree import OWNER, clean_stale_worktrees, run_child, stop_on_signals, worktree

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "clone"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def _worktrees(repo: Path) -> list[Path]:
    lines = _git(repo, "worktree", "list", "--porcelain").splitlines()
    return [Path(line[len("worktree ") :]) for line in lines if line.startswith("worktree ")]


def _add(repo: Path, commit: str, path: Path) -> Path:
    _git(repo, "worktree", "add", "-q", "--detach", str(path), commit)
    return path


def test_worktrees_left_by_a_killed_reproduce_are_removed_and_live_ones_kept(tmp_path):
    repo, commit = _repo(tmp_path)
    killed = _add(repo, commit, tmp_path / "reproduce-killed" / "src")
    (killed.parent / OWNER).write_text("")  # its lock file, held by nobody any more
    vanished = _add(repo, commit, tmp_path / "reproduce-vanished" / "src")
    shutil.rmtree(vanished.parent)  # the temporary folder was cleaned, the registration stayed
    older = _add(repo, commit, tmp_path / "reproduce-older" / "src")  # made before the lock file existed
    adding = _add(repo, commit, tmp_path / "reproduce-adding" / "src")
    _git(repo, "worktree", "lock", "--reason", "initializing", str(adding))  # killed during `git worktree add`
    live = _add(repo, commit, tmp_path / "reproduce-live" / "src")
    fd = os.open(live.parent / OWNER, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a reproduce still running holds it
    mine = _add(repo, commit, tmp_path / "mine")  # the user's own worktree
    try:
        removed = clean_stale_worktrees(repo)
        assert sorted(removed) == sorted([killed, vanished, older, adding])
        assert sorted(_worktrees(repo)) == sorted([repo, live, mine])
        assert not killed.parent.exists() and not older.parent.exists() and not adding.parent.exists()
        assert live.is_dir()
    finally:
        os.close(fd)


def test_the_worktree_and_its_registration_are_gone_on_every_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    repo, commit = _repo(tmp_path)
    stale = _add(repo, commit, tmp_path / "tmp" / "reproduce-stale" / "src")
    with worktree(repo, commit) as code:
        assert (code / "a.txt").read_text() == "a\n"
        assert not stale.parent.exists()  # cleaned at the start
        assert _worktrees(repo) == [repo, code]
    with pytest.raises(RuntimeError), worktree(repo, commit):
        raise RuntimeError("the rerun failed")
    with pytest.raises(Interrupted), stop_on_signals() as stop, worktree(repo, commit, stop):
        signal.raise_signal(signal.SIGTERM)
    assert _worktrees(repo) == [repo]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_signal_before_any_child_stops_the_command_at_once():
    with pytest.raises(Interrupted, match="reproduce stopped by SIGINT: no verdict"), stop_on_signals():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


CHILD = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
Path(sys.argv[1]).write_text("ready")
time.sleep(120)  # not forwarded: it ends by itself, with 0
"""


def test_sigterm_is_forwarded_to_the_child_which_is_waited_for(tmp_path):
    ready = tmp_path / "ready"

    def send_when_ready():
        end = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send_when_ready)
    with stop_on_signals() as stop:
        sender.start()
        code = run_child([sys.executable, "-c", CHILD, str(ready)], stop)
    sender.join()
    assert code == 75 and stop.signum == signal.SIGTERM and stop.child is None
