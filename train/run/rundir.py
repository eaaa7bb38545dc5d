"""The run directory: its layout (`RunDir`) and its records (config.json, manifest.json).

runs/<run-id>/
  config.json        resolved settings        manifest.json   versions, data, git, how it ended
  train.log          console lines            metrics.csv     one row per epoch
  tensorboard/       TensorBoard logs         checkpoints/    resumable states + LATEST pointer
  best.weights.h5    best weights on MONITOR  final.weights.h5 weights at the end of training
  labels.txt         class names, one a line  export/         SavedModel, model.keras, labels.txt
  report.html        the run at a glance      curves.png      the curves of report.html
  reproduce.json     a rerun's verdict        run.lock        held by the one process writing the run
Only `RunDir` spells these names; every module asks it for a path.
Atomic writes live in train.run.files, finding and creating runs in train.run.find.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunRecordError
from .files import read_json, write_text

log = logging.getLogger("train")
CACHE_DIR = ".cache"  # under RUNS_DIR: the image decode cache (a hidden folder, never a run)


@dataclass(frozen=True)
class ExportDir:
    """export/ (or its staging folder): what a serving user copies away."""

    path: Path

    savedmodel = property(lambda self: self.path / "savedmodel")
    keras = property(lambda self: self.path / "model.keras")
    labels = property(lambda self: self.path / "labels.txt")  # a copy of the run's class names
    parity = property(lambda self: self.path / "parity.json")
    source = property(lambda self: self.path / "source.json")  # the weights it came from, its files' sha256


@dataclass(frozen=True)
class RunDir:
    """One run directory: the only place that knows its file and folder names (see the module doc).

    Class names and input shape have one source, the manifest's `data` (`data_description`): it
    is written once the data is loaded, beside the data's fingerprint, and JSON keeps any class
    name intact. labels.txt and export/labels.txt are copies written from it for people and for
    serving code outside this package; nothing here reads them back.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def name(self) -> str:
        return self.path.name

    # Read-only paths, one a line: the layout at a glance.
    config = property(lambda self: self.path / "config.json")
    manifest = property(lambda self: self.path / "manifest.json")
    labels = property(lambda self: self.path / "labels.txt")
    log = property(lambda self: self.path / "train.log")
    metrics = property(lambda self: self.path / "metrics.csv")
    tensorboard = property(lambda self: self.path / "tensorboard")
    checkpoints = property(lambda self: self.path / "checkpoints")
    best_weights = property(lambda self: self.path / "best.weights.h5")
    final_weights = property(lambda self: self.path / "final.weights.h5")
    report = property(lambda self: self.path / "report.html")
    curves = property(lambda self: self.path / "curves.png")
    reproduce = property(lambda self: self.path / "reproduce.json")
    lock = property(lambda self: self.path / "run.lock")
    export = property(lambda self: ExportDir(self.path / "export"))

    def own_names(self) -> set[str]:
        """The names of the files and folders a run writes at its top level (the layout above)."""
        values = [getattr(self, name) for name, value in vars(RunDir).items() if isinstance(value, property)]
        paths = [v.path if isinstance(v, ExportDir) else v for v in values]
        return {p.name for p in paths if isinstance(p, Path) and p.parent == self.path}

    def is_run(self) -> bool:
        """The one test of "is a run": a directory with its config.json, the first file a run writes.

        A folder without it (a stray one, or a run killed between mkdir and its first write) is no
        run for any command: `runs`, `latest`, RESUME=auto, report, compare, export, reproduce. A named
        pipe or a device in its place makes a run whose config.json is refused as unreadable (read_record),
        not a folder said to have none."""
        return self.path.is_dir() and self.config.exists() and not self.config.is_dir()

    def read_config(self) -> dict[str, Any]:
        return read_record(self.path, self.config.name)

    def read_manifest(self, missing_ok: bool = False) -> dict[str, Any]:
        """manifest.json; {} when `missing_ok` and the run ended before writing it."""
        if missing_ok and not self.manifest.exists():
            return {}
        return read_record(self.path, self.manifest.name)

    def weights(self) -> list[Path]:
        """The weights files present, best first."""
        return [p for p in (self.best_weights, self.final_weights) if p.is_file()]

    def data_description(self) -> tuple[list[str], tuple[int, ...]]:
        """(class names, input shape) from the manifest's `data`; RunRecordError when it has none."""
        data = self.read_manifest().get("data") or {}
        names, shape = (data.get("class_names"), data.get("input_shape")) if isinstance(data, dict) else (data, data)
        if names is None or shape is None:
            raise RunRecordError(
                f"run {self.name} has no data description in {self.manifest}: it ended before its "
                "data loaded; resume it or train a new run"
            )
        try:
            if isinstance(names, list) and isinstance(shape, list):
                return [str(n) for n in names], tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            pass
        given = (
            f"data.input_shape {shape!r:.40}, data.class_names {names!r:.40}"
            if data is not names
            else f"data {data!r:.60}"
        )
        raise RunRecordError(
            f"run {self.name}: {self.manifest} records {given}: not an input shape of whole numbers and a list of "
            "class names (an edit, a bad merge); restore manifest.json from a backup"
        )

    def write_labels(self) -> None:
        """labels.txt, derived from the manifest's class names; rewritten only when it differs."""
        text = labels_text(self.data_description()[0])
        if not self.labels.is_file() or self.labels.read_text(encoding="utf-8") != text:
            write_text(self.labels, text)


