"""`python -m train export`: a run's best weights as SavedModel + .keras + labels, reloaded and compared."""

from __future__ import annotations

import argparse

from . import add_run, add_runs_dir, resolve


def add_command(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser(
        "export", allow_abbrev=False, help="export a run's best weights as SavedModel + .keras + labels"
    )
    add_run(exp)
    add_runs_dir(exp)


def run(args: argparse.Namespace) -> int:
    run_dir = resolve(args)
    from ..results.export import export_run
    from ..run.lock import RunLock

    with RunLock(run_dir):  # never while a fit writes the same run
        report = export_run(run_dir)
    print(f"exported {report['savedmodel']} (max |diff| {report['max_abs_diff']:.2e})")
    return 0
