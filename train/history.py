"""A run's records read back from its directory: settings, manifest, per-epoch metrics, resumes.

The report and `compare` work from the run directory alone (a run copied home from a cloud GPU
has nothing else), so this module reads config.json, manifest.json, metrics.csv and the resume
lines of train.log, and nothing of TensorFlow.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import RecordError

# Written by fit when a run continues from a state ("resuming at epoch 4, step 12 (global step 84)").
_RESUME_LINE = re.compile(r"^(\S+ \S+) resuming at epoch (\d+), step (\d+)")


@dataclass(frozen=True)
class Resume:
    """One continuation of the run: it re-entered `epoch` (1-based) at `step` within it."""

    epoch: int
    step: int
    at: str  # the train.log timestamp


@dataclass
class RunRecords:
    run_dir: Path
    config: dict[str, Any]
    manifest: dict[str, Any]
    rows: list[dict[str, float | None]] = field(default_factory=list)  # metrics.csv, numbers or None
    resumes: list[Resume] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def monitor(self) -> str:
        return self.config.get("monitor", "val_accuracy")

    @property
    def mode(self) -> str:
        mode = self.config.get("monitor_mode", "auto")
        return mode if mode in ("min", "max") else ("min" if "loss" in self.monitor else "max")

    def column(self, name: str) -> list[float | None]:
        return [r.get(name) for r in self.rows]

    def best_row(self) -> dict[str, float | None] | None:
        """The epoch with the best MONITOR value (the first of equals: when the best weights were saved)."""
        scored = [r for r in self.rows if r.get(self.monitor) is not None]
        if not scored:
            return None
        sign = 1 if self.mode == "max" else -1
        best = max(sign * r[self.monitor] for r in scored)
        return next(r for r in scored if sign * r[self.monitor] == best)

    def seconds_to(self, epoch: float | None) -> float | None:
        """Training seconds (sum of epoch_seconds) up to and including `epoch`: validation excluded."""
        if epoch is None:
            return None
        secs = [r.get("epoch_seconds") or 0.0 for r in self.rows if r.get("epoch") is not None and r["epoch"] <= epoch]
        return sum(secs) if secs else None


def load_records(run_dir: Path | str) -> RunRecords:
    """Read a run directory; RecordError names the file that is missing or unreadable and what to do."""
    run_dir = Path(run_dir)
    config = _read_json(run_dir / "config.json", required=True)
    manifest = _read_json(run_dir / "manifest.json", required=False)
    return RunRecords(run_dir, config, manifest, read_metrics(run_dir / "metrics.csv"), read_resumes(run_dir / "train.log"))


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise RecordError(f"{path} is missing: is {path.parent} a run directory? `python -m train runs` lists the runs")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RecordError(f"{path} is unreadable ({type(exc).__name__}: {exc}); restore it from a copy of the run") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path} holds a {type(data).__name__}, not an object; restore it from a copy of the run")
    return data


def read_metrics(path: Path) -> list[dict[str, float | None]]:
    """metrics.csv as numbers (an empty cell, e.g. GPU memory on a CPU, is None); none yet: []."""
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            raw = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RecordError(f"{path} is unreadable ({type(exc).__name__}: {exc}); restore it from a copy of the run") from None
    rows = []
    for line, r in enumerate(raw, start=2):
        if "epoch" not in r or None in r:
            raise RecordError(f"{path}, line {line}: not the metrics.csv layout (an 'epoch' column, one value per column)")
        row = {}
        for key, value in r.items():
            try:
                row[key] = float(value) if value not in ("", None) else None
            except ValueError:
                raise RecordError(f"{path}, line {line}: {key}={value!r} is not a number; restore the file from a copy of the run") from None
        if row["epoch"] is None:
            raise RecordError(f"{path}, line {line}: the epoch is empty; restore the file from a copy of the run")
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

