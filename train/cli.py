"""`python -m train {fit,export,predict,runs,report,compare,check,settings}`: the thin command-line edge.

Arguments become settings, one function is called, and the package's exceptions become one line on
stderr and a documented exit code (train.errors.EXIT_CODES). Heavy imports happen inside the
commands, after the settings are validated, so bad input is rejected before TensorFlow loads.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import extras
from .errors import EXIT_CODES, SecondInterrupt, TemplateError, UsageError

# Commands that live in a subpackage of their own, by name: module with add_command(sub) and run(args):
# the GPU check (drop it from a fork by deleting train/gpucheck/ and its entry here), then each extra's
# command (train.extras: its folder's command.py).
OPTIONAL_COMMANDS = {"check": "train.gpucheck.command", **extras.commands()}
# The built-in ones, in the order `--help` lists them; each is train/commands/<name>.py of the same shape.
BUILTIN_COMMANDS = {
    name: f"train.commands.{name}"
    for name in ("fit", "export", "predict", "runs", "report", "compare", "reproduce", "settings")
}
COMMANDS = (*BUILTIN_COMMANDS, *OPTIONAL_COMMANDS)


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one UsageError line (exit 2 at the edge), not a usage block and an exit.

    Every command's parser is one too: add_subparsers makes them of the parser's own class."""

    def error(self, message: str):
        if "ignored explicit argument" in message:  # `--export=false`: an on/off flag takes no value
            flag = message.split()[1].split("/")[0] if message.startswith("argument --") else ""
            name = flag.removeprefix("--no-").removeprefix("--")
            message += f" (an on/off flag takes no value: give --{name} or --no-{name})" if name else ""
        raise UsageError(self.prog, message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `only` that one: a run imports its own command's module,
    not the eleven others (`--help` and a word that is no command still get them all)."""
    epilog = "exit codes:\n" + "\n".join(f"  {k:>3}  {v}" for k, v in EXIT_CODES.items())
    # allow_abbrev=False everywhere: a prefix (`--epoch`, `--lr`) must not quietly become another flag.
    parser = _Parser(
        prog="python -m train",
        description="Reproducible TensorFlow training runs.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command")
    for name, module in _commands().items():
        if only in (None, name):
            importlib.import_module(module).add_command(sub)
    return parser


def _commands() -> dict[str, str]:
    return {**BUILTIN_COMMANDS, **OPTIONAL_COMMANDS}


def run(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and _no_command(argv[0]):
        raise UsageError("python -m train", f"{argv[0]!r} is not a command here (the commands: {', '.join(COMMANDS)})")
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["fit", *argv]
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise _unrecognized(parser, args.command, unknown, argv)
    args.argv = argv  # as given: what `fit` prints to paste, with --resume, after a stop
    return importlib.import_module(_commands()[args.command]).run(args)


def _no_command(word: str) -> bool:
    """A first word that is no command and not near one (`fit` takes no word): a command this template
    does not have, e.g. `serve` in a fork without the serve extra. A misspelt one is `fit`'s to name."""
    import difflib

    return (
        not word.startswith("-")
        and word not in COMMANDS
        # 0.7: `serve` and `sweep` are 0.6 alike, and a fork without one must not be told it meant the other.
        and not difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.7)
    )


def _unrecognized(
    parser: argparse.ArgumentParser, command: str, unknown: list[str], argv: Sequence[str] = ()
) -> UsageError:
    """Name the command the arguments were given to, and the flag a misspelt one probably meant."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = [f for f in sub._option_string_actions if f.startswith("--")]
    problem = f"unrecognized arguments: {' '.join(map(_shown_argument, unknown))}"
    switch = _switch_given_a_value(sub, argv)
    if switch:  # `--export false`: the table's `true`/`false` are .env values, a flag is on or off
        name = switch.removeprefix("--no-").removeprefix("--")
        both = isinstance(sub._option_string_actions[switch], argparse.BooleanOptionalAction)
        forms = f"give --{name} or --no-{name}" if both else f"give {switch}, or leave it out"
        return UsageError(sub.prog, f"{problem} ({switch} takes no value: {forms})")
    first = next((u.split("=", 1)[0] for u in unknown if u.startswith("--")), None)
    # A prefix is what abbreviations would have taken (allow_abbrev is off); else a near spelling.
    meant = sorted((f for f in flags if first and f.startswith(first)), key=len)
    meant = meant or (difflib.get_close_matches(first, flags, n=1, cutoff=0.75) if first else [])
    if not meant and unknown[0] == unknown[-1] and not unknown[0].startswith("-"):
        # `python -m train rnus`: a word that is no command became an argument of the default `fit`.
        meant = [f"the command {c}" for c in difflib.get_close_matches(unknown[0], COMMANDS, n=1, cutoff=0.6)]
    return UsageError(sub.prog, problem + (f" (did you mean {' or '.join(meant[:3])}?)" if meant else ""))


def _switch_given_a_value(sub: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first on/off flag in argv followed by a word that reads as a true/false value."""
    for before, word in zip(argv, argv[1:]):
        action = sub._option_string_actions.get(before)
        on_off = isinstance(action, (argparse.BooleanOptionalAction, argparse._StoreTrueAction))
        if on_off and before.startswith("--") and word.lower() in _TRUE_FALSE:
            return before
    return None


