"""The dvc command: found beside the package (.venv-dvc), on PATH or named by DVC_COMMAND, and run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import train

from ..locations import redact_uri

# Made by scripts/venv-dvc.sh from requirements/dvc.lock, beside the package as a checkout has it.
OWN_VENV = Path(train.__file__).resolve().parent.parent / ".venv-dvc"
INSTALL = "scripts/venv-dvc.sh (it makes .venv-dvc), or DVC_COMMAND=/path/to/dvc"
TIMEOUT = 600  # a fetch of a large data set; a status or a listing answers in seconds
_URL = re.compile(r"[a-zA-Z][\w+.-]*://\S+")


def find(setting: str = "") -> str | None:
    """DVC_COMMAND when given (a path or a name on PATH), else .venv-dvc/bin/dvc, else dvc on PATH.

    Absolute: DVC runs in the data's project folder, where a path relative to here names nothing."""
    if setting:
        found = shutil.which(setting) or (setting if Path(setting).is_file() else None)
        return os.path.abspath(found) if found else None
    own = OWN_VENV / "bin" / "dvc"
    return str(own) if own.is_file() else shutil.which("dvc")


def run(dvc: str, *args: str, cwd: Path | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """`dvc args...` with no analytics (offline, and nothing about the user's data leaves the machine)."""
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    return subprocess.run([dvc, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def not_dvc(dvc: str) -> str | None:
    """Why `dvc` is not a working DVC command, else None. A DVC_COMMAND that names another program
    (a typo, /bin/true, a Python) would otherwise run `get ...` as its own arguments: a traceback, or
    an error of that program read as DVC's (a version "never pushed")."""
    try:
        done = run(dvc, "--version", timeout=60)
    except subprocess.TimeoutExpired:
        return None  # slow (a loaded machine, a cold network home), not proven other: its own command's limit applies
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    answer = (done.stdout.strip().splitlines() or [""])[0].strip()
    if done.returncode == 0 and re.match(r"\d+\.\d+", answer):
        return None
    return f"`{dvc} --version` answered {answer[:60]!r} with exit code {done.returncode}, not a DVC version"


def error_line(stderr: str) -> str:
    """DVC's own error line (`ERROR: ...`), every URL in it masked: it may quote a remote with its password."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    line = next((x for x in lines if x.startswith("ERROR")), lines[-1] if lines else "no message")
    line = line.removeprefix("ERROR:").strip()
    return _URL.sub(lambda m: redact_uri(m.group(0)), line)[:300]
