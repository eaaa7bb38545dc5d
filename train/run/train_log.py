"""Console + train.log: the same lines in both, one format for every process of a run."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

log = logging.getLogger("train")


def setup_logging(log_file: Path | None, prefix: str = "") -> None:
    """One format for the console and train.log; replaces handlers from an earlier run in-process.

    `prefix` tells workers apart when several processes train together ("[worker 1] ")."""
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(message)s", "%Y-%m-%d %H:%M:%S")
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    log.addHandler(console)
    if log_file is not None:
        fh = logging.FileHandler(log_file, encoding="utf-8")
        fh.setFormatter(fmt)
        log.addHandler(fh)
    log.setLevel(logging.INFO)
    log.propagate = False


def close_logging() -> None:
    for h in list(log.handlers):
        h.flush()
        if isinstance(h, logging.FileHandler):
            log.removeHandler(h)
            h.close()
