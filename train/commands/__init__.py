"""One module per built-in command of `python -m train`, each with `add_command(sub)` and `run(args)`.

The same shape as the optional commands (train.cli.OPTIONAL_COMMANDS, train.extras). Importing a command module is
cheap: the work it calls, and TensorFlow with it, loads only when the command runs. The helpers here
are the flags and steps several commands share.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from ..config import READ_BY_RUNS_COMMANDS, Settings, load_settings
from ..locations import redact_argv
from ..run.remote import open_runs_dir


def setting_help(doc: str) -> str:
    """A setting's doc as an argparse help: argparse formats help with %, so "90%" is "90%%" to it."""
    return doc.replace("%", "%%")


def add_env_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env-file", default=".env", help="settings file read before the environment (default .env)")


def add_runs_dir(p: argparse.ArgumentParser) -> None:
    """--env-file and --runs-dir: where a command that reads runs finds them; and --debug, which fit
    and settings have as a setting's flag: every command takes it (train.cli.main reads it itself)."""
    add_env_file(p)
    p.add_argument("--runs-dir", default=None, help="where the runs are (default: RUNS_DIR)")
    p.add_argument(
        "--debug",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the Python traceback of an expected error too, as DEBUG=true (default: DEBUG)",
    )


def add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id, run directory or 'latest'")


def settings_for(args: argparse.Namespace) -> Settings:
    """The full settings: --env-file, the environment, and every setting flag the command has."""
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    return load_settings(overrides, env_file=args.env_file, warn=warn)


def runs_settings(args: argparse.Namespace, given: dict | None = None) -> Settings:
    """Settings for a command that reads runs: RUNS_DIR and the extras' where runs live and what is made
    around them (READ_BY_RUNS_COMMANDS), and the flags `given` of those. The model and training settings
    of a run come from its own config.json."""
    return load_settings(
        {"runs_dir": args.runs_dir, **(given or {})},
        env_file=args.env_file,
        warn=warn,
        only=READ_BY_RUNS_COMMANDS,
    )


def resolve(
    args: argparse.Namespace, settings: Settings | None = None, checkpoints: bool = False, needs: Sequence = ()
) -> Path:
    """The run directory args.run names, for a command that starts TensorFlow on it.

    `latest` for a command that `needs` weights or an export (train.run.find.Need) is the newest
    run that has them, and a line on stderr names it. With RUNS_DIR in a store the run is first
    brought into the local staging copy (its checkpoints only when asked for: reproduce needs
    them, a report does not)."""
    settings = settings or runs_settings(args)
    remote = open_runs_dir(settings)
    run = args.run
    if remote is not None:
        # The store chose among its runs; the staging copy may hold others, or fewer of their files.
        run = remote.bring(args.run, checkpoints=checkpoints, needs=needs, say=warn) or args.run
    from ..run.find import resolve_run

    quiet_tensorflow()
    return resolve_run(settings.runs_dir, run, needs=needs, say=warn)


@contextmanager
def uploaded(settings: Settings, run_dir: Path, kept: str = "") -> Iterator[None]:
    """What the command writes into the run (report.html, export/) reaches the store after it.

    After a failure too (an export swapped in without its failed format), but then a store that does not
    take it is one warning: the command's own error says what went wrong, and its exit code stays. After
    a success, a store that does not take it is the command's error (StorageError, exit 7), after the line
    `kept`: what is done all the same, on this machine, and how to upload it."""
    from ..errors import Interrupted, StorageError

    try:
        yield
    except (KeyboardInterrupt, Interrupted):
        raise  # stopped: waits for no store (a docker stop's grace); the next command writing the run uploads it
    except BaseException:
        try:
            upload(settings, run_dir)
        except StorageError as exc:
            warn(f"WARNING: {type(exc).__name__}: {exc}")
        raise
    try:
        upload(settings, run_dir)
    except StorageError:
        if kept:
            warn(kept)
        raise


def upload(settings: Settings, run_dir: Path) -> None:
    """Every file of `run_dir` that the store lacks is uploaded now; nothing to do for a local RUNS_DIR.
    A line says where: the paths a command prints are the run's staging copy on this machine."""
    remote = open_runs_dir(settings)
    if remote is not None:
        remote.push(run_dir)
        warn(
            f"run {run_dir.name}: uploaded to {remote.url}/{run_dir.name}/ (the paths printed are its local staging copy)"
        )


def same_command(args: argparse.Namespace, run_dir: Path) -> str:
    """The command as the user gave it, the run named by its id: `latest` may be another run by then."""
    given = redact_argv(command_line(args))
    start = len(given) - len(getattr(args, "argv", None) or [args.command])
    for i in range(start, len(given)):
        if given[i] == args.run:
            given[i] = run_dir.name
            break
    return shlex.join(given)


def interpreter(orig_argv: Sequence[str]) -> list[str]:
    """How this process was started up to `-m train` (`.venv/bin/python -m train`), else `python -m train`."""
    for i in range(len(orig_argv) - 1):
        if orig_argv[i : i + 2] == ["-m", "train"]:
            return list(orig_argv[: i + 2])
    return ["python", "-m", "train"]


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as the user gave it (train.cli keeps the arguments in args.argv), to say it again."""
    return [*interpreter(sys.orig_argv), *(getattr(args, "argv", None) or [args.command])]


def warn(line: str) -> None:
    print(line, file=sys.stderr)


def quiet_tensorflow() -> None:
    """Keep TensorFlow's C++ start-up chatter (CPU instruction hints, cuInit on CPU hosts) off the console.

    A default only: a user who sets TF_CPP_MIN_LOG_LEVEL keeps theirs; `check` shows the messages
    that matter and explains them.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
