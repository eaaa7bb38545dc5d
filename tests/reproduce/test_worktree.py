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
signal.signal(signal.SIGHUP, lambda *a: sys.exit(75))
Path(sys.argv[1]).write_text("ready")
time.sleep(120)  # not forwarded: it ends by itself, with 0
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_is_forwarded_to_the_child_which_is_waited_for(tmp_path, sig):
    """SIGHUP: the terminal hung up. The child, in a session of its own, trained on to its end after the
    command died of it, its worktree left behind."""
    ready = tmp_path / "ready"

    def send_when_ready():
        end = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), sig)

    sender = threading.Thread(target=send_when_ready)
    before = signal.signal(signal.SIGHUP, lambda *a: None)  # not routed, a SIGHUP must not end pytest
    try:
        with stop_on_signals() as stop:
            sender.start()
            code = run_child([sys.executable, "-c", CHILD, str(ready)], stop)
    finally:
        signal.signal(signal.SIGHUP, before)
    sender.join()
    assert code == 75 and stop.signum == sig and stop.child is None


def test_a_hangup_stays_ignored_under_nohup():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_only_the_src_folder_of_a_reproduce_folder_is_taken_for_a_stale_worktree(tmp_path):
    repo, commit = _repo(tmp_path)
    named_src = _add(repo, commit, tmp_path / "project" / "src")  # the user's own: no lock file beside it
    other = _add(repo, commit, tmp_path / "reproduce-mine" / "code")
    assert clean_stale_worktrees(repo) == []
    assert sorted(_worktrees(repo)) == sorted([repo, named_src, other])


def test_only_the_worktree_lines_of_the_listing_name_worktrees_and_undecodable_bytes_are_kept(tmp_path, monkeypatch):
    from train.reproduce import worktree as wt

    stale, named_in_a_reason = tmp_path / "reproduce-a" / "src", tmp_path / "reproduce-b" / "src"
    listing = (
        f"worktree {tmp_path / 'clone'}\nHEAD {'0' * 40}\nbranch refs/heads/main\n\n".encode()
        + f"worktree {tmp_path}/caf\xe9/src\ndetached\n\n".encode("latin-1")  # a path that is not UTF-8
        + f"worktree {stale}\ndetached\nlocked xx{named_in_a_reason}\n".encode()  # a reason is free text
    )
    monkeypatch.setattr(wt, "_git", lambda root, *args: subprocess.CompletedProcess(args, 0, listing, b""))
    removed = []
    monkeypatch.setattr(wt, "_remove", lambda root, path: removed.append(path))
    assert clean_stale_worktrees(tmp_path) == [stale] and removed == [stale]


def test_a_lock_that_cannot_be_opened_counts_as_held(tmp_path):
    from train.reproduce.worktree import _unowned

    (tmp_path / OWNER).mkdir()  # an OSError other than a missing file: keep the worktree
    assert _unowned(tmp_path / OWNER) is False and _unowned(tmp_path / "missing") is True


def test_the_stop_message_names_the_signal_and_an_unfinished_rerun(tmp_path):
    from train.reproduce.worktree import Stop

    stop = Stop()
    untouched = "reproduce stopped by SIGTERM: no verdict; the original run is untouched"
    assert str(stop.interrupted()) == f"{untouched}; run reproduce again"
    assert str(stop.interrupted(tmp_path / "20240101-000000-rerun")) == (
        f"{untouched}; the unfinished rerun 20240101-000000-rerun keeps its saved state (delete it, or --resume it); "
        "run reproduce again"
    )


def test_a_second_signal_without_a_child_or_one_while_cleaning_up_does_not_raise():
    from train.reproduce.worktree import Stop

    stop = Stop()
    with pytest.raises(Interrupted, match="by SIGTERM"):
        stop.handle(signal.SIGTERM, None)
    stop.handle(signal.SIGINT, None)  # the first one's Interrupted is on its way: its clean-up goes on
    assert stop.signum == signal.SIGTERM
    stop = Stop()
    with stop.cleaning():
        stop.handle(signal.SIGINT, None)
    with pytest.raises(Interrupted, match="by SIGINT"):
        stop.check()


def test_the_child_runs_in_a_session_of_its_own_with_the_given_arguments():
    from train.reproduce.worktree import Stop

    code = "import os, sys; sys.exit(int(os.environ['EXIT']) if os.getsid(0) == os.getpid() else 3)"
    assert run_child([sys.executable, "-c", code], Stop(), env={"EXIT": "7"}) == 7


def test_only_the_child_that_runs_a_worktrees_code_holds_its_lock(tmp_path, monkeypatch):
    from train.reproduce import worktree as wt

    fd = os.open(tmp_path / OWNER, os.O_RDWR | os.O_CREAT)
    monkeypatch.setitem(wt._HELD, tmp_path / "src", fd)
    check = [sys.executable, "-c", "import os, sys; os.fstat(int(sys.argv[1]))", str(fd)]
    try:
        assert run_child(check, wt.Stop(), code=tmp_path / "src") == 0
        assert run_child(check, wt.Stop()) != 0
    finally:
        os.close(fd)


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_signal_that_arrives_while_the_child_starts_is_passed_on(monkeypatch):
    from types import SimpleNamespace

    from train.reproduce import worktree as wt

    stop = wt.Stop()

    def starting(*args, **kw):
        proc = subprocess.Popen(*args, **kw)
        stop.handle(signal.SIGTERM, None)  # deferred: stop.child is not set yet
        return proc

    monkeypatch.setattr(wt, "subprocess", SimpleNamespace(Popen=starting))
    assert run_child(SLEEPER, stop) == -signal.SIGTERM


def test_a_child_is_never_left_behind_when_waiting_for_it_fails(monkeypatch):
    from types import SimpleNamespace

    from train.reproduce import worktree as wt

    class WaitFails(subprocess.Popen):
        failed = False

        def wait(self, timeout=None):
            if not self.failed:
                self.failed = True
                raise RuntimeError("waiting failed")
            return super().wait(timeout)

    made = []
    monkeypatch.setattr(
        wt, "subprocess", SimpleNamespace(Popen=lambda *a, **kw: made.append(WaitFails(*a, **kw)) or made[-1])
    )
    try:
        with pytest.raises(RuntimeError, match="waiting failed"):
            run_child(SLEEPER, wt.Stop())
        assert made[0].poll() == -signal.SIGKILL
    finally:
        if made and made[0].poll() is None:
            made[0].kill()
            made[0].wait()
