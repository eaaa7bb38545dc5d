"""`python -m train fit` (the default command): train a model, or resume or restart a run."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from dataclasses import fields

from ..config import Settings
from ..errors import Interrupted
from ..run.remote import open_runs_dir
from . import (
    add_env_file,
    command_line,
    quiet_tensorflow,
    setting_help,
    settings_for,
)

# Stopped early with a resumable state saved (signal or MAX_MINUTES): the documented "try again".
EXIT_CODES_BY_STATUS = {"interrupted": Interrupted.exit_code, "budget": Interrupted.exit_code}


class _OnOff(argparse.BooleanOptionalAction):
    """--x / --no-x, where giving both is a usage error instead of the last one silently winning."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)
        if before is not None and before != getattr(namespace, self.dest):
            raise argparse.ArgumentError(self, "given both ways: keep one")


def add_command(sub: argparse._SubParsersAction) -> None:
    fit = sub.add_parser("fit", allow_abbrev=False, help="train a model (the default command)")
    add_env_file(fit)
    fit.add_argument("--force", action="store_true", help="resume even if settings or data differ from the run's own")
    fit.add_argument(
        "--restart",
        action="store_true",
        help="with --resume RUN: train RUN again from epoch 1 in its own directory when its checkpoints are gone",
    )
    add_setting_flags(fit)


def add_setting_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("settings (each also readable from .env or the environment as UPPER_CASE)")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        text = setting_help(f.metadata["doc"])
        if f.type in ("bool", bool):
            group.add_argument(flag, dest=f.name, default=None, action=_OnOff, help=text)
        else:
            # Parsed as text and coerced by config, so a bad flag gets the same message as a bad .env line.
            group.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=text)


def run(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    from .. import check_before_training, train

    check_before_training(settings)  # extras, export runtimes, bfloat16's ISA (train() checks them too)
    open_runs_dir(settings)  # RUNS_DIR in a store: it must answer before TensorFlow loads (StorageError, exit 7)
    quiet_tensorflow()  # TensorFlow is imported from here on

    given = command_line(args)
    result = train(
        settings,
        force=args.force,
        restart=args.restart,
        continue_with=lambda name: continue_command(given, name, settings.resume),
    )
    return 0 if result.status == "completed" else EXIT_CODES_BY_STATUS.get(result.status, 1)


def continue_command(given: Sequence[str], run_name: str, resume: str = "") -> str:
    """The command a user pastes to continue `run_name`: the same command (`given`, train.commands.command_line),
    its own --resume and --restart replaced by `--resume run_name` (the run's settings are in its
    config.json, so the same flags agree with them). Under RESUME=auto (`resume`), which compose sets,
    the same command again continues it too: in the container that is `docker compose up`, while the
    `python -m train` line is the image's own command, which a compose user never typed."""
    kept, skip = [], False
    for arg in given:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True  # and its value
        elif arg != "--restart" and not arg.startswith("--resume="):
            kept.append(arg)
    command = shlex.join([*kept, "--resume", run_name])
    if resume == "auto":
        return f"{command} (or the same command again: RESUME=auto continues this run)"
    return command
