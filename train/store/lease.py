"""The run lock on object storage: a lease object, run.lock, taken with a conditional write.

A store has no flock, and a process on another machine cannot be asked whether it lives. So the
writer of a run creates `<run>/run.lock` with If-None-Match: * (one of two racing processes wins),
and renews it every third of STORE_LEASE_SECONDS with If-Match on its own ETag. Another process
finding the lease watches it: a renewal means the holder lives (refused, one line naming it); no
renewal for STORE_LEASE_SECONDS (by the holder's clock or by its own) means the holder is gone, and
it takes the lease over with If-Match on the ETag it saw, so two newcomers never both win.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from ..errors import RunBusyError, StorageError
from .client import Conflict, Store

log = logging.getLogger("train")
POLL_SECONDS = 0.5  # how often a newcomer looks at a held lease
RENEWALS = 3  # how often a holder renews its lease within STORE_LEASE_SECONDS: a late renewal or two is no loss


class Lease:
    def __init__(
        self, store: Store, rel: str, run_name: str, seconds: float, then: str = "resume", reader: bool = False
    ):
        self.store, self.rel, self.run_name, self.seconds = store, rel, run_name, float(seconds)
        self.then = then  # what to do once the holder is gone, for the message of a busy run
        # A command that only reads the run (export, report, RESUME=auto's look) puts back, when it lets go,
        # the lease of a dead holder it took over: the run still reads as killed (`runs`), and the resume
        # that continues it still learns when that holder was last alive (`taken_from`).
        self.reader, self._taken_body = reader, None
        self.etag: str | None = None
        self.lost: str | None = None  # why the lease is no longer ours (another process took it over)
        # The last renewal of the holder whose lease this one took over (epoch seconds, by its clock):
        # when that process was last seen alive.
        self.taken_from: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.holder_text = f"pid {os.getpid()} on host {socket.gethostname()}"

    def _body(self) -> bytes:
        return json.dumps({"holder": self.holder_text, "renewed": time.time(), "seconds": self.seconds}).encode()

    def acquire(self) -> Lease:
        while True:
            try:
                self.etag = self.store.create(self.rel, self._body())
                break
            except Conflict:
                pass
            if self._wait_out_holder():
                break
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()
        return self

    def _wait_out_holder(self) -> bool:
        """Watch a lease held by another process: True once taken over, RunBusyError if it is renewed."""
        try:
            body, etag = self.store.get(self.rel)
        except FileNotFoundError:
            return False  # released meanwhile: create it again
        first_seen = time.monotonic()
        info = _parse(body)
        held_for = info.get("seconds", self.seconds)  # the holder's own lease term
        holder = info.get("holder", "an unknown process")
        said = False
        while True:
            if expired(body, self.seconds) or time.monotonic() - first_seen > held_for:
                try:
                    self.etag = self.store.replace(self.rel, self._body(), etag)
                except Conflict:
                    return False  # renewed, released or taken by another newcomer: look again
                self.taken_from, self._taken_body = _renewed(info), body
                # A reader puts it back when done: only the writer that continues the run says it took it.
                (log.debug if self.reader else log.info)(
                    "run %s: took over the lease of %s (not renewed for %.0f s: that process is gone)",
                    self.run_name,
                    holder,
                    time.time() - info.get("renewed", 0),
                )
                return True
            age = time.time() - info.get("renewed", time.time())
            if not said and age > held_for / RENEWALS + POLL_SECONDS:
                # A renewal missed: the wait may last the lease's seconds, and a command that seems to
                # hang says why (a live holder's renewal refuses it sooner, in its one line).
                said = True
                log.warning(
                    "WARNING: run %s: its lease is held by %s, last renewed %.0f s ago: waiting up to %.0f s "
                    "(STORE_LEASE_SECONDS) for that process to renew it (it lives) or not (it is gone)",
                    self.run_name,
                    holder,
                    age,
                    held_for,
                )
            time.sleep(POLL_SECONDS)
            try:
                _body, now_etag = self.store.get(self.rel)
            except FileNotFoundError:
                return False
            if now_etag != etag:
                if expired(_body, self.seconds):
                    return False  # a dead holder's lease put back by a reader that let go: look again
                raise RunBusyError(
                    f"run {self.run_name} is in use by another process ({_parse(_body).get('holder', 'unknown')}, "
                    f"its lease {self.store.url.key(self.rel)} is being renewed): two processes never write one run; "
                    f"wait for it to end or stop it, then {self.then}"
                )

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / RENEWALS) and self.renew_once():
            pass

    def renew_once(self) -> bool:
        """One renewal; False once the lease is lost (another process took it over meanwhile)."""
        try:
            self.etag = self.store.replace(self.rel, self._body(), self.etag or "")
            return True
        except Conflict:
            self.lost = (
                f"the lease {self.store.url.key(self.rel)} was taken over by another process while this one "
                f"could not renew it for {self.seconds:.0f} s (STORE_LEASE_SECONDS)"
            )
        except FileNotFoundError:
            # A store may answer If-Match on a missing object with 404 rather than 412 (Amazon S3 does): the
            # lease is gone, taken over and released by another process (or deleted), and re-creating it
            # would write over what that process wrote.
            self.lost = (
                f"the lease {self.store.url.key(self.rel)} is gone from the store: another process took the run "
                "over and ended, or it was deleted"
            )
        except StorageError as exc:  # the store is down (the uploads say so, once): try again next time
            log.debug("lease renewal failed: %s", exc)
            return True
        log.warning("WARNING: run %s: %s; nothing more is uploaded from here", self.run_name, self.lost)
        return False

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.seconds)
            self._thread = None
        if self.etag and not self.lost:
            try:
                _body, etag = self.store.get(self.rel)
                if etag == self.etag and self.reader and self._taken_body is not None:
                    self.store.replace(self.rel, self._taken_body, etag)
                elif etag == self.etag:
                    self.store.delete(self.rel)
            except (StorageError, FileNotFoundError, Conflict):
                pass  # unreachable store: the lease simply expires
        self.etag = None


def expired(body: bytes, seconds: float) -> bool:
    """Whether a lease object was not renewed for its term, by its holder's clock: the holder is gone
    (SIGKILL, a machine lost). `seconds`: the term when the object does not say (STORE_LEASE_SECONDS)."""
    info = _parse(body)
    term = info.get("seconds", seconds)
    term = term if isinstance(term, (int, float)) else seconds
    return time.time() > (_renewed(info) or 0.0) + term  # never said when: as old as can be


def _renewed(info: dict) -> float | None:
    """When a lease's holder last renewed it (epoch seconds), if its body says."""
    renewed = info.get("renewed")
    return float(renewed) if isinstance(renewed, (int, float)) and not isinstance(renewed, bool) else None


def _parse(body: bytes) -> dict:
    try:
        info = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return info if isinstance(info, dict) else {}
