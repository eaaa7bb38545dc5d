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
        log.info(
            "data: DVC version %s at commit %s of %s (%s)",
            version["path"],
            str(version["commit"])[:12],
            version["repository"],
            version["dvc_file"],
        )
        path = RunDir(run_dir).manifest
        try:
            manifest = read_json(path)
            manifest.setdefault("data", {})["version"] = version
            write_json(path, manifest)
        except (OSError, ValueError, StorageError) as exc:
            log.warning("WARNING: the data's DVC version was not recorded in the manifest: %s", exc)
