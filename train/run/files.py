"""Files that survive a kill: atomic writes (temp file, fsync, os.replace), JSON and text helpers,
temp folders, and the one StorageError for an OSError, with the fix for the host or the container.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ..setup.hardware import in_container

TMP_MARK = ".tmp-"
WRITERS_LOCK = ".writers.lock"  # see shared_writes
# Called with the path of each finished atomic write: a run store's uploads wake on them (train.store.mirror).
_WATCHERS: list[Callable[[Path], None]] = []


def watch_writes(callback: Callable[[Path], None]) -> Callable[[], None]:
    """Call `callback(path)` after every atomic write from now on; returns the function that stops it."""
    _WATCHERS.append(callback)
    return lambda: _WATCHERS.remove(callback) if callback in _WATCHERS else None


def storage_error(
    path: Path | str, exc: OSError, in_docker: bool | None = None, setting: str | None = None
) -> StorageError:
    """The StorageError for `exc`, with the fix that fits the host or the container (`in_docker`).

    The fix names the setting that chose the folder: RUNS_DIR, or STORE_CACHE for the staging copy
    of a RUNS_DIR in object storage (given as `setting`, else found from the opened stores)."""
    if in_docker is None:
        in_docker = in_container()
    setting = setting or _setting_of(path)
    permission = f"permission denied: run as the owner of {setting} or point {setting} at a folder you can write"
    if setting == "RUNS_DIR" and in_docker:  # the /runs volume: what decides is who owns its host folder
        permission = (
            "permission denied: the container runs as HOST_UID:HOST_GID, which must own the host folder "
            "mounted at /runs (RUNS_HOST_DIR, default ./runs): create it as yourself (`mkdir -p runs`) and "
            "put HOST_UID=<`id -u`> and HOST_GID=<`id -g`> in .env (`invoke train` passes them)"
        )
    reason = {
        errno.ENOSPC: f"the disk is full: free space or point {setting} at a larger volume",
        errno.EDQUOT: f"the disk quota is exceeded: free space or point {setting} elsewhere",
        errno.EFBIG: f"the file size limit was hit: raise `ulimit -f` or point {setting} elsewhere",
        errno.EROFS: "the file system is read-only: "
        + (
            "mount the runs volume read-write or set RUNS_DIR"
            if setting == "RUNS_DIR"
            else f"point {setting} elsewhere"
        ),
        errno.ENAMETOOLONG: f"a name in the path is longer than the file system allows: shorten RUN_NAME or {setting}",
        errno.EACCES: permission,
        errno.EPERM: permission,
        errno.EISDIR: "a folder stands where this file is written: move the folder out of the way",
    }.get(exc.errno, exc.strerror or str(exc))
    if setting != "RUNS_DIR" and exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        reason = f"{reason} ({setting}: the local staging copy of a RUNS_DIR in object storage)"
    return StorageError(f"cannot write {path}: {reason}")


def _setting_of(path: Path | str) -> str:
    """STORE_CACHE for a path in the staging copy of an opened store (train.run.remote), else RUNS_DIR."""
    from .remote import staging_roots

    where = Path(path).absolute()
    return "STORE_CACHE" if any(where == r or r in where.parents for r in staging_roots()) else "RUNS_DIR"


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
    for callback in list(_WATCHERS):
        callback(path)
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
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: Path | str, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json(path: Path | str, data: Any) -> Path:
    return write_text(path, json_text(data))


def json_text(data: Any) -> str:
    """What write_json writes: its bytes are known (and hashed) before the file is."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


class NotRegularFileError(OSError):
    """A named pipe, device or socket where a run's record is read: reading it would block or never end."""


SPECIAL_FILES = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}


def refuse_socket(path: Path | str, exc: OSError) -> None:
    """A socket cannot be opened (ENXIO, "No such device or address"): it is named as one instead."""
    try:
        socket_file = exc.errno == errno.ENXIO and stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return
    if socket_file:
        raise NotRegularFileError(f"{SPECIAL_FILES[stat.S_IFSOCK]}, not a regular file") from None


def read_regular(path: Path | str, encoding: str = "utf-8", errors: str = "strict") -> str:
    """The text of a regular file. Opened without blocking and checked with fstat before a byte is read:
    a named pipe in place of a record (manifest.json, metrics.csv) would block the reader forever, so it
    is a NotRegularFileError saying what it is (IsADirectoryError for a folder, as open gives it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        refuse_socket(path, exc)
        raise
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind in SPECIAL_FILES:
            raise NotRegularFileError(f"{SPECIAL_FILES[kind]}, not a regular file")
        if kind == stat.S_IFDIR:  # named, as open() names it: a read of the descriptor would give its number
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        os.set_blocking(fd, True)
        with open(fd, encoding=encoding, errors=errors, newline="", closefd=False) as fh:
            return fh.read()
    finally:
        os.close(fd)


def read_json(path: Path | str) -> Any:
    """The JSON in `path`; ValueError, as any malformed JSON, for one nested deeper than Python recurses."""
    text = read_regular(path)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to be read (an array or object inside thousands of others)") from None


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


def in_kernel_files(path: Path | str) -> bool:
    """Under /proc or /sys no folder can be made, whoever runs it: not a permission to fix."""
    return Path(path).expanduser().absolute().parts[:2] in (("/", "proc"), ("/", "sys"))


def ensure_writable(directory: Path | str, setting: str | None = None) -> Path:
    """Create the directory and prove it is writable now, before any training time is spent.
    `setting`: the one that chose it, for the fix (see storage_error)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe{TMP_MARK}{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        if exc.errno == errno.ENOENT or in_kernel_files(directory):
            setting = setting or _setting_of(directory)
            why = exc.strerror or str(exc)
            raise StorageError(
                f"cannot write {directory}: {why}: point {setting} at a folder that can be made"
            ) from exc
        raise storage_error(directory, exc, setting=setting) from exc
    return directory
