"""Finding runs: new run ids, creating a run directory, listing RUNS_DIR, resolving `latest` or an id."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import RunNotFound, RunRecordError, StorageError
from ..locations import creation_key, new_run_id, runs_dir_flag
from .files import ensure_writable, storage_error
from .remote import local_dir, shown
from .rundir import RunDir

log = logging.getLogger("train")


def list_run_dirs(runs_dir: str | Path) -> list[Path]:
    """The run directories under RUNS_DIR, oldest first (by creation, not by name).

    An entry that cannot be looked into (mode 000, another user's folder, `lost+found` on a
    mounted volume) is one warning line and is left out; it never hides the runs beside it.
    RUNS_DIR itself unreadable is a StorageError: "no runs" would be a guess.
    """
    runs, unreadable = scan_run_dirs(runs_dir)
    for path, reason in unreadable:
        log.warning(
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


@dataclass(frozen=True)
class Need:
    """What a command needs of a run for `latest` to name it: any one of these files of the run."""

    what: str  # as a line says it: "the newest run with {what}"
    files: tuple[str, ...]  # relative to the run directory


WEIGHTS = Need("weights", ("best.weights.h5", "final.weights.h5"))
EXPORT = Need("an export", ("export/savedmodel/saved_model.pb",))
WEIGHTS_OR_EXPORT = Need("weights or an export", WEIGHTS.files + EXPORT.files)


def pick_latest(names: Sequence[str], has: Callable[[str, str], bool], needs: Sequence[Need]) -> tuple[str, str]:
    """(the run `latest` names, the line that says which and why): `names` oldest first, not empty.

    Without `needs` it is the newest run. With them, the newest run that has the first need,
    else the second...; when none has any, the newest run (the command then says what it lacks).
    `has(name, rel)`: whether run `name` holds the file `rel`."""
    for need in needs:
        found = next((n for n in reversed(names) if any(has(n, rel) for rel in need.files)), None)
        if found is not None:
            newer = list(names[names.index(found) + 1 :])
            if not newer:
                return found, f"latest: run {found}"
            shown = ", ".join(newer[::-1][:3]) + (f" and {len(newer) - 3} more" if len(newer) > 3 else "")
            return found, f"latest: run {found}, the newest run with {need.what} (newer, without: {shown})"
    if needs:
        return names[-1], f"latest: run {names[-1]} (no run has {' or '.join(n.what for n in needs)})"
    return names[-1], f"latest: run {names[-1]}"


def resolve_run(
    runs_dir: str | Path, run: str, needs: Sequence[Need] = (), say: Callable[[str], None] | None = None
) -> Path:
    """A run id under RUNS_DIR, a path to a run directory, or 'latest': the last one created, or for a
    command that `needs` weights or an export, the last one that has them (pick_latest; `say` gets
    the line that names it)."""
    root = local_dir(runs_dir)
    if run == "latest":
        runs = list_run_dirs(root)
        if not runs and RunDir(root).is_run():  # RUNS_DIR=runs/<id>, as `runs` says too
            raise RunNotFound(
                f"run 'latest': RUNS_DIR {shown(runs_dir)} is a run itself: name it as the run instead of latest, "
                f"or point RUNS_DIR at the folder that holds it, {root.resolve().parent}"
            )
        if not runs:
            raise RunNotFound(f"run 'latest': no runs in {shown(runs_dir)}; train first or set RUNS_DIR")
        name, line = pick_latest([p.name for p in runs], lambda n, rel: (root / n / rel).is_file(), needs)
        if needs:
            (say or log.info)(line)
        return root / name
    for candidate in (root / run, Path(run)):
        try:
            if is_run_dir(candidate):
                return candidate
        except OSError as exc:  # a folder this user may not look into (mode 000, another owner)
            raise RunRecordError(
                f"run {run!r}: {candidate} cannot be read ({exc.strerror or exc}); make it readable "
                "(chmod, or chown to this user) or run as its owner"
            ) from None
    # A run's config.json, `predict a.png b.png` (the run left out, an image taken for it), a file in RUNS_DIR.
    file = next((c for c in (root / run, Path(run)) if c.is_file()), None)
    # Pasted, the command looks where this one did (a store by its URL, not its staging copy).
    flag = runs_dir_flag(runs_dir if str(runs_dir) == "./runs" else shown(runs_dir))
    if file is not None:
        if is_run_dir(file.parent):
            fix = f"name its folder, {file.parent}"
        elif file.parent == root:
            fix = f"a run is a folder of {shown(runs_dir)} with a config.json; `python -m train runs{flag}` lists them"
        else:
            fix = f"name the run by its id, its folder or latest (predict takes it before the images: `python -m train predict latest{flag} {shlex.quote(run)}`)"
        raise RunNotFound(f"run {run!r} is a file, not a run: {fix}")
    raise RunNotFound(
        f"run {run!r} not found in {shown(runs_dir)} (no {RunDir(run).config.name}){_did_you_mean(root, run)}; "
        f"`python -m train runs{flag}` lists the runs"
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
