"""`python -m train compare`: settings that differ, final and best metrics, overlaid curves of two or more runs."""

from __future__ import annotations

import argparse

from ..run.remote import open_runs_dir
from . import add_runs_dir, runs_settings


def add_command(sub: argparse._SubParsersAction) -> None:
    cmp_ = sub.add_parser(
        "compare",
        allow_abbrev=False,
        help="settings that differ, final and best metrics, time to best, overlaid curves",
    )
    cmp_.add_argument("runs", nargs="+", metavar="RUN", help="two or more run ids, run directories or 'latest'")
    cmp_.add_argument(
        "--out", default=None, help="also write the overlaid curves: a .png, or an .html page with the tables"
    )
    add_runs_dir(cmp_)


def run(args: argparse.Namespace) -> int:
    settings = runs_settings(args)
    remote = open_runs_dir(settings)
    if remote is not None:  # the records of every run, and the curves' files of these
        remote.bring_all_records()
        for name in args.runs:
            remote.bring(name, checkpoints=False)
    from ..results.compare import compare_runs

    print(compare_runs(settings.runs_dir, args.runs, args.out))
    return 0
