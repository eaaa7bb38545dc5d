"""`python -m train settings`: every setting, as resolved values, as .env.example or as the README table."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import fields

from .. import config
from ..errors import UsageError
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
    if args.format != "resolved":
        flags = [f.name for f in fields(config.Settings) if getattr(args, f.name, None) is not None]
        if flags:  # they would be silently ignored: both formats print the defaults
            raise UsageError(
                "python -m train settings",
                f"--format {args.format} prints every setting at its default: "
                f"--{flags[0].replace('_', '-')} applies to the resolved settings (leave --format out)",
            )
        print(config.env_example() if args.format == "env-example" else config.settings_table())
        return 0
    s = settings_for(args)
    given = config.given(s)
    chosen = not config.BATCH_PAIR & given
    raw = dataclasses.asdict(s)
    # Saved as a .env, the output must change nothing but what was set: a default written out
    # would turn off a choice (the batch pair) or a compose default (`RESUME=` is not unset).
    print(HEADER)
    for k, v in s.to_dict().items():
        line = f"{k.upper()}={env_value(config.env_text(v))}"
        if k in given and v != raw[k]:  # a URL's secret masked: written out, it would set the mask
            print(f"# {line}  # {MASKED}")
        elif k in given and "${" in line:  # .env expands it, in any quotes
            print(f"# {line}  # {EXPANDED}")
        elif k in given:
            print(line)
        elif chosen and k in config.BATCH_PAIR:
            print(f"# {line}  # {CHOSEN}")
        else:
            print(f"# {line}")
    return 0


def env_value(text: str) -> str:
    """`text` as a .env value that reads back as it is: single-quoted where a space, `#`, a quote or a
    backslash would otherwise change it (`${...}` is still expanded, in any quotes)."""
    if not text or not any(c in text for c in " \t#'\"\\") and text == text.strip():
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


HEADER = (
    "# what is set (a flag, the environment, .env) as NAME=value; every other setting at its default, commented out"
)
MASKED = "its secret is masked here: uncomment it and write the secret in by hand"
EXPANDED = "a .env would expand its ${...}: set it in the environment instead"
CHOSEN = (
    "not set: a new run chooses the pair, {} and {} where it trains in float32 on a CPU, "
    "{} and {} elsewhere; set either to fix both"
).format(*CPU_FLOAT32_BATCH, config.Settings.batch_size, config.Settings.learning_rate)
