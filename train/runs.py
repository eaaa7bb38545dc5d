"""`python -m train runs`: the runs under RUNS_DIR as a table (id, status, epochs, best, duration)."""

from __future__ import annotations

import json
from pathlib import Path

from .rundir import is_run_dir


def list_runs(runs_dir: str | Path) -> list[dict]:
    root = Path(runs_dir)
    rows = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not is_run_dir(path):
            continue
        try:
            m = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            m = {}
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            cfg = {}
        best = (m.get("best") or {}).get("value")
        epochs = m.get("epochs_completed")
        if epochs is None and (path / "metrics.csv").is_file():
            epochs = max(0, len((path / "metrics.csv").read_text().strip().splitlines()) - 1)
        rows.append({"id": path.name, "status": m.get("status", "unknown"), "epochs": epochs,
                     "of": cfg.get("epochs"), "monitor": cfg.get("monitor", ""), "best": best,
                     "duration": m.get("duration_seconds"), "model": cfg.get("model", ""),
                     "dataset": cfg.get("dataset", "")})
    return rows


def format_runs(rows: list[dict]) -> str:
    if not rows:
        return "no runs yet (train with `python -m train`)"
    header = ("ID", "STATUS", "EPOCHS", "BEST", "DURATION", "MODEL", "DATASET")
    table = [header]
    for r in rows:
        best = f"{r['monitor']}={r['best']:.4f}" if isinstance(r["best"], (int, float)) else "-"
        dur = f"{r['duration']:.0f}s" if isinstance(r["duration"], (int, float)) else "-"
        epochs = f"{r['epochs'] if r['epochs'] is not None else '-'}/{r['of'] or '-'}"
        table.append((r["id"], r["status"], epochs, best, dur, r["model"], r["dataset"]))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
