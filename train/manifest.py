"""The manifest: everything needed to trace and reproduce a run, updated as the run goes.

Collected once at start (versions, build info, GPUs, git, lock hash, data fingerprint, seed, host)
and updated at the end (status, times, figures). Collection never fails a run: an unknown value is
recorded as null with the reason.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from .rundir import read_json, write_json

def project_root() -> Path:
    """The checkout (editable install) or the image's working directory (package in site-packages)."""
    for candidate in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (candidate / "requirements.lock").is_file() or (candidate / ".git").exists():
            return candidate
    return Path.cwd()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def git_info(root: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag from git; inside the image (no .git) from the BUILD_COMMIT file baked at build."""
    root = root or project_root()
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5)
            return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    baked = root / "BUILD_COMMIT"
    if baked.is_file():
        return {"commit": baked.read_text().strip() or None, "dirty": None, "source": str(baked)}
    return {"commit": None, "dirty": None, "source": "no git repository and no BUILD_COMMIT file"}


def lock_hash(root: Path | None = None) -> dict[str, Any]:
    """The lock this environment was installed from: tensorflow-cpu means requirements.lock."""
    from importlib import metadata

    try:
        metadata.version("tensorflow-cpu")
        name = "requirements.lock"
    except metadata.PackageNotFoundError:
        name = "requirements-gpu.lock"
    lock = (root or project_root()) / name
    return {"file": str(lock), "sha256": file_sha256(lock)}


def gpu_facts() -> list[dict[str, Any]]:
    try:
        from .gpuinfo import query_gpus
    except ImportError:
        return []
    try:
        return [asdict(g) if is_dataclass(g) else dict(g) for g in query_gpus()]
    except Exception as exc:  # the manifest records what it can; a broken driver is check's job
        return [{"error": f"{type(exc).__name__}: {exc}"}]


def tf_facts() -> dict[str, Any]:
    import keras
    import tensorflow as tf

    try:
        build = dict(tf.sysconfig.get_build_info())
    except Exception as exc:  # CPU-only builds may lack keys; never fatal
        build = {"error": str(exc)}
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "build_info": build}


def start_manifest(path: Path, settings, run_id: str, resumed: bool) -> dict[str, Any]:
    previous = read_json(path) if resumed and path.is_file() else {}
    manifest = {
        "run_id": run_id,
        "status": "running",
        "started_at": previous.get("started_at", now_iso()),
        "resumed_at": previous.get("resumed_at", []) + ([now_iso()] if resumed else []),
        "ended_at": None,
        "seed": settings.seed,
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": sys.argv,
        **tf_facts(),
        "gpus": gpu_facts(),
        "git": git_info(),
        "requirements_lock": lock_hash(),
    }
    write_json(path, manifest)
    return manifest


def update_manifest(path: Path, **fields: Any) -> dict[str, Any]:
    manifest = read_json(path) if path.is_file() else {}
    manifest.update(fields)
    write_json(path, manifest)
    return manifest
