"""The manifest: everything needed to trace and reproduce a run, updated as the run goes.

Collected once at start (versions, build info, GPUs, git, lock hash, data fingerprint, seed, host)
and updated at the end (status, times, figures). Collection never fails a run: an unknown value is
recorded as null with the reason.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import platform
import socket
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from ..digest import sha256_file
from ..locations import redact_argv
from .files import read_json, write_json


def project_root() -> Path:
    """The checkout (editable install) or the image's working directory (package in site-packages)."""
    for candidate in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (candidate / "requirements/cpu.lock").is_file() or (candidate / ".git").exists():
            return candidate
    return Path.cwd()


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def file_sha256(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def git_info(root: Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag from git; inside the image (no .git) from the BUILD_COMMIT file baked at build."""
    root = root or project_root()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip()), "source": "git"}
    baked = root / "BUILD_COMMIT"
    if baked.is_file():
        commit = baked.read_text().strip() or None
        if commit is None:  # compose cannot run git: it passes GIT_COMMIT only when the shell or .env has it
            return {"commit": None, "dirty": None, "source": str(baked), "commit_missing": NO_BUILD_COMMIT}
        return {"commit": commit, "dirty": None, "source": str(baked)}
    return {"commit": None, "dirty": None, "source": "no git repository and no BUILD_COMMIT file"}


NO_BUILD_COMMIT = (
    "GIT_COMMIT was not set when this image was built: rebuild it with `invoke build` (or `invoke train`, "
    "which pass it), or `GIT_COMMIT=$(git rev-parse HEAD) docker compose build`"
)


def dirty_warning(manifest: dict[str, Any]) -> str | None:
    """One line when the run's code has uncommitted changes: no commit holds what it trains with."""
    git = manifest.get("git") or {}
    if not git.get("dirty"):
        return None
    return (
        f"WARNING: the checkout has uncommitted changes on top of commit {str(git.get('commit'))[:12]}: this "
        "run's code is in no commit (reproduce refuses it without --allow-dirty); commit, then train"
    )


def data_version(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Where the run's data is versioned (`data.version`, written by the dvc extra), or None."""
    version = (manifest.get("data") or {}).get("version") if isinstance(manifest.get("data"), dict) else None
    return version if isinstance(version, dict) and version.get("path") else None


def data_version_text(version: dict[str, Any]) -> str:
    """One line of a data version: `dvc: images at commit c7d0a16b0065 of /data/repo (images.dvc, md5 166b9274..., remote ...)`."""
    where = ", ".join(
        x
        for x in (
            str(version.get("dvc_file") or ""),
            f"md5 {str(version['hash'])[:12]}..." if version.get("hash") else "",
            f"remote {version['remote_url']}" if version.get("remote_url") else "",
        )
        if x
    )
    commit = version.get("commit")  # None: the data's repository had no commit yet
    text = (
        f"{version.get('tool') or 'dvc'}: {version['path']} at {f'commit {str(commit)[:12]}' if commit else 'no commit'} "
        f"of {version.get('git_remote') or version.get('repository')} ({where})"
    )
    if version.get("workspace") == "differs":
        text += "; the data read differed from this version"
    elif version.get("dvc_file_committed") is False:
        text += f"; {version.get('dvc_file')} had uncommitted changes"
    return text


# The CPU lock where each layout of the checkout keeps it: today's, and the root of runs recorded
# before the locks moved into requirements/.
CPU_LOCKS = ("requirements/cpu.lock", "requirements.lock")


def lock_in_checkout(recorded: str) -> str:
    """Where a run's recorded lock file (an absolute path on the machine that trained) is in a checkout."""
    path = Path(recorded or CPU_LOCKS[0])
    return f"requirements/{path.name}" if path.parent.name == "requirements" else path.name


def lock_hash(root: Path | None = None) -> dict[str, Any]:
    """The lock this environment was installed from: tensorflow-cpu means requirements/cpu.lock."""
    from importlib import metadata

    try:
        metadata.version("tensorflow-cpu")
        name = "requirements/cpu.lock"
    except metadata.PackageNotFoundError:
        name = "requirements/gpu.lock"
    lock = (root or project_root()) / name
    return {"file": str(lock), "sha256": file_sha256(lock)}


def gpu_facts() -> list[dict[str, Any]]:
    """The driver's view of the GPUs (train.gpucheck); [] in a fork that dropped the GPU check."""
    try:
        from ..gpucheck.gpuinfo import query_gpus
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


def section(record: dict[str, Any], key: str) -> dict[str, Any]:
    """`record[key]` where it is a mapping, else {}: a manifest edited by hand may hold anything there,
    and a reader then finds its fields unknown instead of failing."""
    value = record.get(key)
    return value if isinstance(value, dict) else {}


# What made a run's weights: kept by a segment that trains nothing (open_segment, record_data).
WHAT_TRAINED = ("git", "requirements_lock", "tensorflow", "keras", "build_info", "python", "gpus")


def environment_facts(settings) -> dict[str, Any]:
    """Where and with what this segment runs: versions, host, GPUs, git, lock (the latest segment's)."""
    return {
        "seed": settings.seed,
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": redact_argv(sys.argv),
        **tf_facts(),
        "gpus": gpu_facts(),
        "git": git_info(),
        "requirements_lock": lock_hash(),
    }


def new_segment(
    epochs_planned: int,
    start_epoch: int = 0,
    resumed_from: str | None = None,
    forced: list[str] | None = None,
    restart: bool = False,
    smoke: bool = False,
    config_sha256: str | None = None,
    trains: bool = True,
) -> dict[str, Any]:
    """One entry of the manifest's `segments`: a stretch of training by one process.

    `config_sha256` is config.json as this process wrote or kept it: the next resume refuses a file
    that differs (train.run.resume.check_config). `trains` False: a resume with nothing left to train
    (every epoch done, or early stopping reached), which keeps the record of what trained the weights."""
    return {
        "started_at": now_iso(),
        "ended_at": None,
        "status": "running",
        "error": None,
        "seconds": None,
        "host": socket.gethostname(),
        "command": redact_argv(sys.argv),
        "resumed_from": resumed_from,
        "forced_changes": list(forced or []),
        "restart": restart,
        "smoke": smoke,
        "epochs_planned": epochs_planned,
        "epoch_from": start_epoch,
        "epoch_to": None,
        "data_fingerprint": None,
        "config_sha256": config_sha256,
        "trains": trains,
    }


def resume_point(checkpoint: str, epochs_done: int, step: int) -> str:
    """A segment's `resumed_from`, numbered as the log numbers epochs: `epoch 2, step 7` is step 7
    of the second epoch (one epoch completed), the same words as `resuming at epoch 2, step 7`."""
    return f"{checkpoint} (epoch {epochs_done + 1}, step {step})"


def start_manifest(
    path: Path, settings, run_id: str, segment: dict[str, Any], batch: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A new run's manifest, with its first segment open; `batch`: how BATCH_SIZE and LEARNING_RATE were
    chosen, for a run that set neither (train.training.fit)."""
    facts = environment_facts(settings)
    manifest = {
        "run_id": run_id,
        "status": "running",
        "started_at": segment["started_at"],
        "resumed_at": [],
        "ended_at": None,
        "error": None,
        **facts,
        **({"batch": batch} if batch else {}),
        "segments": [{**segment, "git": facts.get("git")}],
    }
    write_json(path, manifest)
    return manifest


def open_segment(
    path: Path, previous: dict[str, Any], settings, segment: dict[str, Any], last_write: float | None = None
) -> dict[str, Any]:
    """A resumed run: append a segment to the manifest as found, keeping everything it recorded.

    `previous` is the manifest read (and checked) before the resume was validated; `last_write`
    (epoch seconds) is when the previous process last saved a state, the end of a segment that
    was killed without recording its own.
    """
    manifest = dict(previous)
    found = manifest.get("segments")
    found = found if isinstance(found, list) and found else [_legacy_segment(previous)]
    segments = [dict(s) for s in found if isinstance(s, dict) and s]
    if segments and segments[-1].get("status") == "running":  # SIGKILL, power cut: it never closed
        last = segments[-1]
        last["status"] = "killed"
        if last_write is not None and last.get("started_at"):
            ended = _dt.datetime.fromtimestamp(last_write, _dt.timezone.utc)
            last["ended_at"] = ended.isoformat(timespec="seconds")
            last["seconds"] = max(
                0.0, round((ended - _dt.datetime.fromisoformat(last["started_at"])).total_seconds(), 2)
            )
            last["seconds_estimated"] = True  # up to its last checkpoint
    facts = environment_facts(settings)
    segment = {**segment, "git": facts.get("git")}  # each segment's own code
    if not segment.get("trains", True) and "git" in previous:
        # A completed run resumed as it was trains nothing (its test split and export are done
        # again): its weights are still the earlier code's, whose record `reproduce` checks out.
        facts = {k: v for k, v in facts.items() if k not in WHAT_TRAINED}
    manifest.update(
        facts,
        status="running",
        ended_at=None,
        error=None,
        resumed_at=list(previous.get("resumed_at") or []) + [segment["started_at"]],
        segments=segments + [segment],
    )
    manifest.setdefault("started_at", segment["started_at"])
    manifest.setdefault("run_id", Path(path).parent.name)  # a run killed before its first manifest
    write_json(path, manifest)
    return manifest


def _legacy_segment(previous: dict[str, Any]) -> dict[str, Any] | None:
    """A manifest written before segments were recorded: its one summary becomes the first segment."""
    if not previous:
        return None
    return {
        "started_at": (previous.get("resumed_at") or [previous.get("started_at")])[-1],
        "ended_at": previous.get("ended_at"),
        "status": previous.get("status"),
        "error": previous.get("error"),
        "seconds": previous.get("duration_seconds"),
        "host": previous.get("host"),
        "epoch_to": previous.get("epochs_completed"),
        "data_fingerprint": section(previous, "data").get("fingerprint"),
        "note": "summary of the run before segments were recorded",
    }


def record_data(path: Path, data: dict[str, Any], precision: dict[str, Any]) -> dict[str, Any]:
    """The data and precision this segment trains with: the run's `data` and `precision` (those of
    the newest segment that trains), and the open segment's fingerprint, policy and CPU kernels (a
    resume on other devices, or by another version on an AVX2-only CPU, may differ: their weights
    then differ by rounding)."""
    manifest = read_json(path)
    segments = manifest.get("segments") or [{}]
    segments[-1].update(data_fingerprint=data.get("fingerprint"), precision=precision.get("policy"))
    if (precision.get("cpu") or {}).get("onednn"):
        segments[-1].update(onednn=precision["cpu"]["onednn"])
    manifest.update(data=data)
    if segments[-1].get("trains", True) or "precision" not in manifest:
        manifest.update(precision=precision)
    write_json(path, manifest)
    return manifest


def close_segment(
    path: Path,
    status: str,
    error: str | None,
    seconds: float,
    epoch: int | None = None,
    best: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """End the open segment. The run's own fields (best, export, final weights hash, final metrics)
    are only ever replaced by newer values, never emptied by a segment that did not finish."""
    manifest = read_json(path)
    segments = manifest.get("segments") or []
    if segments:
        segments[-1].update(ended_at=now_iso(), status=status, error=error, seconds=round(seconds, 2), epoch_to=epoch)
    manifest.update(
        status=status,
        ended_at=now_iso(),
        error=error,
        duration_seconds=round(sum(s.get("seconds") or 0.0 for s in segments) if segments else seconds, 2),
    )
    if epoch is not None:
        manifest["epochs_completed"] = epoch
    if best is not None and best.get("value") is not None:
        manifest["best"] = best
    write_json(path, manifest)
    return manifest


def record_unfinished_epoch(path: Path, epoch: int, seconds: float) -> None:
    """The training seconds a stopped segment spent in the epoch it did not finish (1-based `epoch`).

    metrics.csv only has the part of that epoch the resumed segment trains, so "time to best"
    (train.results.run_records) adds this. Informative only: a damaged manifest or a full disk is logged, and
    the stop goes on (its state is already saved)."""
    from ..errors import StorageError

    try:
        manifest = read_json(path)
        segments = manifest.get("segments")
        if seconds > 0 and isinstance(segments, list) and segments and isinstance(segments[-1], dict):
            segments[-1]["unfinished_epoch"] = {"epoch": epoch, "train_seconds": round(seconds, 3)}
            write_json(path, manifest)
    except (OSError, ValueError, StorageError) as exc:
        logging.getLogger("train").warning("WARNING: manifest not updated with the unfinished epoch: %s", exc)


def update_manifest(path: Path, **fields: Any) -> dict[str, Any]:
    manifest = read_json(path) if path.is_file() else {}
    manifest.update(fields)
    write_json(path, manifest)
    return manifest
