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
    check: Callable[[], object] | None = None  # what checked the export, again for one swapped in before it loads
    checked: tuple[int, int] | None = None  # the export folder checked (check_folder)

    @property
    def output_name(self) -> str:
        return "probabilities"  # the key train.results.export writes into the serving signature

    def load(self, warm_up_batch: int) -> None:
        """Load the SavedModel and call it once at batch 1 and at `warm_up_batch`, so the first
        request does not pay for TensorFlow's first-call set-up. An export swapped in since find_export
        checked it is checked and loaded instead (open_checked)."""
        load = partial(open_savedmodel, self.export, self.run_name, self.labels)
        self.shape, self.run = open_checked(self.export.path, self.checked, self.check, load)
        for n in sorted({1, warm_up_batch}):
            self.run(np.zeros((n, *self.shape), np.uint8))
        log.info("model %s loaded from %s and warmed up (batch 1 and %d)", self.name, self.export.path, warm_up_batch)


def find_export(target: Path | None, run_dir: Path | None, name: str) -> ServedModel:
    """The verified export of a run directory (`run_dir`) or an export folder (`target`)."""
    if run_dir is not None:
        files = RunDir(run_dir)
        if not files.export.savedmodel.is_dir():
            missing = f"run {files.name} has no export ({files.export.savedmodel} is missing)"
            if not files.weights():  # an export is made from weights: this run needs training, not `export`
                from ..results.export import no_weights_why

                why = no_weights_why(files.read_manifest(missing_ok=True), files.name)
                raise NoWeightsError(f"{missing} and no weights, {why}")
            raise ExportError(f"{missing}: make it with `python -m train export {files.name}`")
        check = partial(check_export, files)
        checked = check_folder(files.export.path, check)
        return ServedModel(name, files.export, files.name, files.data_description()[0], check=check, checked=checked)
    export = ExportDir(Path(target))
    parent = RunDir(export.path.parent)
    if export.path.name == "export" and parent.is_run():
        return find_export(None, parent.path, name)
    run_name = export.path.name
    if not export.labels.is_file():
        raise ExportError(f"{export.path} has no labels.txt (the class names): copy the whole export folder")
    verify = partial(verify_export_files, export, run_name, copied=True)
    checked = check_folder(export.path, verify)
    labels = export.labels.read_text(encoding="utf-8").splitlines()
    return ServedModel(name, export, run_name, labels, check=verify, checked=checked)
