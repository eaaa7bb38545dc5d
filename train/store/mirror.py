"""A run directory kept in two places: the local staging copy where the run writes, and the store.

Uploads run in a thread beside training (`Mirror`), woken by every finished atomic write and every
few seconds. One pass uploads what changed, in an order that keeps the store's copy usable after
an interruption at any moment:

1. the pointers (checkpoints/LATEST, manifest.json) are read first, as they are now;
2. every other changed file is uploaded, each as one whole object (a reader sees the old one or the
   new one, never half), config.json first: it is what makes a folder a run;
3. only then the pointers as read in 1: what they point to is already in the store;
4. objects of files the run deleted (old checkpoints) before 1 go last: one deleted since may be
   what a pointer as read names, and waits for the next pass.

A failed pass is retried with backoff; the first failure is one warning line, the return of the
store one info line. `close` flushes what is pending before a deadline and says what is not.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from pathlib import Path

from ..errors import StorageError
from ..locations import runs_dir_flag
from ..run.files import TMP_MARK, atomic_write, read_json, watch_writes, write_json
from ..run.rundir import RunDir
from .client import Store, local_md5

log = logging.getLogger("train")
POINTERS = ("checkpoints/LATEST", "manifest.json")
FIRST = ("config.json",)
SKIP = {"run.lock"}  # the local flock file; in the store, run.lock is the lease (train.store.lease)
PERIOD_SECONDS = 5.0  # a pass at least this often: train.log and TensorBoard's files are appended, not replaced
BACKOFF_SECONDS = (1, 2, 4, 8, 15, 30)  # waits between failed passes while training goes on
FLUSH_RETRY_SECONDS = 0.5  # while flushing at the end, try again this often


class SyncState:
    """What the store holds of one run, as this machine last saw it: {path: [etag, size, mtime_ns]}.

    Kept beside the run directory in the cache (never in it, never uploaded), so that a later pull
    can tell a file changed here (upload it) from one changed in the store (download it)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.files: dict[str, list] = read_json(path)
        except (OSError, ValueError):
            self.files = {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.files)

    def unchanged_here(self, rel: str, local: Path) -> bool:
        entry = self.files.get(rel)
        if entry is None:
            return False
        try:
            st = local.stat()
        except OSError:
            return False
        return [st.st_size, st.st_mtime_ns] == entry[1:]

    def record(self, rel: str, etag: str, local: Path) -> None:
        st = local.stat()
        self.files[rel] = [etag, st.st_size, st.st_mtime_ns]


def state_path(root: Path, run_name: str) -> Path:
    return root / ".store-state" / f"{run_name}.json"


def pull(store: Store, root: Path, run_name: str, want=lambda rel: True) -> int:
    """Bring the store's copy of one run into the local staging copy; the number of files downloaded.

    A file is downloaded when it is missing here or when the store's object changed since this
    machine last synced it; a file changed here and not yet uploaded (the store was down) is kept. A file
    here that the state does not name (it was lost: deleted by hand, a copy restored without it) and that
    differs from the store's is kept too, said in one warning line: nothing says it was ever uploaded."""
    local_run = root / run_name
    state = SyncState(state_path(root, run_name))
    remote = store.list(run_name)
    here = RunDir(local_run).checkpoints.glob("ckpt-*.npz")
    newest = max((p.name for p in here if TMP_MARK not in p.name), default="")  # the newest state here
    got, kept = 0, []
    for rel_full, (_size, etag) in sorted(remote.items()):
        rel = rel_full[len(run_name) + 1 :]
        local = local_run / rel
        if rel in SKIP or not want(rel):
            if not local.is_file():
                # Not here and not brought (a report's pull leaves the checkpoints): this machine did not
                # delete it, so a later upload must not delete it from the store (Mirror, step 4).
                state.files.pop(rel, None)
            continue
        known = state.files.get(rel)
        older = rel.startswith("checkpoints/ckpt-") and rel.split("/")[1] < newest
        if older and known and known[0] == etag and not local.is_file():
            # A state this machine synced and deleted since, a newer one being here (the run moved on while
            # the store was down): not brought back; the next upload deletes it there (Mirror, step 4).
            continue
        if local.is_file():
            if known and known[0] == etag:
                continue  # the store has not changed: what is here is as new or newer
            if local_md5(local) == etag:
                state.record(rel, etag, local)
                continue
            if not known:
                kept.append(rel)
                continue
        data, etag = store.get(rel_full)
        local.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(local, lambda p, d=data: p.write_bytes(d))
        state.record(rel, etag, local)
        got += 1
    for sub in (RunDir(local_run).checkpoints, RunDir(local_run).tensorboard):
        sub.mkdir(parents=True, exist_ok=True)
    state.save()
    if kept:
        _say_kept(store, local_run, state.path, kept)
    return got


