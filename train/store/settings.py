"""The store extra's settings: where a RUNS_DIR in object storage is staged, its leases, its last uploads."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..locations import home_problem, looks_like_url
from ..sections import setting

CACHE = "~/.cache/tf-train-template/runs"


@dataclass(frozen=True)
class Section:
    """RUNS_DIR in object storage (s3://BUCKET/PREFIX, gs://, az://; docs/storage.md)"""

    store_cache: str = setting(
        CACHE,
        "RUNS_DIR in object storage: the local staging copy runs are written to and uploaded from, beside "
        "training; losing it loses nothing that reached the store. Not empty (that would stage in the working directory)",
        kind="surroundings",
    )
    store_lease_seconds: float = setting(
        60.0,
        "RUNS_DIR in object storage: a run's lease (its lock, renewed every third of this) expires this long "
        "after its holder stopped renewing it; a run whose machine is lost can be resumed elsewhere after that",
        min=1.0,
        kind="surroundings",
    )
    store_flush_seconds: float = setting(
        120.0,
        "RUNS_DIR in object storage: the longest wait at the end of a run for its last files to reach the store "
        "(30 s at most after a stop signal); what has not by then makes the exit code 7",
        min=0.0,
        kind="surroundings",
    )


def check(settings) -> None:
    """STORE_CACHE must not be empty: a blank line (STORE_CACHE=) in an env file would stage the runs
    in the working directory, as likely meant "the default" as "here"; a folder is never guessed."""
    if not settings.store_cache.strip():
        raise ConfigError("STORE_CACHE", settings.store_cache, f"must not be empty (the default is {CACHE})")
    if problem := home_problem(settings.store_cache):  # ~name of a user unknown here: a traceback where it is used
        raise ConfigError("STORE_CACHE", settings.store_cache, problem)


def turned_on(settings) -> str:
    """A RUNS_DIR in object storage asks for this extra ("" for a folder)."""
    return "RUNS_DIR" if looks_like_url(settings.runs_dir) else ""


def callback(settings):
    """The loop callback that uploads a training's files to the store (train.store.remote.Uploads)."""
    from ..run.remote import open_runs_dir
    from .remote import Uploads

    return Uploads(open_runs_dir(settings))
