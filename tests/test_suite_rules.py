"""The suite's own rules (tests/conftest.py): under REQUIRE_ALL=1, as in CI, a skip is a failure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers import HELPERS_PATH, subprocess_env


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
