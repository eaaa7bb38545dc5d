"""`python -m train {fit,export,predict,runs,report,compare,check,settings}`: the thin command-line edge.

Arguments become settings, one function is called, and the package's exceptions become one line on
stderr and a documented exit code (train.errors.EXIT_CODES). Heavy imports happen inside the
commands, after the settings are validated, so bad input is rejected before TensorFlow loads.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from dataclasses import fields

from .config import Settings, load_settings
from .errors import EXIT_CODES, Interrupted, ReproduceMismatch, TemplateError

# Commands that live in a subpackage of their own, by name: module with add_command(sub) and run(args).
# Drop one from a fork by deleting its folder and its entry here.
OPTIONAL_COMMANDS = {"check": "train.gpucheck.command"}
COMMANDS = ("fit", "export", "predict", "runs", "report", "compare", "settings", "reproduce", *OPTIONAL_COMMANDS)


class _OnOff(argparse.BooleanOptionalAction):
    """--x / --no-x, where giving both is a usage error instead of the last one silently winning."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)
        if before is not None and before != getattr(namespace, self.dest):
            raise argparse.ArgumentError(self, "given both ways: keep one")


def _add_setting_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("settings (each also readable from .env or the environment as UPPER_CASE)")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            group.add_argument(flag, dest=f.name, default=None, action=_OnOff, help=f.metadata["doc"])
        else:
            # Parsed as text and coerced by config, so a bad flag gets the same message as a bad .env line.
            group.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=f.metadata["doc"])


def build_parser() -> argparse.ArgumentParser:
    epilog = "exit codes:\n" + "\n".join(f"  {k:>3}  {v}" for k, v in EXIT_CODES.items())
    # allow_abbrev=False everywhere: a prefix (`--epoch`, `--lr`) must not quietly become another flag.
    parser = argparse.ArgumentParser(
        prog="python -m train",
        description="Reproducible TensorFlow training runs.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command")

    _add_fit(sub)
    _add_export(sub)
    _add_predict(sub)
    _add_runs(sub)
    _add_report(sub)
    _add_compare(sub)
    _add_reproduce(sub)
    _add_settings(sub)
    for module in OPTIONAL_COMMANDS.values():
        importlib.import_module(module).add_command(sub)
    return parser


def _add_fit(sub) -> None:
    fit = sub.add_parser("fit", allow_abbrev=False, help="train a model (the default command)")
    fit.add_argument("--env-file", default=".env", help="settings file read before the environment (default .env)")
    fit.add_argument("--force", action="store_true", help="resume even if settings or data differ from the run's own")
    fit.add_argument(
        "--restart",
        action="store_true",
        help="with --resume RUN: train RUN again from epoch 1 in its own directory when its checkpoints are gone",
    )
    _add_setting_flags(fit)


def _add_export(sub) -> None:
    exp = sub.add_parser(
        "export", allow_abbrev=False, help="export a run's best weights as SavedModel + .keras + labels"
    )
    exp.add_argument("run", help="run id, run directory or 'latest'")
    exp.add_argument("--env-file", default=".env")
    exp.add_argument("--runs-dir", default=None)


def _add_predict(sub) -> None:
    pred = sub.add_parser("predict", allow_abbrev=False, help="print class and probability for image files")
    pred.add_argument("run", help="run id, run directory or 'latest'")
    pred.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF or BMP)")
    pred.add_argument("--env-file", default=".env")
    pred.add_argument("--runs-dir", default=None)


def _add_runs(sub) -> None:
    runs = sub.add_parser("runs", allow_abbrev=False, help="list runs as a table")
    runs.add_argument("--json", action="store_true", help="print one JSON list of the runs instead (for scripts)")
    runs.add_argument("--env-file", default=".env")
    runs.add_argument("--runs-dir", default=None)


def _add_report(sub) -> None:
    rep = sub.add_parser(
        "report", allow_abbrev=False, help="write a run's report.html and curves.png again (with the validation part)"
    )
    rep.add_argument("run", help="run id, run directory or 'latest'")
    rep.add_argument(
        "--quick",
        action="store_true",
        help="curves and summary only: no data loading, no predictions (a validation part already computed "
        "for the same best weights is kept)",
    )
    rep.add_argument("--env-file", default=".env")
    rep.add_argument("--runs-dir", default=None)


