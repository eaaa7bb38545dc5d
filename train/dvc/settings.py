"""The DVC extra's settings: which dvc command to run, where `reproduce` puts the data versions it fetches."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..locations import home_problem
from ..sections import setting
from .place import data_path, dvc_root

DATA_CACHE = "~/.cache/tf-train-template/data"


@dataclass(frozen=True)
class Section:
    """Data tracked by DVC in a git repository (docs/data-versions.md)"""

    dvc_command: str = setting(
        "",
        "Data tracked by DVC: the dvc command to run ('' = .venv-dvc/bin/dvc when scripts/venv-dvc.sh made it, "
        "else dvc on PATH)",
        kind="surroundings",
    )
    dvc_data_cache: str = setting(
        DATA_CACHE,
        "Data tracked by DVC: where reproduce puts a run's data version fetched from the DVC remote (a folder "
        "per version, never the DVC workspace). Not empty",
        kind="surroundings",
    )


def check(settings) -> None:
    """DVC_DATA_CACHE must not be empty: a blank line in an env file would fetch into the working directory."""
    if not settings.dvc_data_cache.strip():
        raise ConfigError("DVC_DATA_CACHE", settings.dvc_data_cache, f"must not be empty (the default is {DATA_CACHE})")
    if problem := home_problem(settings.dvc_data_cache):  # ~name of a user unknown here: a traceback where it is used
        raise ConfigError("DVC_DATA_CACHE", settings.dvc_data_cache, problem)


def turned_on(s) -> str:
    """On when the data these settings read lies in a DVC project: a run on other data runs none of
    this extra (finding out costs a few file lookups; no dvc command is run)."""
    return "DVC_COMMAND" if dvc_root(data_path(s)[1]) is not None else ""


def callback(s):
    """The loop callback that records the data's DVC version in the manifest."""
    from .callback import DataVersionCallback

    return DataVersionCallback(s)
