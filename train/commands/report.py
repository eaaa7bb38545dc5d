"""`python -m train report`: write a run's report.html and curves.png again."""

from __future__ import annotations

import argparse

from ..locations import found_in
from . import add_run, add_runs_dir, resolve, runs_settings, same_command, uploaded


def add_command(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "report", allow_abbrev=False, help="write a run's report.html and curves.png again (with the validation part)"
    )
    add_run(rep)
    rep.add_argument(
        "--quick",
        action="store_true",
        help="curves and summary only: no data loading, no predictions (a validation part already computed "
        "for the same best weights is kept)",
    )
    add_runs_dir(rep)


def run(args: argparse.Namespace) -> int:
    settings = runs_settings(args)
    run_dir = resolve(args, settings)
    from ..results.report import write_report
    from ..run.lock import RunLock
    from ..run.rundir import RunDir

    # The run's lock as a reader, as export takes it: report.html and curves.png are not written while a fit
    # writes them, and a process refused the lock (another machine trains the run) sends nothing into it.
    kept = (
        f"run {run_dir.name}: the report is written in this machine's staging copy, {RunDir(run_dir).report}, but "
        f"not in the store: once the store answers, `{same_command(args, run_dir)}` on this machine writes and uploads it"
    )
    with RunLock(run_dir, reader=True, then="report again"), uploaded(settings, run_dir, kept):
        written = write_report(run_dir, full=not args.quick, runs_dir=found_in(settings.runs_dir, run_dir))
    print(f"wrote {written.path} and {RunDir(run_dir).curves}")
    for part in written.missing:
        print(f"  not included: {part}")
    return 0
