"""The package's shape, as pyproject.toml's [tool.importlinter] contracts declare it, checked by the
stock `lint-imports`: on the code as it is, and on copies that break each contract; and no function
of train/ longer than a screen."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import each_extra

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
# The extras' folders: the top layer of the contracts, each optional.
EXTRA_FOLDERS = ("serve", "sweep", "tracking", "store", "dvc", "formats", "workers")

NO_LINT_IMPORTS = pytest.mark.skipif(
    not LINT_IMPORTS.is_file() or not (PROJECT_ROOT / "pyproject.toml").is_file(),
    reason="no lint-imports beside this Python (requirements/test.lock installs it), or no pyproject.toml",
)
MAX_FUNCTION_LINES = 60  # its docstring included: one screen, read without scrolling


def test_no_function_of_the_package_is_longer_than_a_screen():
    long = []
    for path in sorted((PROJECT_ROOT / "train").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name}, {lines} lines")
    assert not long, f"split these (at most {MAX_FUNCTION_LINES} lines each): " + "; ".join(long)


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},  # the copy's train/, not the installed one
        capture_output=True,
        text=True,
        timeout=120,
    )


@NO_LINT_IMPORTS
def test_every_contract_is_kept():
    done = lint_imports(PROJECT_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(PROJECT_ROOT / "train", tmp_path / "train", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT_ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _add_import(copy: Path, module: str, line: str) -> None:
    path = copy / "train" / module
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")  # inside a function: still an import


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # The core imports no extra: the extras are the top layer.
        ("config.py", "from .sweep import space", "each layer imports only the layers below it"),
        ("run/rundir.py", "from ..serve import model", "each layer imports only the layers below it"),
        ("run/remote.py", "from ..store import remote", "each layer imports only the layers below it"),
        ("commands/fit.py", "from ..workers import start", "each layer imports only the layers below it"),
        ("cli.py", "from .serve import command", "each layer imports only the layers below it"),
        # No extra imports another: each can be deleted on its own.
        ("sweep/study.py", "from ..tracking import settings", "each layer imports only the layers below it"),
        ("locations.py", "from .config import Settings", "each layer imports only the layers below it"),
        ("run/files.py", "from ..training import loop", "each layer imports only the layers below it"),
        ("run/files.py", "from .checkpoints import save_state", "no import cycles, in any folder"),
    ],
)
@NO_LINT_IMPORTS
def test_a_copy_that_breaks_a_contract_is_refused_naming_it(copy, module, line, broken):
    for extra in (line.split()[1].strip(".").split(".")[0], module.split("/")[0]):  # imported, importing
        if extra in EXTRA_FOLDERS and not (copy / "train" / extra).is_dir():
            pytest.skip(f"(optional: this template has no {extra} extra to import or to import from)")
    _add_import(copy, module, line)
    done = lint_imports(copy)
    assert done.returncode == 1 and f"{broken} BROKEN" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "extra", each_extra(name for name in EXTRA_FOLDERS if (PROJECT_ROOT / "train" / name).is_dir())
)
@NO_LINT_IMPORTS
def test_a_copy_without_an_extras_folder_keeps_every_contract(copy, extra):
    """A fork deletes an extra's folder and its line in train/extras.py: the contracts need no edit."""
    shutil.rmtree(copy / "train" / extra)
    done = lint_imports(copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout
