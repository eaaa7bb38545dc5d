"""The run directory: its id, its layout (`RunDir`), atomic writes into it, and finding a run again.

runs/<run-id>/
  config.json        resolved settings        manifest.json   versions, data, git, how it ended
  train.log          console lines            metrics.csv     one row per epoch
  tensorboard/       TensorBoard logs         checkpoints/    resumable states + LATEST pointer
  best.weights.h5    best weights on MONITOR  final.weights.h5 weights at the end of training
  labels.txt         class names, one a line  export/         SavedModel, model.keras, labels.txt
  report.html        the run at a glance      curves.png      the curves of report.html
  reproduce.json     a rerun's verdict        run.lock        held by the one process writing the run
Only `RunDir` spells these names; every module asks it for a path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunRecordError, StorageError, TemplateError

log = logging.getLogger("train")
TMP_MARK = ".tmp-"
CACHE_DIR = ".cache"  # under RUNS_DIR: the image decode cache (a hidden folder, never a run)
WRITERS_LOCK = ".writers.lock"  # see shared_writes
# 20261130-061959-483920[-name]: date, time, microseconds. Ids made before the microseconds
# (20261130-061959-a1b2) carry 4 random hex digits instead.
_ID = re.compile(r"^(\d{8}-\d{6})-([0-9a-f]{4}|\d{6})(?:-|$)")


@dataclass(frozen=True)
class ExportDir:
    """export/ (or its staging folder): what a serving user copies away."""

    path: Path

    savedmodel = property(lambda self: self.path / "savedmodel")
    keras = property(lambda self: self.path / "model.keras")
    labels = property(lambda self: self.path / "labels.txt")  # a copy of the run's class names
    parity = property(lambda self: self.path / "parity.json")
    source = property(lambda self: self.path / "source.json")  # the weights it came from, its files' sha256


@dataclass(frozen=True)
class RunDir:
    """One run directory: the only place that knows its file and folder names (see the module doc).

    Class names and input shape have one source, the manifest's `data` (`data_description`): it
    is written once the data is loaded, beside the data's fingerprint, and JSON keeps any class
    name intact. labels.txt and export/labels.txt are copies written from it for people and for
    serving code outside this package; nothing here reads them back.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def name(self) -> str:
        return self.path.name

    # Read-only paths, one a line: the layout at a glance.
    config = property(lambda self: self.path / "config.json")
    manifest = property(lambda self: self.path / "manifest.json")
    labels = property(lambda self: self.path / "labels.txt")
    log = property(lambda self: self.path / "train.log")
    metrics = property(lambda self: self.path / "metrics.csv")
    tensorboard = property(lambda self: self.path / "tensorboard")
    checkpoints = property(lambda self: self.path / "checkpoints")
    best_weights = property(lambda self: self.path / "best.weights.h5")
    final_weights = property(lambda self: self.path / "final.weights.h5")
    report = property(lambda self: self.path / "report.html")
    curves = property(lambda self: self.path / "curves.png")
    reproduce = property(lambda self: self.path / "reproduce.json")
    lock = property(lambda self: self.path / "run.lock")
    export = property(lambda self: ExportDir(self.path / "export"))

    def own_names(self) -> set[str]:
        """The names of the files and folders a run writes at its top level (the layout above)."""
        values = [getattr(self, name) for name, value in vars(RunDir).items() if isinstance(value, property)]
        paths = [v.path if isinstance(v, ExportDir) else v for v in values]
        return {p.name for p in paths if isinstance(p, Path) and p.parent == self.path}

    def is_run(self) -> bool:
        """The one test of "is a run": a directory with its config.json, the first file a run writes.

        A folder without it (a stray one, or a run killed between mkdir and its first write) is no
        run for any command: `runs`, `latest`, RESUME=auto, report, compare, export, reproduce."""
        return self.path.is_dir() and self.config.is_file()

    def read_config(self) -> dict[str, Any]:
        return read_record(self.path, self.config.name)

    def read_manifest(self, missing_ok: bool = False) -> dict[str, Any]:
        """manifest.json; {} when `missing_ok` and the run ended before writing it."""
        if missing_ok and not self.manifest.exists():
            return {}
        return read_record(self.path, self.manifest.name)

    def weights(self) -> list[Path]:
        """The weights files present, best first."""
        return [p for p in (self.best_weights, self.final_weights) if p.is_file()]

    def data_description(self) -> tuple[list[str], tuple[int, ...]]:
        """(class names, input shape) from the manifest's `data`; RunRecordError when it has none."""
        data = self.read_manifest().get("data") or {}
        names, shape = data.get("class_names"), data.get("input_shape")
        if not isinstance(names, list) or not isinstance(shape, list):
            raise RunRecordError(
                f"run {self.name} has no data description in {self.manifest}: it ended before its "
                "data loaded; resume it or train a new run"
            )
        return [str(n) for n in names], tuple(int(d) for d in shape)

    def write_labels(self) -> None:
        """labels.txt, derived from the manifest's class names; rewritten only when it differs."""
        text = labels_text(self.data_description()[0])
        if not self.labels.is_file() or self.labels.read_text(encoding="utf-8") != text:
            write_text(self.labels, text)


