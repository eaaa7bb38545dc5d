"""pyproject.toml: the installed package holds train and every subpackage, and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
from helpers import PROJECT_ROOT


@pytest.mark.slow
def test_the_wheel_holds_every_module_of_train_and_no_tests(tmp_path):
    # Built from a copy: setuptools reuses a build/ folder it finds, which would hide a missing package.
    # Without the side environments (.venv-mlflow-server and the others): hundreds of MB to copy.
    src = tmp_path / "src"
    shutil.copytree(
        PROJECT_ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "runs", "data", "__pycache__"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    modules = {p.relative_to(PROJECT_ROOT).as_posix() for p in (PROJECT_ROOT / "train").rglob("*.py")}
    assert modules - names == set()  # subpackages too
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
