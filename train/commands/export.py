"""`python -m train export`: a run's best weights as SavedModel + .keras + labels, reloaded and compared."""

from __future__ import annotations

import argparse
import logging

from .. import extras
from ..errors import ConfigError
from . import add_run, add_runs_dir, resolve, runs_settings, same_command, setting_help, uploaded


def add_command(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser(
        "export", allow_abbrev=False, help="export a run's best weights as SavedModel + .keras + labels"
    )
    add_run(exp)
    add_runs_dir(exp)
    for flag, (name, text) in extras.flags("export").items():  # the formats extra's --format and --quantize
        exp.add_argument(flag, dest=name, default=None, metavar=flag.lstrip("-").upper(), help=setting_help(text))


def run(args: argparse.Namespace) -> int:
    # The extras' flags are settings: validated like the same settings in .env.
    flags = {name: flag for flag, (name, _) in extras.flags("export").items() if getattr(args, name) is not None}
    given = {name: getattr(args, name) for name in flags}
    try:
        settings = runs_settings(args, given)
    except ConfigError as exc:  # a value typed as a flag: the message names the flag
        if exc.name.lower() not in flags:
            raise
        raise ConfigError(flags[exc.name.lower()], exc.value, exc.allowed) from None
    extras.require_section("onnx", settings)  # ONNX's converter, when EXPORT_FORMATS asks for it
    from ..results.export import export_run, other_formats
    from ..run.find import WEIGHTS
    from ..run.lock import RunLock
    from ..run.rundir import RunDir

    if (formats := other_formats(settings)) is not None:
        formats.check(flags)  # their runtimes, named as the user gave them (a flag or its setting)
    run_dir = resolve(args, settings, needs=(WEIGHTS,))

    # The run's lock as a reader: never while a fit writes the same run. The upload inside it: a process
    # refused the lock (another machine writes the run) must not send this staging copy into that run.
    kept = (
        f"run {run_dir.name}: the export is complete in this machine's staging copy, {RunDir(run_dir).export.path}, but not "
        f"in the store: once the store answers, `{same_command(args, run_dir)}` on this machine exports and uploads it"
    )
    if not logging.root.handlers:
        # As Python prints a warning while no handler is set: the line as it is. Else absl's first line
        # (TensorFlow's, on saving the SavedModel) sets one that prints "WARNING:train:" before each.
        logging.root.addHandler(logging.lastResort)
    with RunLock(run_dir, reader=True, then="export again"), uploaded(settings, run_dir, kept):
        report = export_run(run_dir, settings=settings, command=same_command(args, run_dir))
    print(f"exported {report['savedmodel']} (max |diff| {report['max_abs_diff']:.2e})")
    for fmt, record in report.get("formats", {}).items():
        done = "kept (the same weights)" if record.get("kept") else "exported"
        print(
            f"{done} {fmt}: {record['file']} ({record['bytes'] / 1e6:.2f} MB, max |diff| {record['max_abs_diff']:.2e})"
        )
    return 0