def labels_text(class_names) -> str:
    """The labels.txt format: one class name a line, in class-index order."""
    return "".join(f"{n}\n" for n in class_names)


ID_LENGTH = len("20261130-061959-483920-")  # what new_run_id puts before RUN_NAME


def name_max(directory: Path | str) -> int:
    """The longest file name, in bytes, the file system of `directory` (or of its nearest existing
    parent: RUNS_DIR may not exist yet) allows; 255 where it does not say."""
    path = Path(directory).absolute()
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            try:
                return os.pathconf(candidate, "PC_NAME_MAX")
            except (OSError, ValueError):
                break
    return 255


def run_name_problem(run_name: str, runs_dir: Path | str) -> str | None:
    """Why a run directory named after `run_name` cannot be created in `runs_dir`, or None.

    The limit is on bytes, not characters: a letter outside ASCII takes 2 to 4 bytes in UTF-8, so
    64 characters may already be too long ("File name too long" at mkdir, after the start-up)."""
    size, limit = len(run_name.encode("utf-8", "surrogatepass")), name_max(runs_dir) - ID_LENGTH
    if size <= limit:
        return None
    return (
        f"{size} bytes in UTF-8, more than the {limit} a run directory's name leaves for it (the file system "
        f"of {runs_dir} allows {limit + ID_LENGTH} bytes a name, the run id takes {ID_LENGTH}): shorten it "
        "(each letter outside ASCII takes 2 to 4 bytes)"
    )


def new_run_id(run_name: str = "", now: _dt.datetime | None = None) -> str:
    """Readable, and ordered by creation down to the microsecond: 20261130-061959-483920[-name].

    Two runs started within one second get different ids in the order they were created (a
    random suffix would order them by chance); two in the same microsecond collide on mkdir and
    the later one takes the next id (create_run_dir).
    """
    now = now or _dt.datetime.now()
    rid = now.strftime("%Y%m%d-%H%M%S-%f")
    return f"{rid}-{run_name}" if run_name else rid


def creation_key(path: Path) -> tuple:
    """Sort key: creation order from the id (old 4-hex ids: by second, then name); other names first."""
    m = _ID.match(path.name)
    if not m:
        return ("", -1, path.name)
    micro = int(m.group(2)) if len(m.group(2)) == 6 else -1
    return (m.group(1), micro, path.name)


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
    root = Path(runs_dir)
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


def in_container(root: Path = Path("/")) -> bool:
    """Whether this process runs in a Docker or Podman container (their marker files)."""
    return (root / ".dockerenv").exists() or (root / "run/.containerenv").exists()


