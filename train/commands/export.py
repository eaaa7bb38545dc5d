"""`python -m train export`: a run's best weights as SavedModel + .keras + labels, reloaded and compared."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..config import Settings, load_settings
from ..extras import require_section
from . import add_run, add_runs_dir, resolve, uploaded, warn

# The formats extra's settings, when this template has it (train/formats/): its flags are added with them.
FORMAT_FLAGS = {"export_formats", "export_quantize"} <= {f.name for f in fields(Settings)}


def add_command(sub: argparse._SubParsersAction) -> None:
    exp = sub.add_parser(
        "export", allow_abbrev=False, help="export a run's best weights as SavedModel + .keras + labels"
    )
    add_run(exp)
    add_runs_dir(exp)
    if FORMAT_FLAGS:
        exp.add_argument("--format", default=None, help="savedmodel,litert,onnx (default: EXPORT_FORMATS)")
        exp.add_argument("--quantize", default=None, help="none | dynamic | int8: also a quantised LiteRT file")


def run(args: argparse.Namespace) -> int:
    # The export's own flags go through the settings' validation, like the same settings in .env.
    flags = {"export_formats": args.format, "export_quantize": args.quantize} if FORMAT_FLAGS else {}
    settings = load_settings({"runs_dir": args.runs_dir, **flags}, env_file=args.env_file, warn=warn, check_model=False)
    require_section("onnx", settings)  # ONNX's converter, when EXPORT_FORMATS asks for it
    from ..results.export import export_run, other_formats
    from ..run.find import WEIGHTS
    from ..run.lock import RunLock

    if (formats := other_formats(settings)) is not None:  # their runtimes, named as the user gave them
        given = getattr(args, "format", None) is not None
        formats.check("--format" if given else "EXPORT_FORMATS", settings.export_formats)
    run_dir = resolve(args, settings, needs=(WEIGHTS,))

    with uploaded(settings, run_dir), RunLock(run_dir):  # never while a fit writes the same run
        report = export_run(run_dir, settings=settings)
    print(f"exported {report['savedmodel']} (max |diff| {report['max_abs_diff']:.2e})")
    for fmt, record in report.get("formats", {}).items():
        done = "kept (the same weights)" if record.get("kept") else "exported"
        print(
            f"{done} {fmt}: {record['file']} ({record['bytes'] / 1e6:.2f} MB, max |diff| {record['max_abs_diff']:.2e})"
        )
    return 0
