"""Where the runs of RUNS_DIR are on this machine: the folder itself, or a store's staging copy.

A RUNS_DIR in object storage (s3://, gs://, az://) is the store extra's (train/store): opened once
per process by `open_runs_dir`, which must answer before any training; from then on every command
works on its local staging copy (`local_dir`), and a run's lock, uploads and downloads go through
the opened store (`for_run`). Without that extra a store URL is refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import extras
from ..errors import ConfigError, StorageError
from ..locations import looks_like_url, redact_uri

_OPEN: dict[str, Any] = {}  # RUNS_DIR as given -> its opened store (train.store.remote.RemoteRuns), for this process


def open_runs_dir(settings) -> Any | None:
    """The store of a RUNS_DIR URL, checked now (StorageError: down, credentials, bucket); None for a folder."""
    text = settings.runs_dir
    if not looks_like_url(text):
        return None
    if text not in _OPEN:
        store = extras.part("store", "remote")
        if store is None:
            raise ConfigError("RUNS_DIR", redact_uri(text), extras.NO_STORE)
        _OPEN[text] = store.open_store(settings)
    return _OPEN[text]


def close_all() -> None:
    """Forget the opened stores (tests that start several commands in one process)."""
    _OPEN.clear()


def local_dir(runs_dir: str | Path) -> Path:
    """Where the run directories of RUNS_DIR are on this machine: the folder, or a store's staging copy."""
    remote = _OPEN.get(str(runs_dir))
    if remote is not None:
        return remote.root
    if looks_like_url(str(runs_dir)):
        raise StorageError(f"RUNS_DIR {runs_dir}: the store was not opened before its runs were looked for")
    return Path(runs_dir)


def staging_roots() -> list[Path]:
    """The staging copies of the stores this process opened (under STORE_CACHE)."""
    return [r.root for r in _OPEN.values()]


def shown(runs_dir: str | Path) -> str:
    """RUNS_DIR as a message names it: a store's URL for its staging copy (where a run is missing from
    is the store, not the local folder it is downloaded to), else the folder."""
    opened = _OPEN.get(str(runs_dir)) or next((r for r in _OPEN.values() if r.root == Path(runs_dir).absolute()), None)
    return str(opened.url) if opened is not None else str(Path(runs_dir))


def for_run(run_dir: Path | str) -> Any | None:
    """The opened store a run directory belongs to (its staging copy), or None for a local run."""
    parent = Path(run_dir).absolute().parent
    return next((r for r in _OPEN.values() if r.root == parent), None)
