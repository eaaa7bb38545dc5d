"""Finding runs: new run ids, creating a run directory, listing RUNS_DIR, resolving `latest` or an id."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ..errors import RunNotFound, RunRecordError, StorageError
from ..locations import creation_key, new_run_id
from .files import ensure_writable, storage_error
from .remote import local_dir
from .rundir import RunDir

log = logging.getLogger("train")


def list_run_dirs(runs_dir: str | Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """The run directories under RUNS_DIR, oldest first (by creation, not by name).

    An entry that cannot be looked into (mode 000, another user's folder, `lost+found` on a
    mounted volume) is one warning line and is left out; it never hides the runs beside it.
    RUNS_DIR itself unreadable is a StorageError: "no runs" would be a guess.
    """
    runs, unreadable = scan_run_dirs(runs_dir)
    for path, reason in unreadable:
        (warn or log.warning)(
            f"WARNING: {path} in RUNS_DIR cannot be read ({reason}): left out; make it readable "
            "(chmod, or chown to this user) or move it out of RUNS_DIR"
        )
    return runs


def scan_run_dirs(runs_dir: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(the run directories oldest first, [(entry, reason)] for the entries that cannot be read)."""
    root = local_dir(runs_dir)
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError as exc:
        raise StorageError(
            f"cannot list RUNS_DIR {root}: {exc.strerror or exc}; make it readable by this user "
            "(chmod u+rx) or point RUNS_DIR at another folder"
        ) from None
    found, unreadable = [], []
    for p in entries:
        try:
            if is_run_dir(p):
                found.append(p)
        except OSError as exc:
            unreadable.append((p, exc.strerror or type(exc).__name__))
    return sorted(found, key=creation_key), unreadable


def create_run_dir(runs_dir: str | Path, run_name: str = "") -> Path:
    root = ensure_writable(local_dir(runs_dir))
    for _ in range(100):  # a collision means the same microsecond: the next try is later
        path = root / new_run_id(run_name)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise storage_error(path, exc) from exc
        run = RunDir(path)
        for sub in (run.checkpoints, run.tensorboard):
            sub.mkdir()
        return path
    raise StorageError(f"could not create a unique run directory under {root}")


def is_run_dir(path: Path | str) -> bool:
    return RunDir(path).is_run()


def resolve_run(runs_dir: str | Path, run: str) -> Path:
    """A run id under RUNS_DIR, a path to a run directory, or 'latest' (the last one created)."""
    root = local_dir(runs_dir)
    if run == "latest":
        runs = list_run_dirs(root)
        if not runs:
            raise RunNotFound(f"--resume/RUN 'latest': no runs in {root}; train first or set RUNS_DIR")
        return runs[-1]
    for candidate in (root / run, Path(run)):
        try:
            if is_run_dir(candidate):
                return candidate
        except OSError as exc:  # a folder this user may not look into (mode 000, another owner)
            raise RunRecordError(
                f"run {run!r}: {candidate} cannot be read ({exc.strerror or exc}); make it readable "
                "(chmod, or chown to this user) or run as its owner"
            ) from None
    raise RunNotFound(
        f"run {run!r} not found in {root} (no {RunDir(run).config.name}){_did_you_mean(root, run)}; "
        "`python -m train runs` lists the runs"
    )


def _did_you_mean(root: Path, run: str) -> str:
    """A run whose name starts with `run` (a name with a space, unquoted, arrives cut at the space:
    `report base copy.bak`), else the closest name."""
    import difflib

    try:
        names = [p.name for p in scan_run_dirs(root)[0]]
    except StorageError:
        return ""
    longer = [n for n in names if n.startswith(run) and n != run]
    if longer:
        spaced = " ".join(repr(n) for n in longer[:3] if " " in n[len(run) :][:1])
        if spaced:
            return f"; did you mean {spaced}? (quote a name that has a space)"
        return "; did you mean " + ", ".join(repr(n) for n in longer[:3]) + "?"
    close = difflib.get_close_matches(run, names, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
