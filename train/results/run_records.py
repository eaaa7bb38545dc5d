"""A run read back from its directory for the report and `compare`: settings, manifest, metrics, resumes.

They work from the run directory alone (a run copied home from a cloud GPU has nothing else):
config.json, manifest.json (its segments say where each resume began), metrics.csv, and for runs
recorded before segments existed, the resume lines of train.log. Nothing of TensorFlow.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RunRecordError
from ..run.lock import RunLock
from ..run.metrics_files import finite, read_rows
from ..run.rundir import RunDir

# Written by fit when a run continues from a state ("resuming at epoch 4, step 12 (global step 84)").
log = logging.getLogger("train")
_RESUME_LINE = re.compile(r"^(\S+ \S+) resuming at epoch (\d+), step (\d+)")


@dataclass(frozen=True)
class Resume:
    """One continuation of the run: it re-entered `epoch` (1-based) at `step` within it."""

    epoch: int
    step: int
    at: str  # the train.log timestamp


# A manifest still "running" whose lock no process holds (RunLock.abandoned): SIGKILL, a power cut.
KILLED = "killed"


def run_status(run_dir: Path, manifest: dict[str, Any]) -> str:
    """The manifest's status as every reader shows it: KILLED for a "running" one whose process is gone."""
    status = str(manifest.get("status") or "unknown")
    return KILLED if status == "running" and RunLock(run_dir).abandoned() else status


@dataclass
class RunRecords:
    run_dir: Path
    config: dict[str, Any]
    manifest: dict[str, Any]
    rows: list[dict[str, float | None]] = field(default_factory=list)  # metrics.csv, numbers or None
    resumes: list[Resume] = field(default_factory=list)
    label: str = ""  # what compare shows for it instead of the folder's name (two runs of one name)

    @property
    def name(self) -> str:
        """The folder's name as the report, its curves and compare show it (or `label`): bytes that are no
        UTF-8 (a folder named on another system) as U+FFFD, which matplotlib can draw and a page can hold."""
        return (self.label or self.run_dir.name).encode("utf-8", "surrogateescape").decode("utf-8", "replace")

    @functools.cached_property
    def status(self) -> str:
        """run_status, probed once: the report and compare read it several times."""
        return run_status(self.run_dir, self.manifest)

    @property
    def monitor(self) -> str:
        return self.config.get("monitor", "val_accuracy")

    @property
    def mode(self) -> str:
        mode = self.config.get("monitor_mode", "auto")
        return mode if mode in ("min", "max") else ("min" if "loss" in self.monitor else "max")

    @property
    def planned_epochs(self) -> int | None:
        """The epochs the run set out to train: what its last segment planned, else what the settings say.

        A smoke run trains one epoch whatever EPOCHS says, and a resume may have extended EPOCHS,
        so `config["epochs"]` alone would call a finished smoke run "1 of 3"."""
        segments = [s for s in self.manifest.get("segments") or [] if isinstance(s, dict)]
        planned = segments[-1].get("epochs_planned") if segments else None
        if _whole(planned):
            return planned
        if self.config.get("smoke") is True:
            return 1
        epochs = self.config.get("epochs")
        return epochs if _whole(epochs) else None

    def best_row(self) -> dict[str, float | None] | None:
        """The epoch whose weights are best.weights.h5, as the manifest records it; else the epoch with
        the best MONITOR value (the first of equals: when the best weights were saved). metrics.csv holds
        6 significant digits, so two epochs it shows as equal may not have been equal to the loop."""
        scored = [r for r in self.rows if r.get(self.monitor) is not None]
        if self.rows and self.monitor not in self.rows[0]:
            _warn_once(RunDir(self.run_dir).metrics, self.monitor)
        if not scored:
            return None
        weights = self.manifest.get("weights")
        entry = (weights if isinstance(weights, dict) else {}).get("best.weights.h5")
        saved = entry.get("epoch") if isinstance(entry, dict) else None
        if (row := next((r for r in scored if r.get("epoch") == saved), None)) is not None:
            return row
        sign = 1 if self.mode == "max" else -1
        best = max(sign * r[self.monitor] for r in scored)
        return next(r for r in scored if sign * r[self.monitor] == best)

    def seconds_to(self, epoch: float | None) -> float | None:
        """Training seconds up to and including `epoch`, over every segment: validation excluded.

        The sum of epoch_seconds, plus what each stopped segment trained of the epoch it did not
        finish (metrics.csv times only the part the resumed segment trained). A killed segment's
        unfinished epoch is not known, and its steps since the last checkpoint are trained again."""
        if epoch is None:
            return None
        secs = [r.get("epoch_seconds") or 0.0 for r in self.rows if r.get("epoch") is not None and r["epoch"] <= epoch]
        if not secs:
            return None
        return sum(secs) + sum(s for e, s in self.unfinished_epochs() if e <= epoch)

    def unfinished_epochs(self) -> list[tuple[int, float]]:
        """(epoch, training seconds) of each segment's epoch left unfinished by a stop, from the manifest."""
        out = []
        for seg in self.manifest.get("segments") or []:
            part = seg.get("unfinished_epoch") if isinstance(seg, dict) else None
            if isinstance(part, dict) and isinstance(part.get("epoch"), int):
                seconds = part.get("train_seconds")
                if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0:
                    out.append((part["epoch"], float(seconds)))
        return out


_WARNED: set[tuple[Path, str]] = set()