_TRUE_FALSE = ("true", "false", "yes", "no", "on", "off", "1", "0")


def _shown_argument(text: str) -> str:
    """An argument as an error shows it: a value masked as a URL is (a misspelt --storage must not
    print the database password it was given)."""
    from .locations import redact_uri

    name, sep, value = text.partition("=") if text.startswith("--") else ("", "", text)
    return f"{name}={redact_uri(value)}" if sep else redact_uri(text)


def _debug_setting(argv: Sequence[str]) -> bool:
    """DEBUG=1 in the environment or the --env-file (the flag is checked by main itself)."""
    try:
        from .config import debug_requested
    except TemplateError:  # the settings cannot even be imported (a model registered twice): that is the error said
        return False

    env_file = ".env"
    for i, arg in enumerate(argv):
        if arg == "--env-file" and i + 1 < len(argv):
            env_file = argv[i + 1]
        elif arg.startswith("--env-file="):
            env_file = arg.split("=", 1)[1]
    try:
        return "--no-debug" not in argv and debug_requested(env_file)
    except ModuleNotFoundError:  # python-dotenv is not installed: the error being reported, said once
        return False


def _stopped_line(exc: KeyboardInterrupt) -> str:
    if isinstance(exc, SecondInterrupt):  # its own words when a command knows better (a sweep: not --resume)
        return str(exc) or (
            "Stopped at once (second Ctrl-C): the last saved state is kept; a run that saved one continues with "
            "--resume RUN."
        )
    # The first Ctrl-C of a command that routes no signal to a save (report, predict, runs, compare):
    # calling it a second one, and pointing at --resume, would send the reader after a run that is not there.
    return "Stopped (Ctrl-C): the command did not finish; run it again"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    for stream in (sys.stdout, sys.stderr):  # a run name or class a terminal cannot encode: escaped, not a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = run(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's own flush at exit
        return code
    except BrokenPipeError:
        # `python -m train settings | head -1`: the reader has what it wanted. Stop quietly with
        # the status of a tool that SIGPIPE ended, as Unix tools do; stdout points at nothing
        # first, or Python would report the closed pipe again when it flushes at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except TemplateError as exc:
        if debug or _debug_setting(argv):
            # DEBUG adds the traceback; the exit code stays the documented one.
            traceback.print_exc(file=sys.stderr)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(_stopped_line(exc), file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        if (exc.name or "train").partition(".")[0] == "train":  # a module of ours gone: a bug, its traceback
            raise
        if debug or _debug_setting(argv):
            traceback.print_exc(file=sys.stderr)
        print(f"ModuleNotFoundError: {exc}: {_install_line(exc.name)}", file=sys.stderr)
        return 1


def _install_line(module: str) -> str:
    """What installs a package this Python cannot import. Nearly always `python -m train` typed into a
    Python other than the clone's .venv (the README's commands assume an activated one), which gets as
    far as the first command that needs numpy or TensorFlow."""
    for name, extra in extras.EXTRAS.items():
        if module.partition(".")[0] in extra.modules:
            return f"it comes with the {name} extra: `scripts/venv.sh --extra {name}` installs it into .venv"
    if Path(sys.prefix).name == ".venv":
        return (
            f"{sys.prefix} lacks a package of its lock: delete it and run scripts/venv.sh to make it again "
            "(a package your own code imports goes in requirements/core.in, then `invoke lock`: docs/tooling.md)"
        )
    return (
        f"this Python ({sys.executable}) is not the template's environment: run scripts/venv.sh once "
        "(scripts/train does it too), then .venv/bin/python -m train ..., or source .venv/bin/activate first"
    )
