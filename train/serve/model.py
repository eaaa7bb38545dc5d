"""The model a server holds: an export, verified against its recorded hashes, loaded and warmed up.

Given a run, its export is checked as `predict` checks it (and the class names come from the run's
manifest); given an export folder copied away from its run, its files are checked against its
source.json and the class names are its labels.txt (a file source.json records).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import ExportError, NoWeightsError
from ..locations import found_in, runs_dir_flag
from ..results.predict import check_export, check_folder, open_checked, open_savedmodel, verify_export_files
from ..run.rundir import ExportDir, RunDir

log = logging.getLogger("train")


@dataclass
class ServedModel:
    """What the protocols describe (name, shape, class names) and the one call that predicts."""

    name: str
    export: ExportDir
    run_name: str
    labels: list[str] = field(default_factory=list)
    shape: tuple[int, ...] = ()
    run: Callable[[np.ndarray], np.ndarray] | None = None
    opener: Callable[[], tuple] | None = None  # (shape, run) of the export checked: open_checked

    @property
    def output_name(self) -> str:
        return "probabilities"  # the key train.results.export writes into the serving signature

    def load(self, warm_up_batch: int) -> None:
        """Load the SavedModel and call it once at batch 1 and at `warm_up_batch`, so the first
        request does not pay for TensorFlow's first-call set-up. An export swapped in since find_export
        checked it is checked and loaded instead (open_checked)."""
        self.shape, self.run = self.opener()
        for n in sorted({1, warm_up_batch}):
            self.run(np.zeros((n, *self.shape), np.uint8))
        log.info("model %s loaded from %s and warmed up (batch 1 and %d)", self.name, self.export.path, warm_up_batch)


def find_export(target: Path | None, run_dir: Path | None, name: str, runs_dir: object = None) -> ServedModel:
    """The verified export of a run directory (`run_dir`, found in `runs_dir`: RUNS_DIR or --runs-dir, for
    the commands its messages give) or an export folder (`target`)."""
    if run_dir is not None:
        files = RunDir(run_dir)
        if not files.export.savedmodel.is_dir():
            missing = f"run {files.name} has no export ({files.export.savedmodel} is missing)"
            if not files.weights():  # an export is made from weights: this run needs training, not `export`
                from ..results.export import no_weights_why

                why = no_weights_why(files.read_manifest(missing_ok=True), files.name, runs_dir)
                raise NoWeightsError(f"{missing} and no weights, {why}")
            raise ExportError(f"{missing}: make it with `python -m train export {files.name}{runs_dir_flag(runs_dir)}`")
        check, labels = partial(check_export, files, runs_dir), files.data_description()[0]
        load = partial(open_savedmodel, files.export, files.name, labels, runs_dir)
        opener = partial(open_checked, files.export.path, check_folder(files.export.path, check), check, load)
        return ServedModel(name, files.export, files.name, labels, opener=opener)
    export = ExportDir(Path(target))
    parent = RunDir(export.path.parent)
    if export.path.name == "export" and parent.is_run():  # the commands its messages give name the run's folder
        return find_export(None, parent.path, name, found_in(runs_dir, parent.path))
    run_name = export.path.name
    if not export.labels.is_file():
        raise ExportError(f"{export.path} has no labels.txt (the class names): copy the whole export folder")
    verify = partial(verify_export_files, export, run_name, copied=True)
    checked = check_folder(export.path, verify)
    labels = export.labels.read_text(encoding="utf-8").splitlines()
    load = partial(open_savedmodel, export, run_name, labels, copied=True)
    opener = partial(open_checked, export.path, checked, verify, load)
    return ServedModel(name, export, run_name, labels, opener=opener)
