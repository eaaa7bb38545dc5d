"""RUNS_DIR in object storage, as the commands see it: a local staging copy kept in step with the store.

Every command works on local run directories, as with a local RUNS_DIR. For a store URL the CLI
and `fit` open the store first (train.run.remote.open_runs_dir calls `open_store`: it must answer,
before any training), bring the runs they need into the staging copy under STORE_CACHE (`bring`),
and upload what they write (`fit` beside training through train.store.mirror, from the loop
callback `Uploads`; `report` and `export` when done, `push`). The run lock becomes a lease object in the store (train.store.lease,
taken by train.run.lock.RunLock through `lease`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import StorageError
from ..locations import creation_key, runs_dir_flag
from ..run.files import ensure_writable
from ..run.find import Need, pick_latest
from .client import Store, StoreURL, endpoint, parse_url
from .lease import Lease, expired
from .mirror import Mirror, pull

log = logging.getLogger("train")
STOP_FLUSH_SECONDS = 30.0  # after SIGTERM or MAX_MINUTES: inside compose's 2-minute stop_grace_period


@dataclass
class RemoteRuns:
    url: StoreURL
    store: Store
    root: Path  # the staging copy of RUNS_DIR: STORE_CACHE/<scheme>[@<HOST_PORT>]/<bucket>/<prefix>
    lease_seconds: float
    flush_seconds: float
    leases: dict[str, Lease] = field(default_factory=dict)  # run name -> the lease this process took

    def run_names(self, listing: Iterable[str] | None = None) -> list[str]:
        """The runs in the store (folders with a config.json), oldest first."""

        names = {
            rel.split("/", 1)[0]
            for rel in (self.store.list() if listing is None else listing)
            if rel.count("/") == 1 and rel.endswith("/config.json")
        }
        return sorted(names, key=lambda n: creation_key(Path(n)))

    def bring(
        self, run: str, checkpoints: bool = True, needs: Sequence[Need] = (), say: Callable[[str], None] | None = None
    ) -> str | None:
        """Download the run named `run` into the staging copy; its name. `latest` and `auto` are the
        newest run in the store, or for a command that `needs` weights or an export, the newest that
        has them (train.run.find.pick_latest; `say` gets the line that names it)."""
        listing = set(self.store.list())
        names = self.run_names(listing)
        name = run
        if run in ("latest", "auto"):
            name = None
            if names:
                name, line = pick_latest(names, lambda n, rel: f"{n}/{rel}" in listing, needs)
                if needs:
                    (say or log.info)(line)
        if name not in names:
            return None  # a local path, or a run that is not in the store: resolving it says so
        keep = (lambda rel: True) if checkpoints else (lambda rel: not rel.startswith(("checkpoints/", "tensorboard/")))
        got = pull(self.store, self.root, name, keep)
        if got:
            log.info("run %s: %d files downloaded from %s to %s", name, got, self.url, self.root / name)
        return name

    def bring_all_records(self) -> set[str]:
        """The records every run's row is read from (for `runs` and `compare`): RECORDS, nothing else;
        the names of the runs in the store."""
        names = self.run_names()
        for name in names:
            pull(self.store, self.root, name, RECORDS.__contains__)
        return set(names)

    def only_staged(self, name: str) -> str:
        """What `runs` says under the table of a run in the staging copy that the store does not have.

        A copy holding only the records an earlier `runs` brought (no weights, no checkpoints) is a run
        deleted from the store: uploading it would put back a run that lists as trained and has nothing
        to export or resume, so only forgetting it is offered."""
        staged = self.root / name
        if all(_is_record(p.relative_to(staged).as_posix()) for p in staged.rglob("*") if p.is_file()):
            return (
                f"only its records are in this machine's staging copy {staged}, not in {self.url} (deleted from the "
                "store; an earlier `runs` brought them): delete that folder to forget it"
            )
        return (
            f"only in this machine's staging copy {staged}, not in {self.url} (deleted from the store, or "
            f"never uploaded): `python -m train report {name}{runs_dir_flag(self.url)}` on this machine uploads it "
            "whole; delete that folder to forget it"
        )

    def lease_expired(self, run_dir: Path) -> bool:
        """Whether the run's lease in the store expired: its holder stopped renewing it (SIGKILL, a
        machine lost), by the rule a process taking it over uses. False while it is renewed, when
        there is none, and when the store cannot say."""
        try:
            body, _etag = self.store.get(f"{Path(run_dir).name}/run.lock")
        except (FileNotFoundError, StorageError):
            return False
        return expired(body, self.lease_seconds)

    def lease(self, run_dir: Path, then: str = "resume", reader: bool = False) -> Lease:
        """The run's lease in the store, remembered for its uploads (`Uploads`, the same process);
        `then` says what to do once a live holder is gone; `reader`: a dead holder's lease is put back."""
        name = Path(run_dir).name
        self.leases[name] = Lease(self.store, f"{name}/run.lock", name, self.lease_seconds, then, reader)
        return self.leases[name]

    def mirror(self, run_dir: Path, lease: Lease | None) -> Mirror:
        return Mirror(self.store, self.root, run_dir, lease)

    def not_uploaded(self, run_dir: Path, left: list[str], mirror: Mirror) -> str:
        why = mirror.lease.lost if mirror.lease is not None and mirror.lease.lost else mirror.last_error
        # The store answered, only not in time (a large file, a slow link, STORE_FLUSH_SECONDS=0).
        why = why or (
            f"not within the wait for the last files: STORE_FLUSH_SECONDS={self.flush_seconds:g} s, "
            f"{STOP_FLUSH_SECONDS:g} s at most after a stop"
        )
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        return (
            f"run {run_dir.name}: the newest state did not reach {self.url} ({why}): {shown} only in the staging "
            f"copy {run_dir}; once the store answers, `--resume {run_dir.name}` (resume={run_dir.name!r} in "
            "train()) on this machine (same STORE_CACHE) uploads them"
        )

    def push(self, run_dir: Path) -> None:
        """Upload what a command wrote into a run (report, export) before it returns."""
        mirror = Mirror(self.store, self.root, run_dir)
        try:
            if not mirror.sync_once():
                raise mirror.last_error or StorageError(f"RUNS_DIR {self.url}: run {Path(run_dir).name} not uploaded")
        finally:
            mirror.stop_watching()


