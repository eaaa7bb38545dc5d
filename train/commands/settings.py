"""`python -m train settings`: every setting, as resolved values, as .env.example or as the README table."""

from __future__ import annotations

import argparse

from .. import config
from . import add_env_file, settings_for


def add_command(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser(
        "settings", allow_abbrev=False, help="print every setting: resolved values, .env.example or the README table"
    )
    add_env_file(st)
    st.add_argument("--format", choices=("resolved", "env-example", "table"), default="resolved")


def run(args: argparse.Namespace) -> int:
    if args.format == "env-example":
        print(config.env_example())
    elif args.format == "table":
        print(config.settings_table())
    else:
        for k, v in settings_for(args).to_dict().items():
            print(f"{k.upper()}={v}")
    return 0
