"""The sha256 of a file, read in 4 MB chunks: the one fingerprint of data files, weights, locks and
exports (a module of its own, below every other, because each of those layers needs it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path | str) -> str:
    with open(path, "rb") as fh:
        return sha256_fd(fh.fileno())


def sha256_fd(fd: int) -> str:
    """The sha256 of what an open file descriptor holds from its current offset (left open)."""
    h = hashlib.sha256()
    for chunk in iter(lambda: os.read(fd, 1 << 22), b""):
        h.update(chunk)
    return h.hexdigest()