def _warn_once(path: Path, column: str) -> None:
    """One line for a metrics.csv without the MONITOR column (an edit, a run of another MONITOR whose
    config.json was changed since), once per command: its best reads as `-`, which alone says nothing."""
    if (path, column) not in _WARNED:
        _WARNED.add((path, column))
        log.warning(
            "WARNING: %s has no %s column, the run's MONITOR: its best epoch is not known (shown as -); "
            "restore the file from a copy of the run",
            path,
            column,
        )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def load_records(run_dir: Path | str) -> RunRecords:
    """Read a run directory; RunRecordError names the file that is missing or unreadable."""
    files = RunDir(run_dir)
    config, manifest = files.read_config(), files.read_manifest(missing_ok=True)
    resumes = resumes_from_segments(manifest)
    if resumes is None:
        resumes = read_resumes(files.log)
    rows = read_metrics(files.metrics)
    done, last = manifest.get("epochs_completed"), max((r["epoch"] for r in rows), default=0)
    if manifest.get("status") != "running" and _whole(done) and last < done:  # a run still training may lag
        held = f"ends at epoch {last:g}" if rows else "holds no epoch"
        raise RunRecordError(
            f"{files.metrics} {held}, but {files.manifest.name} records {done} epoch(s) completed (the file is "
            "empty or cut short); restore it from a copy of the run"
        )
    return RunRecords(files.path, config, manifest, rows, resumes)


def resumes_from_segments(manifest: dict[str, Any]) -> list[Resume] | None:
    """Each segment that continued from a state; None for a manifest without segments."""
    segments = manifest.get("segments")
    if not isinstance(segments, list):
        return None
    resumes = []
    for seg in segments:
        if isinstance(seg, dict) and seg.get("resumed_from") and isinstance(seg.get("epoch_from"), int):
            step = re.search(r"step (\d+)", str(seg["resumed_from"]))
            resumes.append(Resume(seg["epoch_from"] + 1, int(step.group(1)) if step else 0, str(seg.get("started_at"))))
    return resumes


def read_metrics(path: Path) -> list[dict[str, float | None]]:
    """metrics.csv as numbers (an empty cell, e.g. GPU memory on a CPU, is None); none yet: []."""
    try:
        header, raw = read_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RunRecordError(
            f"{path} is unreadable ({type(exc).__name__}: {exc}); restore it from a copy of the run"
        ) from None
    if raw and "epoch" not in header:  # the header's fault, not the first row's
        raise RunRecordError(
            f"{path}, line 1: no 'epoch' column (its header: {', '.join(header)[:80]}); "
            "restore the file from a copy of the run"
        )
    rows = []
    for line, r in raw:
        if None in r:
            raise RunRecordError(
                f"{path}, line {line}: more values than the header has columns (not the metrics.csv layout); "
                "restore the file from a copy of the run"
            )
        if None in r.values():  # fewer values than columns: the file was cut short (a partial copy), or edited
            missing = [key for key, value in r.items() if value is None]
            raise RunRecordError(
                f"{path}, line {line}: the row ends before its {', '.join(missing[:2])}{' ...' if len(missing) > 2 else ''} "
                "column(s) (the file is cut short); restore it from a copy of the run"
            )
        row = {}
        for key, value in r.items():
            try:
                row[key] = float(value) if value not in ("", None) else None
            except ValueError:
                raise RunRecordError(
                    f"{path}, line {line}: {key}={value!r} is not a number; restore the file from a copy of the run"
                ) from None
        if row["epoch"] is None:
            raise RunRecordError(f"{path}, line {line}: the epoch is empty; restore the file from a copy of the run")
        if rows and not row["epoch"] > rows[-1]["epoch"]:  # fit writes each epoch once, in order
            raise RunRecordError(
                f"{path}, line {line}: epoch {row['epoch']:g} after epoch {rows[-1]['epoch']:g} (rows repeated or "
                "out of order: a merge, an edit); restore the file from a copy of the run"
            )
        rows.append(row)
    return rows


def read_resumes(path: Path) -> list[Resume]:
    if not path.is_file():
        return []
    resumes = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = _RESUME_LINE.match(line)
            if m:
                resumes.append(Resume(int(m.group(2)), int(m.group(3)), m.group(1)))
    return resumes


def duration_text(seconds: Any, compact: bool = False) -> str:
    """Seconds as `12.3 s` up to two minutes, `2.0 min` from there; `-` for no number.

    `compact` (`12.3s`, `2.0min`): for the columns of a table of runs side by side."""
    if not isinstance(seconds, (int, float)):
        return "-"
    space = "" if compact else " "
    return f"{seconds:.1f}{space}s" if seconds < 120 else f"{seconds / 60:.1f}{space}min"


def on_test_text(numbers: dict[str, Any] | None) -> str | None:
    """One test number of `on_test`'s as a table shows it, e.g. `accuracy=0.9912` (the loss when
    there is no accuracy); None when there is none."""
    got = numbers or {}
    name = "accuracy" if "accuracy" in got else "loss"
    value = got.get(name)
    if not finite(value):
        return None
    return f"{name}={value:.4f}"


def data_text(data: dict[str, Any]) -> str:
    """The manifest's data as the report shows it: where validation came from, when it says so."""
    text = (
        f"{data.get('dataset', '?')} from {data.get('source', '?')}: "
        f"{data.get('n_train', '?')} train / {data.get('n_val', '?')} val"
    )
    sources = {"train": " (from the training split)", "test": " (the test split)", "images": ""}
    where = sources.get(data.get("val_from"), "")
    test = f" / {data['n_test']} test" if data.get("n_test") else ""
    return f"{text}{where}{test}, {len(data.get('class_names') or [])} classes"
