"""`python -m train runs`: the runs under RUNS_DIR as a table (id, status, epochs, best, test, duration),
or with `--json` as one JSON list for scripts.

Oldest first, in the order the runs were created. The duration is the run's whole time over all its
segments (a stopped and resumed run adds up every stretch). A run whose config.json or manifest.json cannot
be read is one row marked `unreadable` (with the reason); it never takes the table down. A number
that is not finite or not a number (a hand-edited or damaged manifest: NaN, Infinity, "3") is
shown as `-` (null in JSON), and a run that failed has its error on a line under the table.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import RunRecordError, first_line
from ..locations import runs_dir_flag
from ..run.find import list_run_dirs
from ..run.manifest import data_version
from ..run.metrics_files import finite, metric_text
from ..run.rundir import RunDir
from ..training.test_split import on_test
from .run_records import KILLED, RunRecords, on_test_text, read_metrics, run_status


def list_runs(runs_dir: str | Path) -> list[dict]:
    rows = []
    for path in list_run_dirs(runs_dir):
        try:
            rows.append(_row(path))
        except (RunRecordError, AttributeError, TypeError, ValueError, OSError) as exc:
            reason = str(exc) if isinstance(exc, RunRecordError) else f"{type(exc).__name__}: {exc}"
            rows.append(
                {
                    "id": path.name,
                    "status": "unreadable",
                    "epochs": None,
                    "of": None,
                    "monitor": "",
                    "best": None,
                    "test": None,
                    "duration": None,
                    "model": "",
                    "dataset": "",
                    "smoke": False,
                    "reason": reason,
                    "error": None,
                    "copy_of": None,
                }
            )
    return rows


def _row(path: Path) -> dict:
    files = RunDir(path)
    cfg, m = files.read_config(), files.read_manifest(missing_ok=True)
    best = _number((m.get("best") or {}).get("value"))
    if best is None:
        best = _best_in_metrics(files, cfg, m)
    epochs = _count(m.get("epochs_completed"))
    if epochs is None and files.metrics.is_file():
        # errors="replace": a damaged file is named by report and compare; it leaves the rest of the row
        epochs = max(0, len(files.metrics.read_text(encoding="utf-8", errors="replace").strip().splitlines()) - 1)
    segments = [s for s in m.get("segments") or [] if isinstance(s, dict)]
    last = segments[-1] if segments else {}
    # What the run really does: a smoke run trains one epoch whatever EPOCHS says.
    of = _count(last.get("epochs_planned")) or (1 if cfg.get("smoke") is True else _count(cfg.get("epochs")))
    seconds = [_number(s.get("seconds")) for s in segments]
    if any(x is not None for x in seconds):
        duration = _number(sum(x for x in seconds if x is not None))
    else:
        duration = _number(m.get("duration_seconds"))
    error = m.get("error")
    recorded_id = m.get("run_id")
    return {
        "id": path.name,
        "status": run_status(path, m),
        "epochs": epochs,
        "of": of,
        "monitor": str(cfg.get("monitor", "")),
        "best": best,
        # The best weights on the test split, evaluated once at the end: never what chose them.
        "test": on_test(m),
        "duration": duration,
        "model": str(cfg.get("model", "")),
        "dataset": str(cfg.get("dataset", "")),
        "smoke": cfg.get("smoke") is True,  # a hand-edited "false" is not a smoke run
        "reason": None,
        "error": _one_line(error) if error else None,
        # A copy (`base copy.bak`) or a renamed run: listed like any run, and said to be one.
        "copy_of": recorded_id if isinstance(recorded_id, str) and recorded_id != path.name else None,
        "data_version": data_version(m),
    }


def _best_in_metrics(files: RunDir, cfg: dict, m: dict) -> float | None:
    """The best MONITOR value in metrics.csv: a run killed before it closed its manifest recorded none.

    The same rule as the report's (RunRecords.best_row): the epoch of the saved best weights, else by
    MONITOR_MODE, the first of equals."""
    try:
        row = RunRecords(files.path, cfg, m, read_metrics(files.metrics)).best_row()
    except RunRecordError:  # a damaged metrics.csv: the manifest still says the rest
        return None
    return _number(row.get(str(cfg.get("monitor", "val_accuracy")))) if row else None


def _number(v) -> float | None:
    """A finite number, else None: NaN and Infinity are valid in Python's JSON but in no one else's."""
    return v if finite(v) else None


def _count(v) -> int | None:
    v = _number(v)
    return int(v) if v is not None and v >= 0 and float(v).is_integer() else None


def _one_line(text, limit: int = 300) -> str:
    """The error's first line, its middle cut when it is long: its start says what failed and its end
    how to fix it (the package's messages end with the fix), and one row's note never fills the screen."""
    first = first_line(text, None) or str(text)
    if len(first) <= limit:
        return first
    keep = (limit - 5) // 2
    return f"{first[:keep]} ... {first[-keep:]}"


def format_runs(rows: list[dict], runs_dir: str = "./runs") -> str:
    if not rows:
        return "no runs yet (train with `python -m train`)"
    header = ("ID", "STATUS", "EPOCHS", "BEST", "TEST", "DURATION", "MODEL", "DATASET")
    table = [header]
    notes = []
    for r in rows:
        best = f"{r['monitor']}={metric_text(r['best'])}" if isinstance(r["best"], (int, float)) else "-"
        dur = f"{r['duration']:.0f}s" if isinstance(r["duration"], (int, float)) else "-"
        epochs = f"{r['epochs'] if r['epochs'] is not None else '-'}/{r['of'] or '-'}"
        dataset = f"{r['dataset']} (smoke)" if r.get("smoke") else r["dataset"]
        table.append((r["id"], r["status"], epochs, best, on_test_text(r.get("test")) or "-", dur, r["model"], dataset))
        if r.get("reason"):
            notes.append(f"{r['id']}: {r['reason']}")
        elif r.get("error"):
            notes.append(f"{r['id']}: {r['status']}: {r['error']}")
        if r["status"] == KILLED:
            notes.append(
                f"{r['id']}: killed: its process ended without closing the run (SIGKILL, out of memory, the "
                f"machine went down); `python -m train fit --resume {r['id']}{runs_dir_flag(runs_dir)}` continues it"
            )
        # A RUNS_DIR in object storage: a run the store does not have (train/store/remote.py, only_staged).
        if r.get("staged_only"):
            notes.append(f"{r['id']}: {r['staged_only']}")
        if r.get("copy_of"):
            notes.append(
                f"{r['id']}: its manifest.json says it is run {r['copy_of']}: a copy or a renamed folder; "
                "keep backups outside RUNS_DIR (every command takes what is there for a run)"
            )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines + notes)


VERSION_FIELDS = ("tool", "repository", "git_remote", "commit", "path", "dvc_file", "hash", "remote_url", "workspace")


def _version_fields(version: dict) -> dict:
    return {k: version.get(k) for k in VERSION_FIELDS}


def runs_json(rows: list[dict]) -> str:
    """The table's rows as one JSON list, with names a script can read without the table's header.

    Never NaN or Infinity (not JSON): a non-finite number is null. `error` is how a failed run
    failed (its manifest's error, first line)."""

    out = [
        {
            "id": r["id"],
            "status": r["status"],
            "epochs_completed": r["epochs"],
            "epochs_planned": r["of"],
            "monitor": r["monitor"] or None,
            "best": _number(r["best"]),
            "test": r.get("test"),  # the best weights on the test split: {"epoch", "loss", "accuracy", ...}
            "duration_seconds": _number(r["duration"]),
            "model": r["model"] or None,
            "dataset": r["dataset"] or None,
            "smoke": r["smoke"],
            "unreadable_reason": r["reason"],
            "error": r.get("error"),
            "copy_of": r.get("copy_of"),
            # Where DVC keeps the run's data (only a run that recorded one): train.run.manifest.data_version.
            **({"data_version": _version_fields(r["data_version"])} if r.get("data_version") else {}),
            # RUNS_DIR in object storage: a run in this machine's staging copy only (the store does not have it).
            **({"staged_only": True} if r.get("staged_only") else {}),
        }
        for r in rows
    ]
    return json.dumps(out, indent=2, allow_nan=False)
