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
    with RunLock(tmp_path):  # released: the file stays, and locks again
        pass
    assert (tmp_path / "run.lock").is_file()


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