class Uploads:
    """The store's loop callback (train.training.callbacks): a training's files uploaded beside it from
    its start, the last ones flushed once train.log has its last line.

    The exit code says whether the newest state reached the store: a run whose last files did not
    within STORE_FLUSH_SECONDS (STOP_FLUSH_SECONDS at most after a stop) ends with StorageError, exit 7;
    a run that failed keeps its own error, and the missing files are logged."""

    def __init__(self, remote: RemoteRuns):
        self.remote, self.mirror = remote, None

    def on_start(self, run_dir: Path) -> None:
        self.mirror = self.remote.mirror(run_dir, self.remote.leases.get(run_dir.name)).start()

    def on_close(self, stop, error: str | None) -> None:
        if self.mirror is None:
            return
        mirror, self.mirror = self.mirror, None
        remote = self.remote
        after_stop = min(remote.flush_seconds, STOP_FLUSH_SECONDS)
        left = mirror.close(after_stop if stop.reason else remote.flush_seconds, stop, after_stop)
        if not left:
            if error is None:
                log.info("run %s: everything is in %s/%s", mirror.name, self.remote.url, mirror.name)
            return
        line = self.remote.not_uploaded(mirror.run_dir, left, mirror)
        if error is not None:
            log.error("%s", line)
            return
        raise StorageError(line)


# What `runs` reads of a run (train.results.runs_table): not its report, curves or log.
RECORDS = ("config.json", "manifest.json", "metrics.csv")


def _is_record(rel: str) -> bool:
    """A file a records-only copy may hold: no weights, nothing in a folder (an older `runs` also brought the
    report, curves and log)."""
    return "/" not in rel and not rel.endswith(".h5")


def open_store(settings) -> RemoteRuns:
    """The store of RUNS_DIR (a URL), checked now (StorageError: down, credentials, bucket)."""
    url = parse_url(settings.runs_dir)
    store = Store(url)
    store.check()
    cache = Path(settings.store_cache).expanduser().absolute()
    # Another S3-compatible server's bucket of the same name is another store: its address is in the folder
    # (HOST_PORT: a colon would break a `docker run -v` of that path; "_" is in no host name).
    # A scheme's own port is left out: http://HOST:80 and http://HOST are one store, so one folder.
    address = urlsplit(endpoint())
    netloc = address.netloc.lower().removesuffix({"http": ":80", "https": ":443"}.get(address.scheme.lower(), ""))
    at = re.sub(r"[^a-z0-9.-]", "_", netloc) if url.scheme == "s3" else ""
    root = cache / (f"{url.scheme}@{at}" if at else url.scheme) / url.bucket / url.prefix
    # Written now, not at the first checkpoint: a read-only or full STORE_CACHE is said before training.
    ensure_writable(root, setting="STORE_CACHE")
    log.info("RUNS_DIR %s: staging copy in %s", url, root)
    remote = RemoteRuns(url, store, root, settings.store_lease_seconds, settings.store_flush_seconds)
    if at:
        _say_older_copy(remote, cache / url.scheme / url.bucket / url.prefix)
    return remote


def _say_older_copy(remote: RemoteRuns, older: Path) -> None:
    """One warning line for runs of this store in the folder an earlier version staged every s3:// store
    in (no address in its name): what of them the store does not have yet is uploaded only from the new one."""
    try:
        here = {p.name for p in older.iterdir() if (p / "config.json").is_file()}
    except OSError:
        return
    ours = sorted(here & set(remote.run_names())) if here else []
    if ours:
        log.warning(
            "WARNING: run(s) %s of %s are staged in %s, as an earlier version staged every s3:// store: move "
            "each folder, with .store-state/<run>.json beside it, into %s, in place of the copy of it there (what "
            "this version downloaded: remove it first, unless the run trained there since); there a command that "
            "writes into the run uploads what the store lacks",
            ", ".join(ours[:3]) + (f" and {len(ours) - 3} more" if len(ours) > 3 else ""),
            remote.url,
            older,
            remote.root,
        )
