"""A real PostgreSQL server for the sweep tests: `postgres_url`, session-scoped, on 127.0.0.1.

Debian's `postgresql` package (CI installs it when missing). The cluster is made by initdb in a
temporary folder, with a password (so the tests see the URL masked), listens on a free port and
is waited for with pg_isready, never a sleep; it is stopped at the end of the session. As root
the server runs as the `postgres` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import free_local_ports, server_missing

PASSWORD = "pg-s3cret"
POSTGRES_SKIP = server_missing("PostgreSQL server", "Debian: apt-get install postgresql (.ci/run installs it)")


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("postgres")
    return Path(which).parent if which else None


@pytest.fixture(scope="session")
def postgres_url():
    """postgresql://postgres:<password>@127.0.0.1:<port>/optuna of a server that runs for the session."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip(POSTGRES_SKIP)
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="tpl-pg-"))  # not under pytest's 0700 folder: postgres must reach it
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    (root / "pw").write_text(PASSWORD)
    if as_user:
        os.chown(root / "pw", pwd.getpwnam("postgres").pw_uid, -1)
    data = root / "data"
    user = "postgres" if as_user else pwd.getpwuid(os.geteuid()).pw_name
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            user,
            "--auth=scram-sha-256",
            f"--pwfile={root / 'pw'}",
        ],
        check=True,
        capture_output=True,
    )
    port = free_local_ports()[0]
    log = open(root / "server.log", "w")
    server = subprocess.Popen(
        [
            *as_user,
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-k",
            str(root),
            "-c",
            "listen_addresses=127.0.0.1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120  # a safety net only: the loop ends when the server answers
        while subprocess.run(
            [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
        ).returncode:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("PostgreSQL did not start: " + (root / "server.log").read_text()[-2000:])
            time.sleep(0.1)
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        subprocess.run(
            [str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, "optuna"], check=True, env=env
        )
        yield f"postgresql://{user}:{PASSWORD}@127.0.0.1:{port}/optuna"
    finally:
        # "fast": disconnects the clients a test process may still hold in its pool.
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "stop", "-D", str(data), "-m", "fast"], capture_output=True)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
