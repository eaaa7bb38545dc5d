"""`python -m train reproduce`: rerun a run from its own record, here or in its image, and say whether it matches."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ReproduceMismatch
from . import add_run, add_runs_dir, resolve, runs_settings, upload


def add_command(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "reproduce", allow_abbrev=False, help="rerun a run from its own record and say whether it matches"
    )
    add_run(rep)
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
    add_runs_dir(rep)


def run(args: argparse.Namespace) -> int:
    settings = runs_settings(args)
    run_dir = resolve(args, settings, checkpoints=True)
    from ..reproduce.rerun import format_verdict, reproduce
    from ..run.manifest import project_root

    image = _image_options(args) if args.container else None
    # Nothing is written into the run reproduced (only read), so nothing of it is uploaded: its staging copy may
    # hold older files of a run another machine now trains.
    verdict = reproduce(
        run_dir, project_root(), allow_dirty=args.allow_dirty, epochs=args.epochs, image=image, settings=settings
    )
    print(format_verdict(verdict))
    if verdict.rerun:
        # The rerun is a run of RUNS_DIR written into its staging copy: it goes to the store, with its
        # reproduce.json, like any run; after the verdict is shown, which a failing store cannot hide.
        upload(settings, run_dir.parent / verdict.rerun)
    return 0 if verdict.match else ReproduceMismatch.exit_code


def _image_options(args: argparse.Namespace):
    from ..reproduce.image import ImageOptions

    return ImageOptions(
        Path(args.data_dir),
        args.target or "",
        os.environ.get("IMAGE", "tf-train-template"),
        args.base_image,
        args.ca_bundle,
        args.network,
        os.environ.get("DOCKER", "docker"),
    )
