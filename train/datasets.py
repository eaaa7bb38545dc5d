"""The built-in data sets: one entry each, read by the settings check and by the loader.

An entry says what the data set is (name, image shape, class names) and how to get it: `load`
downloads the source files with `download` (the public `keras.utils.get_file`, checked against
the file's hash and cached under DATA_DIR) and returns the arrays in the Keras layout
(x_train, y_train, x_test, y_test: uint8 images, integer labels). `train.inputs.pipeline` checks every
array afterwards. To add a data set, add one `register(Dataset(...))` below (docs/extending.md).

Nothing heavy is imported here at import time: the settings check reads the names before
TensorFlow loads.
"""

from __future__ import annotations

import gzip
import pickle
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, refuse_second
from .locations import home_problem

Arrays = dict  # {"x_train", "y_train", "x_test", "y_test"} -> numpy array


@dataclass(frozen=True)
class Dataset:
    name: str  # DATASET=<name>; also the file DATA_DIR/<name>.npz that is read instead of downloading
    shape: tuple[int, int, int]  # (height, width, channels) of every image
    classes: tuple[str, ...]  # class names, in label order (label k is classes[k])
    load: Callable[[Path], Arrays]  # cache directory -> arrays in the Keras layout


DATASETS: dict[str, Dataset] = {}


def register(dataset: Dataset) -> Dataset:
    """Add a data set; a name already taken by another loader is refused (as a model's name is): a
    fork's own `mnist` would otherwise replace the built-in one without a word."""
    refuse_second("data set", dataset.name, getattr(DATASETS.get(dataset.name), "load", None), dataset.load)
    DATASETS[dataset.name] = dataset
    return dataset


def check_dataset(value: str, exists: bool = True) -> None:
    """DATASET: a registered name, npz:<file> or images:<dir> (the path must exist, unless not `exists`:
    a run's record read by a command that needs no data); else ConfigError."""
    if value in DATASETS:
        return
    kind, _, path = value.partition(":")
    if kind not in ("npz", "images") or not path:
        raise ConfigError("DATASET", value, "one of " + ", ".join(DATASETS) + ", npz:<file>, images:<dir>")
    if home := home_problem(path):
        raise ConfigError("DATASET", value, home)
    problem = _path_problem(kind, Path(path).expanduser()) if exists else None
    if problem is not None:
        raise ConfigError("DATASET", value, f"{problem[0]}; {problem[1]}")


def dataset_missing(value: str) -> str | None:
    """What keeps DATASET's file or folder from being read here (e.g. "file x.npz does not exist"), or None:
    for a run's record that is sound but whose data moved (its readers say to put the data back)."""
    kind, _, path = value.partition(":")
    if value in DATASETS or kind not in ("npz", "images") or not path:
        return None
    if home := home_problem(path):
        return home
    problem = _path_problem(kind, Path(path).expanduser())
    return problem[0] if problem else None


def _path_problem(kind: str, p: Path) -> tuple[str, str] | None:
    """(what is wrong with the npz file or image folder at `p`, the fix for a setting), or None."""
    try:
        mode = p.stat().st_mode  # stat only: a FIFO or /dev/zero given as the data is never opened
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as e:
        return f"{p} cannot be read ({e.strerror})", "check the path and its permissions"
    if kind == "npz" and not (mode is not None and stat.S_ISREG(mode)):
        if mode is None:
            what = f"file {p} does not exist"
        else:
            what = f"{p} is {_file_type(mode)}, not a " + ("file" if stat.S_ISDIR(mode) else "regular file")
        return what, "give the path of an .npz with x_train/y_train/x_test/y_test"
    if kind == "images" and not (mode is not None and stat.S_ISDIR(mode)):
        what = f"directory {p} does not exist" if mode is None else f"{p} is {_file_type(mode)}, not a directory"
        return what, "give a directory with one sub-directory per class"
    return None


def _file_type(mode: int) -> str:
    return "a file" if stat.S_ISREG(mode) else describe_file_type(mode)


def describe_file_type(mode: int) -> str:
    """'a directory', 'a FIFO (named pipe)', ... for an st_mode."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def download(url: str, file_hash: str, cache_dir: Path, subdir: str = "datasets") -> Path:
    """The file at `url`, downloaded once into cache_dir/subdir and checked against `file_hash`
    (sha256, or md5 where that is all the publisher gives); a cached copy that does not match is
    downloaded again. Network and hash failures raise (train.inputs.pipeline turns them into a DataError)."""
    import keras

    target = cache_dir / subdir
    made = [d for d in (target, *target.parents) if not d.exists()]  # deepest first
    cache_dir.mkdir(parents=True, exist_ok=True)  # get_file would use /tmp/.keras for a directory not there yet
    try:
        return Path(
            keras.utils.get_file(
                origin=url, file_hash=file_hash, cache_dir=str(cache_dir.resolve()), cache_subdir=subdir
            )
        )
    except BaseException:
        for d in made:  # a failed download leaves no empty folders behind (offline, DATA_DIR mistyped)
            try:
                d.rmdir()
            except OSError:
                break
        raise


class _ArraysOnly(pickle.Unpickler):
    """CIFAR's files are pickles: allow the numpy arrays in them and nothing that could run code."""

    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "numpy" and name in ("_reconstruct", "ndarray", "dtype", "scalar"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a data file")


def read_cifar(path: Path, folder: str, train: list[str], test: str, label_key: str) -> Arrays:
    """The python version of CIFAR-10/100 (a .tar.gz of pickled batches), read without unpacking it."""
    import numpy as np

    def batch(archive, member):
        with archive.extractfile(f"{folder}/{member}") as fh:
            d = {k.decode(): v for k, v in _ArraysOnly(fh, encoding="bytes").load().items()}
        x = np.asarray(d["data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return x, np.asarray(d[label_key], np.uint8)  # uint8, as Keras loads them (the same fingerprint)

    with tarfile.open(path, "r:gz") as archive:
        parts = [batch(archive, m) for m in train]
        x_test, y_test = batch(archive, test)
    return {
        "x_train": np.concatenate([p[0] for p in parts]),
        "y_train": np.concatenate([p[1] for p in parts]),
        "x_test": x_test,
        "y_test": y_test,
    }


def _mnist(cache_dir: Path) -> Arrays:
    import numpy as np

    path = download(
        "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz",
        "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1",
        cache_dir,
    )
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}


# The publisher's files and MD5s (github.com/zalandoresearch/fashion-mnist, README).
_FASHION = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
_FASHION_FILES = {
    "x_train": ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
    "y_train": ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
    "x_test": ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
    "y_test": ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
}


def read_idx(path: Path):
    """An IDX file (MNIST's own format, gzipped): its dimensions are in its header."""
    import numpy as np

    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3])]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def _fashion_mnist(cache_dir: Path) -> Arrays:
    return {
        k: read_idx(download(_FASHION + name, md5, cache_dir, "datasets/fashion-mnist"))
        for k, (name, md5) in _FASHION_FILES.items()
    }


def _cifar10(cache_dir: Path) -> Arrays:
    path = download(
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        cache_dir,
    )
    return read_cifar(path, "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch", "labels")


FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

register(Dataset("mnist", (28, 28, 1), tuple(str(i) for i in range(10)), _mnist))
register(Dataset("fashion_mnist", (28, 28, 1), FASHION_MNIST_CLASSES, _fashion_mnist))
register(Dataset("cifar10", (32, 32, 3), CIFAR10_CLASSES, _cifar10))