def _permission_hint(in_docker: bool) -> str:
    if in_docker:  # RUNS_DIR is the /runs volume there; what decides is who owns its host folder
        return (
            "permission denied: the container runs as HOST_UID:HOST_GID, which must own the host folder "
            "mounted at /runs (RUNS_HOST_DIR, default ./runs): create it as yourself (`mkdir -p runs`) and "
            "put HOST_UID=<`id -u`> and HOST_GID=<`id -g`> in .env (`invoke train` passes them)"
        )
    return "permission denied: run as the owner of RUNS_DIR or point RUNS_DIR at a folder you can write"


def storage_error(path: Path | str, exc: OSError, in_docker: bool | None = None) -> StorageError:
    """The StorageError for `exc`, with the fix that fits the host or the container (`in_docker`)."""
    if in_docker is None:
        in_docker = in_container()
    reason = {
        errno.ENOSPC: "the disk is full: free space or point RUNS_DIR at a larger volume",
        errno.EDQUOT: "the disk quota is exceeded: free space or point RUNS_DIR elsewhere",
        errno.EFBIG: "the file size limit was hit: raise `ulimit -f` or point RUNS_DIR elsewhere",
        errno.EROFS: "the file system is read-only: mount the runs volume read-write or set RUNS_DIR",
        errno.ENAMETOOLONG: "a name in the path is longer than the file system allows: shorten RUN_NAME or RUNS_DIR",
        errno.EACCES: _permission_hint(in_docker),
        errno.EPERM: _permission_hint(in_docker),
    }.get(exc.errno, exc.strerror or str(exc))
    return StorageError(f"cannot write {path}: {reason}")


def atomic_write(path: Path | str, write: Callable[[Path], None], size_hint: int = 0) -> Path:
    """Write through `write(tmp_path)` into a temp file beside `path`, fsync it, then os.replace.

    A kill at any moment leaves either the old file or the new one, never half of one. The temp
    name keeps the final suffix (Keras checks `.weights.h5` endings) and carries TMP_MARK so a
    later start can clean up after a kill (`clean_stale_temp`).

    `size_hint` (bytes): refuse up front, as a full disk, when less is free. HDF5 writers (Keras
    `save_weights`) that hit ENOSPC leave a file HDF5 cannot close, and the process then dies with
    SIGSEGV at exit instead of reporting the full disk.
    """
    path = Path(path)
    if size_hint and shutil.disk_usage(path.parent).free < size_hint:
        raise storage_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    tmp_path = _new_temp(path)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        raise storage_error(path, exc) from exc
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def _new_temp(path: Path) -> Path:
    """An empty, new temp file beside `path`, created with mode 0666 less the umask.

    Not tempfile.mkstemp: its files are 0600, which os.replace keeps, so a teammate or a
    TensorBoard container running as another user could not read the run's files.
    """
    prefix, suffix = path.name.split(".")[0] + TMP_MARK, "".join(path.suffixes)
    for _ in range(100):
        tmp = path.parent / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        except OSError as exc:
            raise storage_error(path, exc) from exc
        return tmp
    raise StorageError(f"cannot write {path}: no free temporary name in {path.parent}")


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A new directory in `parent` named prefix + TMP_MARK + random, mode 0777 less the umask.

    Not tempfile.mkdtemp, whose 0700 would survive the rename into place (see `_new_temp`).
    """
    for _ in range(100):
        path = parent / f"{prefix}{TMP_MARK}{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise StorageError(f"cannot write {parent}: no free temporary name")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: Path | str, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path | str, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path | str) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def clean_stale_temp(directory: Path) -> list[Path]:
    """Remove temp files left by a kill during a write (they are never the only copy of anything)."""
    removed = []
    if directory.is_dir():
        for p in directory.rglob(f"*{TMP_MARK}*"):
            if p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


@contextlib.contextmanager
def shared_writes(directory: Path) -> Iterator[list[Path]]:
    """Atomic writes into a folder that several processes write into (the decode cache under RUNS_DIR).

    A run directory has one writer (its lock), so its stale temp files are simply removed. Here
    every writer holds a shared flock on WRITERS_LOCK while inside, and the temp files are removed
    only by a process that gets it exclusively: nobody else is writing, so any temp file is left
    by a killed writer, never one still being written. Yields the files removed.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / WRITERS_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise storage_error(directory, exc) from exc
    try:
        removed: list[Path] = []
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            removed = clean_stale_temp(directory)
        except BlockingIOError:
            pass  # another process is writing here: its temp file is not stale
        fcntl.flock(fd, fcntl.LOCK_SH)  # from exclusive, or waits while another process cleans
        yield removed
    finally:
        os.close(fd)  # drops the lock


