"""`python -m train predict`: class and probability for image files, from a run's best weights."""

from __future__ import annotations

import argparse
import sys

from ..errors import DataError
from ..locations import found_in
from . import add_run, add_runs_dir, resolve, runs_settings


def add_command(sub: argparse._SubParsersAction) -> None:
    pred = sub.add_parser("predict", allow_abbrev=False, help="print class and probability for image files")
    add_run(pred)
    pred.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF or BMP)")
    add_runs_dir(pred)


def run(args: argparse.Namespace) -> int:
    from ..run.find import WEIGHTS_OR_EXPORT

    settings = runs_settings(args)
    run_dir = resolve(args, settings, needs=(WEIGHTS_OR_EXPORT,))
    from ..results.predict import format_predictions, predict_files

    rows = predict_files(run_dir, args.images, found_in(settings.runs_dir, run_dir))
    if any("error" not in r for r in rows):
        print(format_predictions(rows))
    _say_conversions(rows)
    bad = [r["error"] for r in rows if "error" in r]
    for exc in bad:  # each bad file is one line; the others are still predicted
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return DataError.exit_code if bad else 0


def _say_conversions(rows: list[dict]) -> None:
    """One note for each kind of conversion (the colours from and to; sizes vary from photo to photo):
    the answers are right, but the user should know the images were not what the model takes."""
    from ..results.predict import printable

    by_kind: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("converted"):
            by_kind.setdefault(r["converted"].split(" ", 1)[1], []).append(r)
    for same in by_kind.values():
        more = f" and {len(same) - 1} more" if len(same) > 1 else ""
        what = same[0]["converted"] if len(same) == 1 else f"e.g. {same[0]['converted']}"
        print(
            f"note: {printable(same[0]['file'])}{more} converted to the model's input as training decodes images ({what})",
            file=sys.stderr,
        )
