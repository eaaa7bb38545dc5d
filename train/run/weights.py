"""Weights files (best.weights.h5, final.weights.h5): written with their sha256 recorded, verified before use.

The record is the manifest's `weights`: one entry per file name with the file's sha256, size and
the epoch it holds. It is written before the file is moved into place, and keeps the entry of the
file it replaces as `previous`: a kill (or a failed rename) between the two leaves the older,
complete file, which still matches a recorded hash. Every reader (export, predict, reproduce)
calls `verify` first: a file whose bytes differ from both is refused (WeightsError, exit 4), never
loaded. Runs written before hashes were recorded have no entry; their files are used with one
warning line.
"""

from __future__ import annotations

import codecs
import logging
import shlex
from pathlib import Path
from typing import Any

from ..digest import sha256_file
from ..errors import RunRecordError, WeightsError, first_line
from ..locations import runs_dir_flag
from .files import atomic_write, read_json, write_json
from .manifest import now_iso
from .rundir import RunDir

log = logging.getLogger("train")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def records(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The manifest's `weights` entries by file name ({} for a run written before they were kept).
    RunRecordError for an entry, or its `previous`, that is no object: nothing to check the file against."""
    run = RunDir(run_dir)
    found = run.read_manifest(missing_ok=True).get("weights")
    for name, entry in (found if isinstance(found, dict) else {}).items():
        part, value = (name, entry) if not isinstance(entry, dict) else (f"{name}'s previous", entry.get("previous"))
        if not isinstance(value, dict) and (value or part == name):
            raise RunRecordError(
                f"run {run.name}: {run.manifest} records {part} as {value!r:.60}, not a JSON object of its sha256 "
                "and epoch (an edit, a bad merge); restore manifest.json from a backup"
            )
    return found if isinstance(found, dict) else {}


def save_weights(model, path: Path, epoch: int, size_hint: int = 0) -> dict[str, Any]:
    """Write `model`'s weights to `path` atomically and record the file's sha256 in the manifest."""
    path = Path(path)
    files = RunDir(path.parent)
    entry: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        model.save_weights(tmp)
        entry.update(sha256=sha256_file(tmp), bytes=tmp.stat().st_size, epoch=int(epoch), written_at=now_iso())
        manifest = read_json(files.manifest) if files.manifest.is_file() else {}
        table = dict(manifest.get("weights") or {})
        before = _on_disk(path, table.get(path.name))
        if before:
            entry["previous"] = {k: before[k] for k in ("sha256", "bytes", "epoch") if k in before}
        table[path.name] = entry
        manifest["weights"] = table
        write_json(files.manifest, manifest)  # before the rename: see the module docstring

    atomic_write(path, write, size_hint=size_hint)
    return entry


def _on_disk(path: Path, entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """Which of `entry` and its `previous` the file now at `path` is (None: neither, or no file)."""
    if not entry or not path.is_file():
        return None
    actual = sha256_file(path)
    for candidate in (entry, entry.get("previous") or {}):
        if candidate.get("sha256") == actual:
            return candidate
    return None


def verify_all(run_dir: Path, runs_dir: object = None) -> list[dict[str, Any]]:
    """`verify` for every weights file of the run, with at most one warning line for a run without records."""
    found = RunDir(run_dir).weights()
    unrecorded = [p.name for p in found if p.name not in records(run_dir)]
    if unrecorded:
        log.warning(
            "WARNING: run %s: %s no recorded sha256 (written before hashes were kept), so %s used unverified",
            Path(run_dir).name,
            " and ".join(unrecorded) + (" has" if len(unrecorded) == 1 else " have"),
            "it is" if len(unrecorded) == 1 else "they are",
        )
    return [verify(run_dir, p, warn=False, runs_dir=runs_dir) for p in found]


def verify(run_dir: Path, path: Path, warn: bool = True, runs_dir: object = None) -> dict[str, Any]:
    """The record of the weights file `path` after checking its bytes; WeightsError when they differ.

    Returns {"file", "sha256", "epoch"} (epoch None when nothing was recorded). A run written before
    hashes were recorded gets one warning line and the hash measured now. `runs_dir`: where the command
    found the run (RUNS_DIR or --runs-dir), for the command the message gives to paste.
    """
    run_dir, path = Path(run_dir), Path(path)
    entry = records(run_dir).get(path.name)
    try:
        actual = sha256_file(path)
    except OSError as exc:
        raise WeightsError(
            f"run {run_dir.name}: {path} cannot be read ({exc.strerror or exc}): give the user running this "
            f"read access to it; {fallback(run_dir, path, runs_dir)}"
        ) from None
    if not entry:
        if warn:
            log.warning(
                "WARNING: run %s: %s has no recorded sha256 (written before hashes were kept), so it is used unverified",
                run_dir.name,
                path.name,
            )
        return {"file": path.name, "sha256": actual, "epoch": None}
    for candidate in (entry, entry.get("previous") or {}):
        if candidate.get("sha256") == actual:
            return {"file": path.name, "sha256": actual, "epoch": candidate.get("epoch")}
    raise WeightsError(
        f"run {run_dir.name}: {path} has sha256 {actual} but {entry.get('sha256')} was recorded when it was "
        f"written (epoch {entry.get('epoch')}): the file changed on disk (bit rot, a bad copy); "
        f"{fallback(run_dir, path, runs_dir)}"
    )


def describe(path: Path) -> str:
    """What a weights file that does not load is: empty, text, another format, or a damaged HDF5 file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if size == 0:
        return "it is empty (0 bytes)"
    if head.startswith(HDF5_SIGNATURE):
        return f"it is an HDF5 file that does not load ({size} bytes: truncated or damaged)"
    try:  # incremental: a character cut at the head's end is not a decode error
        codecs.getincrementaldecoder("utf-8")().decode(head)
        return f"it is text, not an HDF5 weights file ({size} bytes)"
    except UnicodeDecodeError:
        return f"it is not an HDF5 weights file ({size} bytes)"


def load_weights(model, run_dir: Path, path: Path, runs_dir: object = None) -> dict[str, Any]:
    """Verify, then load `path` into `model`; WeightsError naming the file and the fix when it cannot be."""
    source = verify(run_dir, path, runs_dir=runs_dir)
    try:
        model.load_weights(path)
    except Exception as exc:  # h5py and Keras raise OSError, ValueError, KeyError... for a damaged file
        first = first_line(exc) or type(exc).__name__
        raise WeightsError(
            f"run {Path(run_dir).name}: {path} does not load: {describe(path)} ({type(exc).__name__}: {first}); "
            f"{fallback(run_dir, path, runs_dir)}"
        ) from None
    return source


def fallback(run_dir: Path, bad: Path, runs_dir: object = None) -> str:
    """The fix for a damaged weights file: an intact other weights file, else the latest checkpoint."""
    files = RunDir(run_dir)
    aside = f"`mv {shlex.quote(str(bad))} {shlex.quote(f'{bad}.damaged')}`"
    for other in files.weights():
        intact = other != bad and _intact(run_dir, other)
        if intact:
            return (
                f"move it aside ({aside}) and run the command again to use {other.name} "
                f"(epoch {intact.get('epoch')}), which is intact"
            )
    from .checkpoints import latest_header, list_states

    states = list_states(files.checkpoints)
    if states:
        header = latest_header(files.checkpoints) or {}
        return (
            f"restore it from a backup; the run's latest checkpoint {states[0].name} (epoch {header.get('epoch')}) "
            f"still holds its weights: move it aside ({aside}) and resume the run with its own settings "
            f"(`python -m train --resume {files.name}{runs_dir_flag(runs_dir)}`) to write {files.final_weights.name} "
            "again (a run stopped before its last epoch, by a signal or MAX_MINUTES, trains the rest first)"
        )
    return "restore it from a backup, or train the run again"


def _intact(run_dir: Path, path: Path) -> dict[str, Any] | None:
    """The record `path` matches; None when it matches none (or has none to be checked against)."""
    try:
        return _on_disk(path, records(run_dir).get(path.name))
    except OSError:
        return None
