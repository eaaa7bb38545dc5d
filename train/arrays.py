"""Arrays in the Keras layout (x_train, y_train, x_test, y_test): read from an .npz, then checked.

Whatever gave the arrays (an .npz, a download), `check_arrays` turns them into uint8 NHWC images
and int32 labels or raises a DataError that names the file, the array and what is wrong: a
corrupt or truncated file, pixels that are not whole numbers 0..255, labels with gaps or out of
range, train and test images of different shapes.
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import DataError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file, read in full: numpy notices a bad CRC or a short file only on read."""
    _check_npz_magic(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_KEYS if k not in z.files]
            if missing:
                raise DataError(
                    f"{path}: missing array(s) {', '.join(missing)}; an .npz needs x_train, y_train, x_test, y_test (Keras layout)"
                )
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as e:
        raise DataError(
            f"{path} is corrupt or truncated ({type(e).__name__}: {e}); replace it with a good copy"
        ) from None


def _check_npz_magic(path: Path) -> None:
    """An .npz is a zip archive: say what the file is instead of numpy's guess ("pickled data")."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except IsADirectoryError:
        raise DataError(
            f"{path} is a directory, not a file; give the path of an .npz file (or use images:<dir>)"
        ) from None
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror}); check the path and its permissions") from None
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return
    if not head:
        what = "it is empty"
    elif head.startswith(b"\x93NUMPY"):
        what = "it is a single .npy array"
    elif all(32 <= c < 127 or c in b"\t\r\n" for c in head):
        what = f"it is text ({head[:24].decode('ascii').strip()!r}...)"
    else:
        what = "it does not start like a zip archive"
    raise DataError(
        f"{path} is not an .npz file ({what}); save the arrays with "
        "numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
    )


def check_arrays(where: str, arrays: dict[str, np.ndarray], num_classes: int | None) -> tuple:
    """(x_train, y_train, x_test, y_test, num_classes) as uint8 NHWC / int32, or DataError."""
    out = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim == 3:
            x = x[..., None]
        if x.ndim != 4 or x.shape[-1] not in (1, 3) or len(x) == 0:
            raise DataError(f"{where}: x_{split} has shape {x.shape}; expected (N, H, W) or (N, H, W, 1|3) with N > 0")
        if x.dtype != np.uint8:
            if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
                raise DataError(f"{where}: x_{split} has dtype {x.dtype}; expected uint8 pixel values 0..255")
            if not (np.all(np.isfinite(x)) and x.min() >= 0 and x.max() <= 255 and np.all(x == np.round(x))):
                raise DataError(
                    f"{where}: x_{split} holds values outside whole numbers 0..255; store raw uint8 pixels (the model rescales)"
                )
            x = x.astype(np.uint8)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]  # cifar10 keeps labels as (N, 1)
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise DataError(
                f"{where}: y_{split} has shape {y.shape} and dtype {y.dtype}; expected integer class ids of shape (N,)"
            )
        if len(y) != len(x):
            raise DataError(f"{where}: x_{split} has {len(x)} examples but y_{split} has {len(y)}")
        out += [x, y.astype(np.int64)]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise DataError(f"{where}: x_train images are {out[0].shape[1:]} but x_test images are {out[2].shape[1:]}")
    classes = _check_labels(where, out[1], out[3], num_classes)
    return out[0], out[1].astype(np.int32), out[2], out[3].astype(np.int32), classes


def _check_labels(where: str, y_train: np.ndarray, y_test: np.ndarray, num_classes: int | None) -> int:
    """The number of classes K: labels must be 0..K-1 with every class in y_train, and K >= 2.

    Checked on the labels found (np.unique), never by allocating K of anything: one stray label of
    1,000,000 must be named, not turned into a million-class model.
    """
    found = np.unique(y_train)
    classes = num_classes or int(max(found[-1], y_test.max())) + 1
    for split, y in (("train", y_train), ("test", y_test)):
        if y.min() < 0 or y.max() >= classes:
            raise DataError(f"{where}: y_{split} has labels {y.min()}..{y.max()}; expected 0..{classes - 1}")
    if classes < 2:
        raise DataError(f"{where}: a single class (every label is 0); a classifier needs at least two")
    if len(found) < classes:
        bounds = np.concatenate([[-1], found, [classes]])  # the gaps between the labels found
        missing = [(int(x) + 1, int(y) - 1) for x, y in zip(bounds[:-1], bounds[1:]) if y - x > 1]
        raise DataError(
            f"{where}: y_train has no example of class {_ranges(missing)} (labels found: "
            f"{_ranges(_runs(found))}); labels must be 0..K-1 with every class present: renumber them, "
            "or remove the stray labels"
        )
    return classes


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct values as (first, last) runs of consecutive numbers."""
    breaks = np.flatnonzero(np.diff(values) != 1)
    starts, ends = np.concatenate([[0], breaks + 1]), np.concatenate([breaks, [len(values) - 1]])
    return [(int(values[i]), int(values[j])) for i, j in zip(starts, ends)]


def _ranges(runs: list[tuple[int, int]], limit: int = 4) -> str:
    """[(0, 3), (9, 9), (12, 40)] -> '0..3, 9, 12..40' (at most `limit` runs, then '...')."""
    text = [f"{a}..{b}" if b > a else str(a) for a, b in runs[:limit]]
    return ", ".join(text + (["..."] if len(runs) > limit else []))
