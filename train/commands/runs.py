"""`python -m train runs`: the runs as a table, or as one JSON list for scripts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..run.remote import open_runs_dir
from . import add_runs_dir, runs_settings


def add_command(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", allow_abbrev=False, help="list runs as a table")
    runs.add_argument("--json", action="store_true", help="print one JSON list of the runs instead (for scripts)")
    add_runs_dir(runs)


def run(args: argparse.Namespace) -> int:
    settings = runs_settings(args)
    remote = open_runs_dir(settings)
    # The runs' records (no checkpoints) into the staging copy, and which runs the store has.
    stored = remote.bring_all_records() if remote is not None else None
    from ..results.runs_table import format_runs, list_runs, runs_json

    rows = list_runs(settings.runs_dir)
    for row in rows if stored is not None else ():
        if row["id"] not in stored:  # listed still: it may be a run whose upload failed, and must not look lost
            row["staged_only"] = remote.only_staged(row["id"])
    print(runs_json(rows) if args.json else format_runs(rows, settings.runs_dir))
    if not rows and remote is None and not Path(settings.runs_dir).exists():
        from ..run.files import in_kernel_files

        fix = (
            "point RUNS_DIR at a folder that can be made" if in_kernel_files(settings.runs_dir) else "train to make it"
        )
        print(f"(RUNS_DIR {settings.runs_dir} does not exist: check its spelling, or {fix})", file=sys.stderr)
    elif not rows and remote is None and (Path(settings.runs_dir) / "config.json").is_file():
        above = Path(settings.runs_dir).resolve().parent
        print(
            f"(RUNS_DIR {settings.runs_dir} is a run itself: point RUNS_DIR at the folder that holds it, {above})",
            file=sys.stderr,
        )
    return 0
