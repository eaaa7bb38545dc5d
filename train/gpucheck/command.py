"""The `check` sub-command of `python -m train`: its flags here, its work in check.py.

train.cli adds it through `OPTIONAL_COMMANDS`, so that dropping the GPU check is deleting this
folder and that one entry. Importing this module is cheap: check.py loads only when the command runs.
"""

from __future__ import annotations

import argparse


def add_command(sub: argparse._SubParsersAction) -> None:
    chk = sub.add_parser("check", allow_abbrev=False, help="diagnose the GPU set-up and say why a GPU is not used")
    chk.add_argument("--json", action="store_true", help="print the report as JSON")
    chk.add_argument("--require-gpu", action="store_true", help="exit 1 when no usable GPU is found")
    chk.add_argument("--skip-matmul", action="store_true", help="skip the timed matmul benchmark")
    # As train.commands.add_runs_dir adds it to the commands that read runs (train.cli.main reads it
    # itself); written out here, since this folder sits below train.commands and must not import it.
    chk.add_argument(
        "--debug",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the Python traceback of an expected error too (--require-gpu's), as DEBUG=true (default: DEBUG)",
    )


def run(args: argparse.Namespace) -> int:
    from .check import main

    return main(json_output=args.json, require_gpu=args.require_gpu, skip_matmul=args.skip_matmul)
