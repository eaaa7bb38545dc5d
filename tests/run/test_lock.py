"""runlock: one writer per run directory; a second holder is refused by name, a dead one never blocks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from train.errors import RunBusyError
from train.run.lock import RunLock


def test_run_lock_refuses_a_second_holder_naming_pid_and_host(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunBusyError) as info:
            RunLock(tmp_path).acquire()
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(info.value)
        assert tmp_path.name in str(info.value) and info.value.exit_code == 4
    with RunLock(tmp_path):  # released: locks again
        assert (tmp_path / "run.lock").is_file()
    assert not (tmp_path / "run.lock").exists()  # a run let go of keeps no run.lock


def test_a_reader_leaves_a_dead_holders_file_so_the_run_still_reads_as_killed(tmp_path):
    from train.results.run_records import load_records
    from train.results.runs_table import list_runs
    from train.run.manifest import new_segment, start_manifest

    lock = tmp_path / "runs" / "20260101-000000-000001" / "run.lock"
    lock.parent.mkdir(parents=True)
    note = "pid 999999999 on host " + socket.gethostname() + "\n"
    lock.write_text(note)  # a SIGKILLed fit's
    (lock.parent / "config.json").write_text("{}")
    start_manifest(lock.parent / "manifest.json", _settings(tmp_path), lock.parent.name, new_segment(1))
    assert [r["status"] for r in list_runs(tmp_path / "runs")] == ["killed"]
    with RunLock(lock.parent, reader=True):  # an export or a report of it: killed while they hold it too
        assert load_records(lock.parent).status == "killed"  # the report's own page said running
        probe = "import sys; from train.run.lock import RunLock; print(RunLock(sys.argv[1]).abandoned())"
        other = subprocess.run([sys.executable, "-c", probe, str(lock.parent)], capture_output=True, text=True)
        assert other.stdout.strip() == "True", other.stderr  # killed to `runs` meanwhile too: it said running
    assert lock.read_text() == note  # as it was, not the reader's pid (a report of it wrote its own there)
    assert [r["status"] for r in list_runs(tmp_path / "runs")] == ["killed"]
    assert load_records(lock.parent).status == "killed"  # as compare and the report show it
    with RunLock(lock.parent):  # the fit that resumes it: its own file goes when it ends
        pass
    assert not lock.exists()
    with RunLock(lock.parent, reader=True):  # nothing stale found: a reader removes its own file too
        pass
    assert not lock.exists()
    lock.write_text("pid 999999999 on host elsewhere\n")  # another host's, over NFS: whether it died, not known here
    with RunLock(lock.parent, reader=True):
        assert not RunLock(lock.parent).abandoned()


def _settings(tmp_path):
    from train.config import load_settings

    return load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})


def test_a_process_that_opened_the_lock_file_as_its_holder_removed_it_locks_the_new_one(tmp_path, monkeypatch):
    import fcntl

    from train.run import lock as lock_module

    first = RunLock(tmp_path).acquire()
    real_flock, raced = fcntl.flock, []

    def flock_after_the_holder_let_go(fd, op):
        if not raced:  # the second process has the old file open; now the holder releases and removes it
            raced.append(True)
            first.release()
        return real_flock(fd, op)

    monkeypatch.setattr(lock_module.fcntl, "flock", flock_after_the_holder_let_go)
    second = RunLock(tmp_path).acquire()
    monkeypatch.setattr(lock_module.fcntl, "flock", real_flock)
    assert (tmp_path / "run.lock").is_file() and f"pid {os.getpid()}" in (tmp_path / "run.lock").read_text()
    with pytest.raises(RunBusyError):  # a third process is kept out: the second holds the file at the path
        RunLock(tmp_path).acquire()
    second.release()


def test_a_lock_held_by_another_process_blocks_until_that_process_dies(tmp_path):
    from helpers import subprocess_env

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from train.run.lock import RunLock; RunLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"  # the event: it holds the lock now
        with pytest.raises(RunBusyError) as info:
            RunLock(tmp_path).acquire()
        assert f"pid {holder.pid} on host" in str(info.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert f"pid {holder.pid}" in (tmp_path / "run.lock").read_text()  # the dead holder's file is still there
    with RunLock(tmp_path):  # ... and does not block
        pass


def test_a_named_pipe_for_run_lock_is_refused_naming_it_never_waited_on(tmp_path, monkeypatch):
    from train.errors import RunRecordError

    run = tmp_path / "r"
    run.mkdir()
    os.mkfifo(run / "run.lock")  # nobody writes it: reading the holder's note blocked `runs` forever
    for probe in (RunLock(run).abandoned, RunLock(run, reader=True).acquire):
        with pytest.raises(RunRecordError) as err:
            probe()
        assert str(err.value).startswith(f"run r: {run / 'run.lock'} is a named pipe (FIFO), not a regular file; ")
    (run / "run.lock").unlink()
    monkeypatch.chdir(run)  # a socket's path is limited to 108 bytes
    socket.socket(socket.AF_UNIX).bind("run.lock")  # a socket: report and export said No such device or address
    for probe in (RunLock(run).abandoned, RunLock(run, reader=True).acquire):
        with pytest.raises(RunRecordError, match=r"run.lock is a socket, not a regular file; remove it"):
            probe()
    (run / "run.lock").unlink()
    (run / "run.lock").symlink_to(tmp_path / "notes.txt")  # the note went there (truncating a file that was)
    with pytest.raises(RunRecordError, match=r"run.lock is a symbolic link, not a regular file; remove it"):
        RunLock(run).acquire()
    assert not (tmp_path / "notes.txt").exists()