def _say_kept(store: Store, local_run: Path, state_file: Path, kept: list[str]) -> None:
    """One warning line for the files `pull` kept: here, unlike the store's, and not in the run's state."""
    shown = ", ".join(kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
    log.warning(
        "WARNING: run %s: file(s) %s of the staging copy %s differ from the store's (%s/%s) and %s does not say "
        "they were uploaded: kept, not downloaded; the run's next upload (`python -m train fit --resume %s%s`, or "
        "`python -m train report %s%s`) puts them in the store; to take the store's instead, delete them here "
        "and run the command again",
        local_run.name,
        shown,
        local_run,
        store.url,
        local_run.name,
        state_file,
        local_run.name,
        runs_dir_flag(store.url),
        local_run.name,
        runs_dir_flag(store.url),
    )


class Mirror:
    """Uploads one run directory to the store from a thread, until `close`."""

    def __init__(self, store: Store, root: Path, run_dir: Path, lease=None):
        self.store, self.run_dir, self.lease = store, Path(run_dir), lease
        self.name = self.run_dir.name
        self.state = SyncState(state_path(root, self.name))
        self.pending: list[str] = []  # what the last pass could not upload
        self.down_since: float | None = None
        self.last_error: StorageError | None = None
        self._checked_store = False  # whether the state was compared with the store's listing (`_forget_missing`)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="store-uploads", daemon=True)
        self._unwatch = watch_writes(self._on_write)

    def stop_watching(self) -> None:
        self._unwatch()

    def start(self) -> Mirror:
        self._thread.start()
        return self

    def _on_write(self, path: Path) -> None:
        if self.run_dir in path.parents:
            self._wake.set()

    def _loop(self) -> None:
        failures = 0
        while True:
            closing = self._closing.is_set()  # set before this pass began: the pass sees every last file
            self._wake.clear()
            ok = self.sync_once()
            if closing and (ok or (self.lease is not None and self.lease.lost)):
                return
            if self._closing.is_set():
                time.sleep(0 if ok else FLUSH_RETRY_SECONDS)
            elif ok:
                failures = 0
                self._wake.wait(PERIOD_SECONDS)
            else:  # the store is down: keep to the backoff, however often the run writes meanwhile
                self._closing.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])
                failures += 1

    def sync_once(self) -> bool:
        """One pass (module doc); False when something could not be uploaded."""
        if self.lease is not None and self.lease.lost:
            self.pending = ["everything since the lease was lost"]
            return False
        try:
            self._pass()
        except StorageError as exc:
            self.last_error = exc
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.warning(
                    "WARNING: %s; training goes on, the run's files stay in %s and are uploaded when the store "
                    "answers again (retried with backoff)",
                    exc,
                    self.run_dir,
                )
            return False
        except FileNotFoundError:
            return False  # a file replaced or removed during the pass: the next pass sees the new one
        if self.down_since is not None:
            log.info("store %s answers again: the run's pending files are uploaded", self.store.url)
            self.down_since = None
        return True

    def _pass(self) -> None:
        # Only files deleted before the pointers are read are deleted from the store (step 4): one
        # deleted later may be what the pointers as read name (an old state, once the run moved on).
        deleted = [rel for rel in self.state.files if not (self.run_dir / rel).is_file()]
        pointers = {}
        for rel in POINTERS:  # read before anything else (module doc, step 1)
            try:
                pointers[rel] = (self.run_dir / rel).read_bytes()
            except FileNotFoundError:
                pass
        todo, pointer_todo = self._changed(pointers)  # first: `pending` names them if the store does not answer
        if not self._checked_store and self._forget_missing():
            todo, pointer_todo = self._changed(pointers)
        for rel in todo:
            self._upload(rel)
        for rel in pointer_todo:
            etag = self.store.put(f"{self.name}/{rel}", pointers[rel])
            self.state.files[rel] = [etag, len(pointers[rel]), zlib.crc32(pointers[rel])]
            self.pending.remove(rel)
        gone = [
            rel
            for rel in deleted
            if rel in self.state.files and rel not in pointers and not (self.run_dir / rel).is_file()
        ]
        for rel in gone:
            self.store.delete(f"{self.name}/{rel}")
            del self.state.files[rel]
        if todo or pointer_todo or gone:
            self.state.save()

    def _changed(self, pointers: dict[str, bytes]) -> tuple[list[str], list[str]]:
        """(files, pointers) that differ from what the store holds, as the state says; `pending` until sent."""
        files = sorted(
            (rel for rel in _walk(self.run_dir) if rel not in POINTERS and rel not in SKIP),
            key=lambda rel: (rel not in FIRST, rel),
        )
        todo = [rel for rel in files if not self.state.unchanged_here(rel, self.run_dir / rel)]
        pointer_todo = [rel for rel in pointers if not self._same_pointer(rel, pointers[rel])]
        self.pending = todo + pointer_todo
        return todo, pointer_todo

    def _forget_missing(self) -> bool:
        """Forget what this machine uploaded when the store no longer holds the run, so this pass uploads it whole.

        A run folder deleted from the bucket by hand is still in the state as uploaded: a pass would send
        only what changed here since, and leave in the store a run without its config.json, weights or
        checkpoints while the run's end said everything was there. Only a run gone as a whole (no
        config.json): single objects gone are old checkpoints another machine continuing the run deleted,
        which must not come back. One listing, at the first pass of each mirror; True when it forgot."""
        gone = f"{self.name}/config.json" not in self.store.list(self.name)
        if gone:
            self.state.files.clear()
        self._checked_store = True
        return gone

    def _upload(self, rel: str) -> None:
        local = self.run_dir / rel
        before = local.stat()
        data = local.read_bytes()
        etag = self.store.put(f"{self.name}/{rel}", data)
        self.state.files[rel] = [etag, before.st_size, before.st_mtime_ns]
        self.pending.remove(rel)

    def _same_pointer(self, rel: str, data: bytes) -> bool:
        entry = self.state.files.get(rel)
        if entry is None:
            return False
        # Pointers are compared by content: they are small, and their mtime says nothing here.
        return entry[1:] == [len(data), zlib.crc32(data)] or local_md5_bytes(data) == entry[0]

    def close(self, seconds: float, stop=None, stop_seconds: float | None = None) -> list[str]:
        """Upload what is pending within `seconds`; what did not reach the store ([] when all did).

        A stop asked for meanwhile (the StopFlag `stop`: SIGTERM, Ctrl-C during this wait) cuts the
        wait to `stop_seconds` from that moment: the stop grace period must not run out."""
        self._unwatch()
        self._closing.set()
        self._wake.set()
        if not self._thread.is_alive():  # never started (a failure before training)
            self._thread = threading.Thread(target=self._loop, name="store-uploads", daemon=True)
            self._thread.start()
        if self.down_since is not None:
            log.info("waiting up to %.0f s for the store %s to take the run's last files", seconds, self.store.url)
        end, cut = time.monotonic() + seconds, stop is None or stop_seconds is None or bool(stop.reason)
        while self._thread.is_alive():
            now = time.monotonic()
            if not cut and stop.reason:
                end, cut = min(end, now + stop_seconds), True
            if now >= end:
                break
            self._thread.join(min(0.1, end - now))
        if self._thread.is_alive():
            return list(self.pending) or ["the files of the pass under way"]
        return [] if self.lease is None or not self.lease.lost else list(self.pending)


def local_md5_bytes(data: bytes) -> str:
    import hashlib

    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def _walk(run_dir: Path) -> list[str]:
    """Every file of the run directory as a path inside it, temp files of writes in progress left out."""
    found = ((p, p.relative_to(run_dir).as_posix()) for p in run_dir.rglob("*"))
    return [rel for p, rel in found if TMP_MARK not in rel and p.is_file()]
