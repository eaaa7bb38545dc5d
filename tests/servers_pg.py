"""A real PostgreSQL server for the sweep tests: `postgres_url`, session-scoped, on 127.0.0.1.

Debian's `postgresql` package (CI installs it when missing). The cluster is made by initdb in a
temporary folder, with a password (so the tests see the URL masked), listens on a free port and
is waited for with pg_isready, never a sleep; it is stopped at the end of the session. As root
the server runs as the `postgres` user (PostgreSQL refuses to run as root). A test that stops the
server under a sweep starts one of its own (`PostgresServer`), never the session's.
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
from helpers import free_local_ports, server_missing, server_process

PASSWORD = "pg-s3cret"
POSTGRES_SKIP = server_missing("PostgreSQL server", "Debian: apt-get install postgresql (.ci/run installs it)")


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("postgres")
    return Path(which).parent if which else None


class PostgresServer:
    """One cluster in a temporary folder with an `optuna` database: start(), stop(), start() again."""

    def __init__(self) -> None:
        self.bin_dir = _bin_dir()
        if self.bin_dir is None:
            pytest.skip(POSTGRES_SKIP)
        self.as_user: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="tpl-pg-"))  # not under pytest's 0700 folder: postgres must reach it
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        (self.root / "pw").write_text(PASSWORD)
        if self.as_user:
            os.chown(self.root / "pw", pwd.getpwnam("postgres").pw_uid, -1)
        self.data = self.root / "data"
        self.user = "postgres" if self.as_user else pwd.getpwuid(os.geteuid()).pw_name
        init = [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=scram-sha-256"]
        subprocess.run([*self.as_user, *init, f"--pwfile={self.root / 'pw'}"], check=True, capture_output=True)
        self.port = free_local_ports()[0]
        self.url = f"postgresql://{self.user}:{PASSWORD}@127.0.0.1:{self.port}/optuna"
        self.server: subprocess.Popen | None = None
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        createdb = [str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user]
        try:
            self.start()
            subprocess.run([*createdb, "optuna"], check=True, env=env)
        except BaseException:  # pytest.fail too: no server or folder left behind
            self.remove()
            raise

    def start(self) -> None:
        """The server on its port, returned once pg_isready answers (a restart keeps the data and port)."""
        log = open(self.root / "server.log", "a")
        server = [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.root)]
        # As root, the server itself is started as postgres (not under runuser, which would stay its parent):
        # it dies with the tests, and its own processes with it.
        user = {"user": "postgres", "group": "postgres", "extra_groups": []} if self.as_user else {}
        self.server = server_process(
            [*server, "-c", "listen_addresses=127.0.0.1"], stdout=log, stderr=subprocess.STDOUT, **user
        )
        log.close()
        ready = [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        deadline = time.monotonic() + 120  # a safety net only: the loop ends when the server answers
        while subprocess.run(ready, capture_output=True).returncode:
            if self.server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("PostgreSQL did not start: " + (self.root / "server.log").read_text()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        """pg_ctl's "fast" stop: the server disconnects its clients (a pool a process still holds) and exits."""
        if self.server is None:
            return
        subprocess.run(
            [*self.as_user, str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.data), "-m", "fast"],
            capture_output=True,
        )
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
        self.server = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url():
    """postgresql://postgres:<password>@127.0.0.1:<port>/optuna of a server that runs for the session."""
    server = PostgresServer()
    try:
        yield server.url
    finally:
        server.remove()
