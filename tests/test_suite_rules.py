"""The suite's own rules (tests/conftest.py): under REQUIRE_ALL=1, as in CI, a skip is a failure."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HELPERS_PATH, server_process, subprocess_env


def _run_suite(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    conftest = Path(__file__).with_name("conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(re.sub(r"(?m)^pytest_plugins = .*$", "", conftest))
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_needs_a_server():\n    pytest.skip('no weed: run scripts/some-install.sh')\n"
        "def test_needs_a_gpu():\n    pytest.skip('needs a visible NVIDIA GPU')\n"
        "def test_fine():\n    pass\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=HELPERS_PATH, **env),
    )


def test_under_require_all_a_skip_for_a_missing_tool_fails_and_one_for_a_gpu_does_not(tmp_path):
    proc = _run_suite(tmp_path, REQUIRE_ALL="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "skipped under REQUIRE_ALL=1 (install what it needs): no weed: run scripts/some-install.sh" in proc.stdout
    assert re.fullmatch(r"1 failed, 1 passed, 1 skipped in .*", proc.stdout.splitlines()[-1])


def test_without_it_both_skip(tmp_path):
    proc = _run_suite(tmp_path, REQUIRE_ALL="")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.fullmatch(r"1 passed, 2 skipped in .*", proc.stdout.splitlines()[-1])


def test_no_two_test_modules_share_a_file_name():
    """The test folders are not packages, so pytest imports each file by its name alone: a second
    test_settings.py in another folder stops the whole run at collection ("import file mismatch")."""
    from collections import Counter

    tests = Path(__file__).parent
    names = Counter(p.name for p in tests.rglob("test_*.py") if "fixtures" not in p.parts)
    assert not [name for name, n in names.items() if n > 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_server_a_fixture_starts_dies_with_the_process_that_started_it():
    """A pytest worker killed (kill -9, a segfault) takes its servers with it: none runs on for hours.
    The process that starts the server is a fork of this one (no second interpreter to start)."""
    read, write = os.pipe()
    starter = os.fork()
    if starter == 0:  # the short-lived process: starts a server, then is killed as a worker can be
        try:
            quiet = {name: subprocess.DEVNULL for name in ("stdin", "stdout", "stderr")}
            server = server_process(["sleep", "600"], start_new_session=True, **quiet)
            os.write(write, str(server.pid).encode())
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(write)
    with os.fdopen(read) as pipe:
        server_pid = int(pipe.read())
    assert os.waitpid(starter, 0)[1] == signal.SIGKILL
    status = Path(f"/proc/{server_pid}/status")

    def running() -> bool:  # a zombie nobody reaps (PID 1 of a container) is gone too
        try:
            return "\nState:\tZ" not in status.read_text()
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 60  # a safety net only: the loop ends as soon as it is gone
    while running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not running(), f"the server (pid {server_pid}) outlived the process that started it"
