"""The `serve` sub-command of `python -m train`: its flags here, the server in server.py.

train.cli adds it through train.extras, so that dropping serving is deleting this folder and its
line there. Importing this module is cheap: Starlette, uvicorn and TensorFlow load only when
the command runs.
"""

from __future__ import annotations

import argparse
import os
import re

from ..errors import ConfigError, RunNotFound
from ..locations import found_in
from .address import listen_address

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SETTINGS = ("serve_max_batch", "serve_max_wait_ms", "serve_max_body_mb", "serve_max_pixels", "serve_drain_seconds")


def add_command(sub: argparse._SubParsersAction) -> None:
    from ..commands import add_runs_dir

    srv = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="serve a run's export over HTTP: TensorFlow Serving REST, Open Inference Protocol v2 and /predict",
    )
    srv.add_argument("run", metavar="RUN|EXPORT_DIR", help="run id, run directory, 'latest' or an export folder")
    srv.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this host only; 0.0.0.0 or :: for every interface)",
    )
    srv.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501, TF Serving's REST port)")
    srv.add_argument("--model-name", default="model", help="the name in the URLs, /v1/models/NAME (default model)")
    add_runs_dir(srv)
    for name in SETTINGS:  # also SERVE_... in .env or the environment; parsed and checked by train.config
        srv.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar=name.upper())


def _run_of(args: argparse.Namespace, settings):
    """The run to serve. `latest`: the newest run with an export, else the newest with weights (its
    line then says which export command makes one); a store's run comes into the staging copy first.
    A path that is no run anywhere is named as given, not as a run missing from RUNS_DIR."""
    from ..commands import resolve
    from ..run.find import EXPORT, WEIGHTS

    try:
        return resolve(args, settings, needs=(EXPORT, WEIGHTS))
    except RunNotFound:
        if os.sep not in args.run:
            raise
        what = (
            "does not exist"
            if not os.path.exists(args.run)
            else "is neither a run (no config.json) nor an export (no savedmodel/)"
        )
        raise RunNotFound(
            f"{args.run} {what}: give a run id, `latest`, a run directory or an export folder (RUN/export)"
        ) from None


def run(args: argparse.Namespace) -> int:
    import logging
    import sys
    from pathlib import Path

    from ..config import READ_BY_RUNS_COMMANDS, load_settings
    from ..extras import require

    host = listen_address(args.host)
    if not NAME.fullmatch(args.model_name):
        raise ConfigError("--model-name", args.model_name, "letters, digits, '.', '-' and '_', at most 64 characters")
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", args.port, "a port number 0..65535 (0: any free port)")
    require("serve", "serve", args.run)  # the training image and install have no server: say how to get one
    settings = load_settings(
        {"runs_dir": args.runs_dir, **{name: getattr(args, name) for name in SETTINGS}},
        env_file=args.env_file,
        warn=lambda line: print(line, file=sys.stderr),
        only=READ_BY_RUNS_COMMANDS | set(SETTINGS),  # its flags, which SERVE_* in .env set too
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The training log's format, for the server's lines and uvicorn's alike (train.serve.server)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    from .model import find_export
    from .server import serve

    target = Path(args.run)
    if (target / "savedmodel").is_dir():
        model = find_export(target, None, args.model_name, settings.runs_dir)
    else:
        run_dir = _run_of(args, settings)
        model = find_export(None, run_dir, args.model_name, found_in(settings.runs_dir, run_dir))
    return serve(model, host, args.port, settings)
