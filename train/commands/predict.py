"""`python -m train predict`: class and probability for image files, from a run's best weights."""

from __future__ import annotations

import argparse
import sys

from ..errors import DataError
from . import add_run, add_runs_dir, resolve


def add_command(sub: argparse._SubParsersAction) -> None:
    pred = sub.add_parser("predict", allow_abbrev=False, help="print class and probability for image files")
    add_run(pred)
    pred.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF or BMP)")
    add_runs_dir(pred)


def run(args: argparse.Namespace) -> int:
    from ..run.find import WEIGHTS_OR_EXPORT

    run_dir = resolve(args, needs=(WEIGHTS_OR_EXPORT,))
    from ..results.predict import format_predictions, predict_files

    rows = predict_files(run_dir, args.images)
    if any("error" not in r for r in rows):
        print(format_predictions(rows))
    by_kind: dict[str, list[str]] = {}
    for r in rows:
        if r.get("converted"):
            by_kind.setdefault(r["converted"], []).append(r["file"])
    for kind, files in by_kind.items():  # once a kind of conversion: the answers are right, but say why
        more = f" and {len(files) - 1} more" if len(files) > 1 else ""
        print(
            f"note: {files[0]}{more} converted to the model's input as training decodes images ({kind})",
            file=sys.stderr,
        )
    bad = [r["error"] for r in rows if "error" in r]
    for exc in bad:  # each bad file is one line; the others are still predicted
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return DataError.exit_code if bad else 0