def _add_compare(sub) -> None:
    cmp_ = sub.add_parser(
        "compare",
        allow_abbrev=False,
        help="settings that differ, final and best metrics, time to best, overlaid curves",
    )
    cmp_.add_argument("runs", nargs="+", metavar="RUN", help="two or more run ids, run directories or 'latest'")
    cmp_.add_argument(
        "--out", default=None, help="also write the overlaid curves: a .png, or an .html page with the tables"
    )
    cmp_.add_argument("--env-file", default=".env")
    cmp_.add_argument("--runs-dir", default=None)


def _add_reproduce(sub) -> None:
    rep = sub.add_parser(
        "reproduce", allow_abbrev=False, help="rerun a run from its own record and say whether it matches"
    )
    rep.add_argument("run", help="run id, run directory or 'latest'")
    where = rep.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--local", action="store_true", help="rerun in this environment (installed versions compared with the run's)"
    )
    where.add_argument(
        "--container",
        action="store_true",
        help="rerun in the run's image IMAGE:<target>-<lock hash>-<commit>, built from the commit if missing",
    )
    rep.add_argument(
        "--data-dir", default="data", help="--container: the host folder mounted as /data (default ./data)"
    )
    rep.add_argument(
        "--target", choices=("cpu", "gpu"), default=None, help="--container: image target (default: the run's lock)"
    )
    rep.add_argument("--base-image", default="", help="--container: build argument BASE_IMAGE when the image is built")
    rep.add_argument("--ca-bundle", default="", help="--container: a CA bundle for pip behind a TLS proxy, when built")
    rep.add_argument("--network", default="", help="--container: docker build --network, when built")
    rep.add_argument("--allow-dirty", action="store_true", help="rerun a run made from uncommitted changes anyway")
    rep.add_argument("--epochs", type=int, default=None, help="stop after N epochs and compare with that epoch")
    rep.add_argument("--env-file", default=".env")
    rep.add_argument("--runs-dir", default=None)


def _add_settings(sub) -> None:
    st = sub.add_parser(
        "settings", allow_abbrev=False, help="print every setting: resolved values, .env.example or the README table"
    )
    st.add_argument("--env-file", default=".env")
    st.add_argument("--format", choices=("resolved", "env-example", "table"), default="resolved")


def _settings_for(args: argparse.Namespace) -> Settings:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Settings)}
    return load_settings(overrides, env_file=args.env_file, warn=_warn)


def _warn(line: str) -> None:
    print(line, file=sys.stderr)


