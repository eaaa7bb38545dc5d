"""A git repository with a DVC project, made with the real dvc command (.venv-dvc), for the dvc extra's tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import PROJECT_ROOT, git, subprocess_env
from servers_s3 import ACCESS_KEY, SECRET_KEY

DVC_SKIP = "DVC is not installed (scripts/venv-dvc.sh installs it into .venv-dvc)"


def dvc_command() -> str:
    """.venv-dvc's dvc; skipped where scripts/venv-dvc.sh has not made it (a failure under REQUIRE_ALL=1, as in CI)."""
    own = PROJECT_ROOT / ".venv-dvc" / "bin" / "dvc"
    if not own.is_file():
        pytest.skip(DVC_SKIP)
    return str(own)


class DataRepo:
    """A git repository with a DVC project; with `endpoint`, its default remote is a bucket of that S3 server."""

    def __init__(self, root: Path, dvc: str, endpoint: str = "", bucket: str = ""):
        self.root, self.dvc = root, dvc
        self.env = subprocess_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, DVC_NO_ANALYTICS="1")
        root.mkdir(parents=True)
        git(root, "init", "-q")
        self.run("init", "-q")
        if endpoint:
            self.run("remote", "add", "-d", "store", f"s3://{bucket}/dvc")
            self.run("remote", "modify", "store", "endpointurl", endpoint)

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.dvc, *args], cwd=self.root, capture_output=True, text=True, env=self.env, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def commit(self, message: str) -> str:
        git(self.root, "add", "-A")
        git(self.root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", message)
        return git(self.root, "rev-parse", "HEAD").strip()

    def md5(self, name: str) -> str:
        """The md5 its .dvc file records for `name`."""
        lines = (self.root / f"{name}.dvc").read_text().splitlines()
        return next(line.split()[-1] for line in lines if "md5:" in line)
