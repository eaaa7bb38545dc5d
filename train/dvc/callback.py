"""The record of the data's DVC version in the manifest (`data.version`), and its one warning."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from ..errors import StorageError
from ..run.files import read_json, write_json
from ..run.rundir import RunDir
from .tracked import record

log = logging.getLogger("train")


class DataVersionCallback:
    """At the start of training (the data is loaded and recorded): where DVC keeps it, beside the fingerprint.

    Never costs the run: what cannot be found is logged and training goes on (reproduce then checks
    the fingerprint alone, as for data outside DVC)."""

    def __init__(self, settings):
        self.settings = settings

    def on_train_begin(self, run_dir: Path) -> None:
        try:
            version = record(self.settings)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            log.warning("WARNING: the data's DVC version was not recorded: %s", exc)
            return
        if version is None:
            return
        if version["warning"]:
            log.warning(version["warning"])
        commit = version["commit"]
        log.info(
            "data: DVC version %s%s of %s (%s)%s",
            version["path"],
            f" at commit {commit[:12]}" if commit else "",
            version["repository"],
            version["dvc_file"],
            "" if commit else ", at no commit: the repository has none yet",
        )
        path = RunDir(run_dir).manifest
        try:
            manifest = read_json(path)
            manifest.setdefault("data", {})["version"] = version
            write_json(path, manifest)
        except (OSError, ValueError, StorageError) as exc:
            log.warning("WARNING: the data's DVC version was not recorded in the manifest: %s", exc)
