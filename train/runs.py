"""`python -m train runs`: the runs under RUNS_DIR as a table (id, status, epochs, best, duration),
or with `--json` as one JSON list for scripts.

Oldest first, in the order the runs were created. The duration is the run's whole time over all its
segments (a stopped and resumed run adds up every stretch). A run whose config.json or manifest.json cannot
be read is one row marked `unreadable` (with the reason); it never takes the table down.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import RunRecordError
from .rundir import RunDir, list_run_dirs


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
                    "duration": None,
                    "model": "",
                    "dataset": "",
                    "smoke": False,
                    "reason": reason,
                }
            )
    return rows


def _row(path: Path) -> dict:
    files = RunDir(path)
    cfg, m = files.read_config(), files.read_manifest(missing_ok=True)
    best = (m.get("best") or {}).get("value")
    epochs = m.get("epochs_completed")
    if epochs is None and files.metrics.is_file():
        epochs = max(0, len(files.metrics.read_text().strip().splitlines()) - 1)
    segments = [s for s in m.get("segments") or [] if isinstance(s, dict)]
    last = segments[-1] if segments else {}
    # What the run really does: a smoke run trains one epoch whatever EPOCHS says.
    of = last.get("epochs_planned") or (1 if cfg.get("smoke") else cfg.get("epochs"))
    if segments and any(isinstance(s.get("seconds"), (int, float)) for s in segments):
        duration = sum(s["seconds"] for s in segments if isinstance(s.get("seconds"), (int, float)))
    else:
        duration = m.get("duration_seconds")
    return {
        "id": path.name,
        "status": m.get("status", "unknown"),
        "epochs": epochs,
        "of": of,
        "monitor": cfg.get("monitor", ""),
        "best": best,
        "duration": duration,
        "model": cfg.get("model", ""),
        "dataset": cfg.get("dataset", ""),
        "smoke": bool(cfg.get("smoke")),
        "reason": None,
    }


def format_runs(rows: list[dict]) -> str:
    if not rows:
        return "no runs yet (train with `python -m train`)"
    header = ("ID", "STATUS", "EPOCHS", "BEST", "DURATION", "MODEL", "DATASET")
    table = [header]
    notes = []
    for r in rows:
        best = f"{r['monitor']}={r['best']:.4f}" if isinstance(r["best"], (int, float)) else "-"
        dur = f"{r['duration']:.0f}s" if isinstance(r["duration"], (int, float)) else "-"
        epochs = f"{r['epochs'] if r['epochs'] is not None else '-'}/{r['of'] or '-'}"
        dataset = f"{r['dataset']} (smoke)" if r.get("smoke") else r["dataset"]
        table.append((r["id"], r["status"], epochs, best, dur, r["model"], dataset))
        if r.get("reason"):
            notes.append(f"{r['id']}: {r['reason']}")
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines + notes)


def runs_json(rows: list[dict]) -> str:
    """The table's rows as one JSON list, with names a script can read without the table's header.

    Never NaN or Infinity (not JSON): a non-finite best value is null."""

    def number(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    out = [
        {
            "id": r["id"],
            "status": r["status"],
            "epochs_completed": r["epochs"],
            "epochs_planned": r["of"],
            "monitor": r["monitor"] or None,
            "best": number(r["best"]),
            "duration_seconds": number(r["duration"]),
            "model": r["model"] or None,
            "dataset": r["dataset"] or None,
            "smoke": r["smoke"],
            "unreadable_reason": r["reason"],
        }
        for r in rows
    ]
    return json.dumps(out, indent=2, allow_nan=False)