def labels_text(class_names) -> str:
    """The labels.txt format: one class name a line, in class-index order."""
    return "".join(f"{n}\n" for n in class_names)


def read_record(run_dir: Path, name: str) -> dict[str, Any]:
    """config.json or manifest.json of a run as a dict; RunRecordError when it cannot be read."""
    path = Path(run_dir) / name
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise RunRecordError(
            f"run {Path(run_dir).name} has no {name} ({path}): it is not a complete run directory; "
            "start a new run, or restore the file from a backup"
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8 (truncated, overwritten)
        raise RunRecordError(
            f"run {Path(run_dir).name}: {path} is unreadable ({type(exc).__name__}: {exc}); "
            "restore it from a backup, or move the run directory out of RUNS_DIR"
        ) from None
    if not isinstance(data, dict):
        raise RunRecordError(
            f"run {Path(run_dir).name}: {path} holds {type(data).__name__}, not a JSON object; "
            "restore it from a backup, or move the run directory out of RUNS_DIR"
        )
    return data


def unknown_settings(data: dict[str, Any]) -> list[str]:
    """The keys of a config.json that are no setting of this version, each as `KEY (did you mean X?)`.

    A run written by a newer version (a setting added since), or a config.json edited by hand."""
    import difflib
    from dataclasses import fields

    from ..config import Settings

    known = sorted(f.name for f in fields(Settings))
    out = []
    for key in sorted(k for k in data if k not in known):
        close = difflib.get_close_matches(str(key).lower(), known, n=1, cutoff=0.6)
        out.append(str(key).upper() + (f" (did you mean {close[0].upper()}?)" if close else ""))
    return out


def read_run_settings(run_dir: Path, warn_unknown: bool = True, need_data: bool = True):
    """The settings a run was started with (config.json); RunRecordError when they cannot be.

    A key that is no setting of this version is left out, with one warning line naming it
    (`warn_unknown`); a resume refuses it instead (train.run.resume), as it would train without it.
    `need_data=False`: DATASET's file or folder may have moved (export and predict need none of it)."""
    from ..config import settings_from_dict
    from ..datasets import dataset_missing
    from ..errors import ConfigError, DataError

    data = RunDir(run_dir).read_config()
    unknown = unknown_settings(data)
    if unknown and warn_unknown:
        log.warning(
            "WARNING: run %s: %s holds %s, not a setting of this version (written by a newer version, or "
            "edited by hand): ignored here; use the version that wrote the run, or remove the key",
            Path(run_dir).name,
            RunDir(run_dir).config,
            ", ".join(unknown),
        )
    try:
        settings = settings_from_dict(data, need_data=False)
    except (ConfigError, TypeError, ValueError) as exc:
        raise RunRecordError(
            f"run {Path(run_dir).name}: {RunDir(run_dir).config} does not hold valid settings "
            f"({exc}); restore it from a backup, or move the run directory out of RUNS_DIR"
        ) from None
    missing = dataset_missing(settings.dataset) if need_data else None  # the record is sound; its data moved
    if missing:
        raise DataError(
            f"run {Path(run_dir).name} was trained on DATASET={settings.dataset}, which is not there now "
            f"({missing}): put the data back where it was"
        )
    return settings