def ensure_writable(directory: Path | str) -> Path:
    """Create the directory and prove it is writable now, before any training time is spent."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe{TMP_MARK}{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise storage_error(directory, exc) from exc
    return directory


def create_run_dir(runs_dir: str | Path, run_name: str = "") -> Path:
    root = ensure_writable(runs_dir)
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
    root = Path(runs_dir)
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


class RunNotFound(TemplateError):
    """The run named on the command line does not exist (a usage error: exit 2)."""

    exit_code = 2
    kind = "config"


def read_record(run_dir: Path, name: str) -> dict[str, Any]:
    """config.json or manifest.json of a run as a dict; RunRecordError when it cannot be read."""
    path = Path(run_dir) / name
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise RunRecordError(
            f"run {Path(run_dir).name} has no {name} ({path}): it is not a complete run directory; "
            "start a new run, or restore the file from a backup"
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8 (truncated, overwritten)
        raise RunRecordError(
            f"run {Path(run_dir).name}: {path} is unreadable ({type(exc).__name__}: {exc}); "
            "restore it from a backup, or move the run directory out of RUNS_DIR"
        ) from None
    if not isinstance(data, dict):
        raise RunRecordError(
            f"run {Path(run_dir).name}: {path} holds {type(data).__name__}, not a JSON object; "
            "restore it from a backup, or move the run directory out of RUNS_DIR"
        )
    return data


def unknown_settings(data: dict[str, Any]) -> list[str]:
    """The keys of a config.json that are no setting of this version, each as `KEY (did you mean X?)`.

    A run written by a newer version (a setting added since), or a config.json edited by hand."""
    import difflib
    from dataclasses import fields

    from ..config import Settings

    known = sorted(f.name for f in fields(Settings))
    out = []
    for key in sorted(k for k in data if k not in known):
        close = difflib.get_close_matches(str(key).lower(), known, n=1, cutoff=0.6)
        out.append(str(key).upper() + (f" (did you mean {close[0].upper()}?)" if close else ""))
    return out


def read_run_settings(run_dir: Path, warn_unknown: bool = True):
    """The settings a run was started with (config.json); RunRecordError when they cannot be.

    A key that is no setting of this version is left out, with one warning line naming it
    (`warn_unknown`); a resume refuses it instead (train.run.resume), as it would train without it."""
    from ..config import settings_from_dict
    from ..errors import ConfigError

    data = RunDir(run_dir).read_config()
    unknown = unknown_settings(data)
    if unknown and warn_unknown:
        log.warning(
            "WARNING: run %s: %s holds %s, not a setting of this version (written by a newer version, or "
            "edited by hand): ignored here; use the version that wrote the run, or remove the key",
            Path(run_dir).name,
            RunDir(run_dir).config,
            ", ".join(unknown),
        )
    try:
        return settings_from_dict(data)
    except (ConfigError, TypeError, ValueError) as exc:
        raise RunRecordError(
            f"run {Path(run_dir).name}: {RunDir(run_dir).config} does not hold valid settings "
            f"({exc}); restore it from a backup, or move the run directory out of RUNS_DIR"
        ) from None
