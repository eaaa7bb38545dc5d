"""`python -m train settings`: every setting, as resolved values, as .env.example or as the README table."""

from __future__ import annotations

import argparse

from .. import config
from ..setup.hardware import CPU_FLOAT32_BATCH
from . import add_env_file, settings_for
from .fit import add_setting_flags


def add_command(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser(
        "settings", allow_abbrev=False, help="print every setting: resolved values, .env.example or the README table"
    )
    add_env_file(st)
    st.add_argument("--format", choices=("resolved", "env-example", "table"), default="resolved")
    add_setting_flags(st)  # what `fit` with the same flags would train with


def run(args: argparse.Namespace) -> int:
    if args.format == "env-example":
        print(config.env_example())
    elif args.format == "table":
        print(config.settings_table())
    else:
        s = settings_for(args)
        given = config.given(s)
        chosen = not config.BATCH_PAIR & given
        # Saved as a .env, the output must change nothing but what was set: a default written out
        # would turn off a choice (the batch pair) or a compose default (`RESUME=` is not unset).
        print(HEADER)
        for k, v in s.to_dict().items():
            line = f"{k.upper()}={config.env_text(v)}"
            if k in given:
                print(line)
            elif chosen and k in config.BATCH_PAIR:
                print(f"# {line}  # {CHOSEN}")
            else:
                print(f"# {line}")
    return 0


HEADER = (
    "# what is set (a flag, the environment, .env) as NAME=value; every other setting at its default, commented out"
)
CHOSEN = (
    "not set: a new run chooses the pair, {} and {} where it trains in float32 on a CPU, "
    "{} and {} elsewhere; set either to fix both"
).format(*CPU_FLOAT32_BATCH, config.Settings.batch_size, config.Settings.learning_rate)