def run(argv: Sequence[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["fit", *argv]
    args = build_parser().parse_args(argv)
    cmd = args.command
    if cmd == "fit":
        return _fit(args)
    if cmd == "settings":
        return _settings(args)
    if cmd in OPTIONAL_COMMANDS:
        return importlib.import_module(OPTIONAL_COMMANDS[cmd]).run(args)
    # These commands read runs; the model of a run comes from its own config.json, not from MODEL.
    settings = load_settings({"runs_dir": args.runs_dir}, env_file=args.env_file, warn=_warn, check_model=False)
    from .run.remote import open_runs_dir

    remote = open_runs_dir(settings)  # a store: the runs a command reads come into its staging copy first
    if remote is not None and cmd in ("runs", "compare"):
        remote.bring_all_records()
    if remote is not None and cmd in ("compare",):
        for name in args.runs:
            remote.bring(name, checkpoints=False)
    if remote is not None and cmd not in ("runs", "compare"):
        remote.bring(args.run, checkpoints=cmd == "reproduce")
    if cmd == "runs":
        from .results.runs_table import format_runs, list_runs, runs_json

        rows = list_runs(settings.runs_dir)
        print(runs_json(rows) if args.json else format_runs(rows))
        return 0
    if cmd == "compare":
        from .results.compare import compare_runs

        print(compare_runs(settings.runs_dir, args.runs, args.out))
        return 0
    from .run.find import resolve_run

    _quiet_tensorflow()  # export, predict and reproduce start TensorFlow too
    run_dir = resolve_run(settings.runs_dir, args.run)
    if cmd == "predict":
        return _predict(args, run_dir)
    try:
        if cmd == "report":
            return _report(args, run_dir)
        if cmd == "reproduce":
            return _reproduce(args, run_dir)
        return _export(run_dir)
    finally:
        if remote is not None:  # what the command wrote into the run (report.html, export/, reproduce.json)
            remote.push(run_dir)


def _fit(args: argparse.Namespace) -> int:
    settings = _settings_for(args)
    from .run.remote import open_runs_dir

    open_runs_dir(settings)  # RUNS_DIR in a store: it must answer before TensorFlow loads (StorageError, exit 7)
    _quiet_tensorflow()
    from .training.fit import train  # TensorFlow is imported from here on

    result = train(settings, force=args.force, restart=args.restart)
    return 0 if result.status == "completed" else EXIT_CODES_BY_STATUS.get(result.status, 1)


def _settings(args: argparse.Namespace) -> int:
    from . import config

    if args.format == "env-example":
        print(config.env_example())
    elif args.format == "table":
        print(config.settings_table())
    else:
        for k, v in _settings_for(args).to_dict().items():
            print(f"{k.upper()}={v}")
    return 0


def _report(args: argparse.Namespace, run_dir) -> int:
    from .results.report import write_report

    written = write_report(run_dir, full=not args.quick)
    from .run.rundir import RunDir

    print(f"wrote {written.path} and {RunDir(run_dir).curves}")
    for part in written.missing:
        print(f"  not included: {part}")
    return 0


def _reproduce(args: argparse.Namespace, run_dir) -> int:
    from .reproduce.rerun import format_verdict, reproduce
    from .run.manifest import project_root

    image = None
    if args.container:
        import os
        from pathlib import Path

        from .reproduce.image import ImageOptions

        image = ImageOptions(
            Path(args.data_dir),
            args.target or "",
            os.environ.get("IMAGE", "tf-train-template"),
            args.base_image,
            args.ca_bundle,
            args.network,
            os.environ.get("DOCKER", "docker"),
        )
    verdict = reproduce(run_dir, project_root(), allow_dirty=args.allow_dirty, epochs=args.epochs, image=image)
    print(format_verdict(verdict))
    return 0 if verdict.match else ReproduceMismatch.exit_code


def _export(run_dir) -> int:
    from .results.export import export_run
    from .run.lock import RunLock

    with RunLock(run_dir):  # never while a fit writes the same run
        report = export_run(run_dir)
    print(f"exported {report['savedmodel']} (max |diff| {report['max_abs_diff']:.2e})")
    return 0


def _predict(args: argparse.Namespace, run_dir) -> int:
    from .errors import DataError
    from .results.predict import format_predictions, predict_files

    rows = predict_files(run_dir, args.images)
    if any("error" not in r for r in rows):
        print(format_predictions(rows))
    bad = [r["error"] for r in rows if "error" in r]
    for exc in bad:  # each bad file is one line; the others are still predicted
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return DataError.exit_code if bad else 0


# Stopped early with a resumable state saved (signal or MAX_MINUTES): the documented "try again".
EXIT_CODES_BY_STATUS = {"interrupted": Interrupted.exit_code, "budget": Interrupted.exit_code}


def _quiet_tensorflow() -> None:
    """Keep TensorFlow's C++ start-up chatter (CPU instruction hints, cuInit on CPU hosts) off the console.

    A default only: a user who sets TF_CPP_MIN_LOG_LEVEL keeps theirs; `check` shows the messages
    that matter and explains them.
    """
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _debug_setting(argv: Sequence[str]) -> bool:
    """DEBUG=1 in the environment or the --env-file (the flag is checked by main itself)."""
    from .config import debug_requested

    env_file = ".env"
    for i, arg in enumerate(argv):
        if arg == "--env-file" and i + 1 < len(argv):
            env_file = argv[i + 1]
        elif arg.startswith("--env-file="):
            env_file = arg.split("=", 1)[1]
    return "--no-debug" not in argv and debug_requested(env_file)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        return run(argv)
    except TemplateError as exc:
        if debug or getattr(exc, "show_traceback", False) or _debug_setting(argv):
            # DEBUG adds the traceback; the exit code stays the documented one.
            traceback.print_exc(file=sys.stderr)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(
            "Stopped at once (second Ctrl-C): the last saved state is kept; --resume continues from it.",
            file=sys.stderr,
        )
        return 130
