"""Arrays in the Keras layout (x_train, y_train, x_test, y_test): read from an .npz, then checked.

Whatever gave the arrays (an .npz, a download), `check_arrays` turns them into uint8 NHWC images
and int32 labels or raises a DataError that names the file, the array and what is wrong: a
corrupt or truncated file, pixels that are not whole numbers 0..255, labels with gaps or out of
range, train and test images of different shapes. Before anything is loaded, the size every
array declares in its header is checked against the memory available (a small compressed file
can declare gigabytes of zeros), and class names are checked before they become labels.txt.
"""

from __future__ import annotations

import contextlib
import os
import stat
import unicodedata
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..datasets import describe_file_type
from ..errors import DataError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
_MEMBERS = (*NPZ_KEYS, "class_names")  # what read_npz loads of an .npz


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays a run uses (NPZ_KEYS, class_names), read in full: numpy notices a bad CRC or a short
    file only on read. Other members are never decompressed."""
    _check_npz_magic(path)
    try:
        check_npz_headers(path)
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_KEYS if k not in z.files]
            if missing:
                raise DataError(
                    f"{path}: missing array(s) {', '.join(missing)}; an .npz needs x_train, y_train, x_test, y_test (Keras layout)"
                )
            # Only the arrays a run uses: any other member (a note, a stray archive) is never decompressed.
            return {k: z[k] for k in z.files if k in _MEMBERS}
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as e:
        raise DataError(
            f"{path} is corrupt or truncated ({type(e).__name__}: {e}); replace it with a good copy"
        ) from None


def check_npz_headers(path: Path) -> None:
    """The arrays of the .npz as their .npy headers declare them, read without loading any data.

    An array of Python objects (stored as a pickle, which can run code when loaded) is refused with
    its name, and so is a file whose arrays would take more than half the memory available (the
    checks and the pipeline hold a second copy). zipfile errors propagate: the caller calls them
    corrupt.
    """
    total, arrays = 0, []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            # numpy's name for a member: `x_train.npy` or `x_train` itself (np.load reads either as x_train)
            name = info.filename.removesuffix(".npy")
            if name not in _MEMBERS:
                continue  # never read
            with archive.open(info) as fh:
                version = np.lib.format.read_magic(fh)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(fh)
            if dtype.hasobject:
                raise DataError(
                    f"{path}: {name} is an array of Python objects (dtype {dtype}, stored as a pickle, which "
                    "is never loaded: unpickling can run code); save plain arrays: uint8 images, integer "
                    "labels, class_names as strings (numpy.array(names, dtype=str))"
                )
            size = int(np.prod(shape, dtype=object)) * dtype.itemsize
            total += size
            arrays.append((size, name, shape, dtype))
    limit = available_memory() // 2
    if total > limit:
        size, name, shape, dtype = max(arrays)
        raise DataError(
            f"{path}: its arrays declare {_gb(total)} once uncompressed ({name}: {shape} {dtype}, {_gb(size)}), "
            f"more than half the {_gb(2 * limit)} of memory available; use a smaller file or more memory "
            "(a compressed file that declares more than it holds is a decompression bomb)"
        )


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int:
    """Bytes this process can still allocate: the smaller of the kernel's MemAvailable and the room
    left under a cgroup memory limit (a container's --memory), which MemAvailable does not see.

    Under a cgroup, what counts as used is its anonymous memory: the page cache it also charges
    (every file read so far) is given back under pressure, so it does not make a file "too large".
    """
    candidates = []
    kernel = _fields(meminfo)
    if "MemAvailable:" in kernel:
        candidates.append(kernel["MemAvailable:"] * 1024)
    for folder, limit_name, anon_name in (
        (cgroup, "memory.max", "anon"),  # cgroup v2
        (f"{cgroup}/memory", "memory.limit_in_bytes", "total_rss"),  # cgroup v1
    ):
        try:
            limit = int(Path(folder, limit_name).read_text())  # "max" (no limit) raises ValueError
        except (OSError, ValueError):
            continue
        anon = _fields(f"{folder}/memory.stat").get(anon_name)
        if anon is not None:
            candidates.append(limit - anon)
    if not candidates:
        candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(0, min(candidates))


def _fields(path: str) -> dict[str, int]:
    """'name value' lines of a /proc or cgroup file as {name: value}; {} when it cannot be read."""
    out = {}
    with contextlib.suppress(OSError), open(path) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
    return out


def check_class_names(where: str, names: Iterable[str], fix: str) -> tuple[str, ...]:
    """The names as a tuple, or DataError naming the first that cannot be a class name.

    Each becomes one line of labels.txt and a label in reports: it must be UTF-8 text, not empty,
    without control characters or line breaks (a newline would add a line to labels.txt and shift
    every class after it), without leading or trailing whitespace, and unique.
    """
    names = tuple(names)
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        problem = _name_problem(name)
        if problem:
            raise DataError(f"{where}: class {i} name {name!r} {problem}; {fix}")
        key = unicodedata.normalize("NFC", name)
        if key in seen:
            raise DataError(
                f"{where}: classes {seen[key]} and {i} are both named {name!r}; class names must be unique: {fix}"
            )
        seen[key] = i
    return names


def _name_problem(name: str) -> str:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if not name.strip():
        return "is empty" if not name else "is only whitespace"
    # Cc: control characters (\n, \r, \t, \x1b...); Zl/Zp: the line and paragraph separators that
    # str.splitlines also breaks on.
    bad = [c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")]
    if bad:
        return f"holds the control character {bad[0]!r}"
    if name != name.strip():
        return "has leading or trailing whitespace"
    return ""


def npz_class_names(where: str, names: np.ndarray) -> tuple[str, ...]:
    """The class_names array of an .npz: one dimension of strings (or integers), each a valid name."""
    fix = (
        "store class_names as a 1-d array of distinct, printable strings, one per class (numpy.array(names, dtype=str))"
    )
    if names.ndim != 1:
        raise DataError(f"{where}: class_names has shape {names.shape}; {fix}")
    if names.dtype.kind not in "USiu":
        raise DataError(f"{where}: class_names has dtype {names.dtype}; {fix}")
    if names.dtype.kind == "S":
        try:
            return check_class_names(where, (n.decode("utf-8") for n in names), fix)
        except UnicodeDecodeError:
            raise DataError(f"{where}: class_names holds bytes that are not UTF-8; {fix}") from None
    return check_class_names(where, (str(n) for n in names), fix)


def _check_npz_magic(path: Path) -> None:
    """An .npz is a zip archive: say what the file is instead of numpy's guess ("pickled data")."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # the open below says what is wrong
    if stat.S_ISDIR(mode):
        raise DataError(f"{path} is a directory, not a file; give the path of an .npz file (or use images:<dir>)")
    if not stat.S_ISREG(mode):
        raise DataError(
            f"{path} is {describe_file_type(mode)}, not a regular file (it is never read: it could block "
            "or never end); give the path of an .npz file"
        )
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
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
        if y.dtype.kind == "u" and y.dtype.itemsize == 8 and len(y) and int(y.max()) > np.iinfo(np.int64).max:
            # int64 would wrap these to negative numbers and the message would show labels that are not there.
            raise DataError(
                f"{where}: y_{split} has labels {int(y.min())}..{int(y.max())} (dtype uint64); labels must be "
                "class ids 0..K-1: renumber them, or remove the stray labels"
            )
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
    # Given, K is the number of class names (a data set's entry, an .npz's class_names): said, as either may be wrong.
    named = f", one per class name ({classes} names)" if num_classes else ""
    for split, y in (("train", y_train), ("test", y_test)):
        if y.min() < 0 or y.max() >= classes:
            raise DataError(f"{where}: y_{split} has labels {y.min()}..{y.max()}; expected 0..{classes - 1}{named}")
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


# What every source's arrays go through, an .npz's or an image folder's decoded ones.


def released_at_once(ds):
    """`ds` without tf.data's autotuning thread, so that dropping an iterator does not stall.

    With autotuning on, every iterator starts a thread that re-tunes the pipeline at periods doubling
    from 10 ms up to 60 s, and releasing the iterator (each epoch's end, each validation, the end of a
    decode pass) waits for that thread's next wake-up. Measured with TensorFlow 2.21 on a 2-core CPU:
    4 to 5 s added to about 4 in 10 of MNIST's 5-second epochs (such an epoch ends at 10.2 s, the sum
    of the periods so far), and the wait grows with the epoch, up to a minute. Without the thread the
    AUTOTUNE values take fixed ones (a map runs as many calls at once as the CPU has cores, at most
    16; a prefetch keeps its own buffer tuning), which is all a per-batch gather or decode needs. The
    order of the batches does not change.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


def split_indices(labels: np.ndarray, val_split: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified, seeded train/validation split; both index lists sorted (the fixed cache order)."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in range(int(labels.max()) + 1):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = min(int(round(len(idx) * val_split)), len(idx) - 1)
        val.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))
