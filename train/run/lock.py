"""One writer per run directory: `run.lock`, an exclusive flock held for the run's life.

`fit` holds it from the moment it picks a run (new or resumed) until it ends, `export` and
`report` while they write into the run: a second `fit` on a run in progress (a second `docker
compose up`, a `--resume` of a running run, RESUME=auto picking it) is refused with RunBusyError
naming the holder. For a run
of a RUNS_DIR in object storage the lock is also the run's lease object there (train.store.lease),
which keeps out a process on another machine.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from ..errors import RunBusyError, RunRecordError
from .files import SPECIAL_FILES, NotRegularFileError, read_regular, refuse_socket, storage_error
from .rundir import RunDir

# In the note of a reader that found run.lock left by a dead holder (a report of a killed run), before that
# holder's note: every process reads the run as still killed while the reader holds its lock, not running.
READING_KILLED = ", reading the run its holder left killed: "


class RunLock:
    """One writer per run directory: an exclusive flock on run.lock, held for the run's life.

    The kernel drops the lock when its process ends, however it ends (SIGKILL, power cut of a
    container), so a stale file never blocks. The holder's pid and host are written into the
    file only for the message a second process prints. flock is local to one machine: on a
    RUNS_DIR shared over NFS, two hosts are not kept apart.
    """

    def __init__(self, run_dir: Path | str, reader: bool = False, then: str = "resume"):
        """`reader`: a command that only reads the run (export, RESUME=auto's look) leaves the file of a
        holder that died (a SIGKILLed fit) in place when it lets go, so the run still reads as killed.
        `then`: what to do once the holder is gone, for the message of a busy run."""
        self.run_dir = Path(run_dir)
        self.path = RunDir(self.run_dir).lock
        self.fd: int | None = None
        self.lease = None  # the lease in the store, for a run of a RUNS_DIR in object storage
        self.reader, self.found_stale, self.then = reader, False, then
        self.dead_note = b""  # what a dead holder wrote into the file, which a reader puts back (release)

    def acquire(self) -> RunLock:
        try:
            # Never through a link: the note would truncate the file it points to, or make one where it points.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._not_a_file("a symbolic link, not a regular file") from None
            try:
                refuse_socket(self.path, exc)
            except NotRegularFileError as socket_file:
                raise self._not_a_file(str(socket_file)) from None
            raise storage_error(self.path, exc) from exc
        special = SPECIAL_FILES.get(stat.S_IFMT(os.fstat(fd).st_mode))
        if special:  # a named pipe or a device: no file to write a note into
            os.close(fd)
            raise self._not_a_file(f"{special}, not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise storage_error(self.path, exc) from exc
            raise RunBusyError(
                f"run {self.run_dir.name} is in use by another process ({self.holder()}): two processes never "
                f"write one run; wait for it to end or stop it (Ctrl-C, `docker compose stop`), then {self.then}"
            ) from None
        if not _still_at(self.path, fd):  # its holder released and removed it between our open and flock
            os.close(fd)
            return self.acquire()
        try:
            self.found_stale = os.fstat(fd).st_size > 0  # a holder's note and no holder: it died
            found = os.pread(fd, 4096, 0) if self.reader and self.found_stale else b""
            self.dead_note = found.split(READING_KILLED.encode())[-1]  # a killed reader's: its dead holder's
            os.ftruncate(fd, 0)
            note = f"pid {os.getpid()} on host {socket.gethostname()}"
            if self.dead_note:
                note += READING_KILLED + self.dead_note.decode(errors="replace").strip()
            os.write(fd, f"{note}\n".encode())
        except OSError as exc:  # a full disk: the lock is held, only the note for others is missing
            os.close(fd)
            raise storage_error(self.path, exc) from exc
        self.fd = fd
        from .remote import for_run

        remote = for_run(self.run_dir)
        if remote is not None:
            try:
                self.lease = remote.lease(self.run_dir, self.then, self.reader).acquire()
            except BaseException:
                self.release()
                raise
        return self

    def abandoned(self) -> bool:
        """True when the run's lock file exists but no process on this machine holds it: its
        manifest's "running" is then what a SIGKILL or a power cut left. For a run of a RUNS_DIR in
        object storage, whose holder may be another machine, true when its lease there expired.
        False when it is held, or when this machine cannot tell (no lock file; the holder on
        another host, per the file; no lease, or a store that does not answer). The probe takes a
        shared lock for an instant and never writes the file."""
        from .remote import for_run

        remote = for_run(self.run_dir)
        if remote is not None:
            return remote.lease_expired(self.run_dir)
        text = self.holder()
        if not text.startswith("pid ") or not text.endswith(f" on host {socket.gethostname()}"):
            return False  # the dead holder's host ends a reader's note too: another's run cannot be told here
        if READING_KILLED in text:  # held by a report or export of the killed run, or left by one killed too
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return False  # held (or a file system without locks: cannot tell)
        finally:
            os.close(fd)  # closing drops the shared lock at once
        return True

    def held(self) -> bool:
        """True when a process holds the run now (a fit at work on it, per its lock file on this machine or
        its lease in the store): a manifest's "running" that is so. Probes as `abandoned` does."""
        text = self.holder()
        return text.startswith("pid ") and text.endswith(f" on host {socket.gethostname()}") and not self.abandoned()

    def holder(self) -> str:
        try:
            text = read_regular(self.path, errors="replace").strip()
        except NotRegularFileError as exc:  # a named pipe would block every reader of the run's status
            raise self._not_a_file(str(exc)) from None
        except OSError:
            text = ""
        return text or "pid unknown: it is just starting"

    def _not_a_file(self, what: str) -> RunRecordError:
        return RunRecordError(
            f"run {self.run_dir.name}: {self.path} is {what}; remove it: no process holds the run (its writer "
            "makes a new one)"
        )

    def release(self) -> None:
        """Let go of the run; the file goes with it (a finished run keeps no run.lock). Removed while
        still locked: a process that opened it just before finds, once it has the lock, that the
        path is no longer its file, and locks the file there instead (`acquire`)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self.fd is not None:
            with contextlib.suppress(OSError):  # a read-only or vanished folder: the file stays, as after a kill
                if _still_at(self.path, self.fd) and not (self.reader and self.found_stale):
                    self.path.unlink()
                elif self.dead_note:  # the dead holder's note back: the run reads as killed, by that process
                    os.ftruncate(self.fd, 0)
                    os.pwrite(self.fd, self.dead_note, 0)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _still_at(path: Path, fd: int) -> bool:
    """Whether `path` is still the file open as `fd` (not removed, nor replaced by a new one)."""
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)
