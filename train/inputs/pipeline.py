"""Data: read and verify everything up front, then serve reproducible tf.data pipelines.

`load_data(settings)` reads a built-in data set, an `.npz` or an image directory, checks every
array / decodes every image (corruption stops the run here, with the file's name), and returns a
`DataSpec`. The per-epoch order is a numpy permutation of indices, a pure function of
(SEED, epoch, SHUFFLE_BUFFER): a resumed run rebuilds epoch e, drops `start_step` batches and sees
exactly the batches an uninterrupted run saw, whatever TensorFlow's global seed is. The decoded
uint8 examples stay in a fixed order (the cache) and each batch gathers its indices from them.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..datasets import DATASETS
from ..digest import sha256_file
from ..errors import DataError, first_line
from ..setup.hardware import compose_volume_hint
from . import images
from .arrays import (
    NPZ_KEYS,
    check_arrays,
    check_class_names,
    npz_class_names,
    read_npz,
    released_at_once,
    split_indices,
)

log = logging.getLogger("train")

SMOKE_TRAIN, SMOKE_VAL = 512, 256


class _Split(NamedTuple):
    x: Any  # uint8 (N, H, W, C): np.ndarray, np.memmap (CACHE=file), or None (CACHE=none: decode per epoch)
    y: np.ndarray  # int32 (N,)
    files: tuple[str, ...] = ()  # image paths, in the same order as y
    info: np.ndarray | None = None  # int32 (N, 2): each file's EXIF orientation and CMYK flag, for the decode


@dataclass(frozen=True)
class DataSpec:
    """What the model and the manifest need to know about the data, plus the data itself (private)."""

    name: str
    input_shape: tuple[int, int, int]
    num_classes: int
    class_names: tuple[str, ...]
    n_train: int
    n_val: int
    fingerprint: str  # sha256 of the source files' bytes (images: sorted relative paths + bytes)
    source: str
    # Where validation comes from: "train" (VAL_SPLIT of the training data), "test" (the test split,
    # runs recorded before validation was split off: VAL_FROM=test) or "images" (the image folder).
    val_from: str = "train"
    n_test: int = 0  # the held-out test split, evaluated once at the end (0: none, or it is the validation)
    _train: _Split = field(default=None, repr=False, compare=False)
    _val: _Split = field(default=None, repr=False, compare=False)
    _test: _Split | None = field(default=None, repr=False, compare=False)
    _tensors: dict = field(default_factory=dict, repr=False, compare=False)


def load_data(settings) -> DataSpec:
    """Read and verify the data set named by `settings.dataset`; DataError on any problem."""
    kind, _, arg = settings.dataset.partition(":")
    if kind == "images":
        spec = _load_images(Path(arg).expanduser(), settings)
    else:
        if kind == "npz":
            path, name = Path(arg).expanduser(), None
            arrays, fingerprint, source = read_npz(path), sha256_file(path), str(path)
        else:
            name = settings.dataset
            arrays, fingerprint, source = _builtin(name, Path(settings.data_dir))
        spec = _from_arrays(settings, arrays, fingerprint, source, name)
    log.info(
        "data: %s from %s: %s, shape %s, %d classes, fingerprint %s",
        spec.name,
        spec.source,
        split_text(spec),
        spec.input_shape,
        spec.num_classes,
        spec.fingerprint[:16],
    )
    return spec


def split_text(spec: DataSpec) -> str:
    """The split as the log gives it: where validation comes from is part of what the numbers mean."""
    where = {"train": "from train", "test": "= the test split", "images": "from the folder"}[spec.val_from]
    test = f" / {spec.n_test} test" if spec.n_test else ""
    return f"{spec.n_train} train / {spec.n_val} val ({where}){test}"


def steps_per_epoch(spec: DataSpec, batch_size: int) -> int:
    return math.ceil(spec.n_train / batch_size)


def epoch_order(n: int, seed: int, epoch: int, buffer: int = 0) -> np.ndarray:
    """The training order of epoch `epoch`: a permutation of range(n) from (seed, epoch) alone.

    buffer=0 (or >= n) is a true shuffle; a smaller buffer mimics `tf.data.Dataset.shuffle(buffer)`
    (draw at random from a window that slides over the fixed order).
    """
    rng = np.random.default_rng([seed, epoch])
    if buffer <= 0 or buffer >= n:
        return rng.permutation(n)
    window, order, draws = list(range(buffer)), np.empty(n, np.int64), rng.random(n)
    for t in range(n):
        j = int(draws[t] * len(window))
        order[t] = window[j]
        if buffer + t < n:
            window[j] = buffer + t
        else:
            window[j] = window[-1]
            window.pop()
    return order


def train_dataset(spec: DataSpec, settings, epoch: int, batch_size: int, start_step: int = 0):
    """Batches (float32 0..255 images, int32 labels) of epoch `epoch`, from batch `start_step` on."""
    order = epoch_order(spec.n_train, settings.seed, epoch, settings.shuffle_buffer)
    return _pipeline(spec, "train", order[start_step * batch_size :], batch_size)


def val_dataset(spec: DataSpec, settings, batch_size: int):
    """Validation batches in a fixed order, same element format as `train_dataset`."""
    return _pipeline(spec, "val", np.arange(spec.n_val), batch_size)


def final_test_dataset(spec: DataSpec, batch_size: int):
    """The test split's batches in a fixed order (DataError when the data set has none apart from validation)."""
    if spec._test is None:
        raise DataError(f"{spec.name} has no test split apart from its validation data")
    return _pipeline(spec, "test", np.arange(spec.n_test), batch_size)


def replica_dataset(
    spec: DataSpec,
    settings,
    which: str,
    epoch: int,
    batch_size: int,
    start_step: int = 0,
    replicas: int = 1,
    first_replica: int = 0,
    local_replicas: int = 1,
):
    """This process's share of the global batches, for `strategy.distribute_datasets_from_function`.

    Elements are (images, labels, global_count), one per local replica per step, in replica order:
    global batch k (the same batches as `train_dataset` / `val_dataset`, a pure function of
    (SEED, epoch)) is cut into `replicas` contiguous slices (sizes differ by at most one, the last
    batch may leave a replica an empty slice) and this process keeps slices first_replica ..
    first_replica + local_replicas - 1. `global_count` is the size of the whole global batch, so a
    replica's loss share is sum / global_count. Auto-sharding is off: the slicing is done here.
    """
    import tensorflow as tf

    if which == "train":
        order = epoch_order(spec.n_train, settings.seed, epoch, settings.shuffle_buffer)[start_step * batch_size :]
    else:
        order = np.arange(spec.n_val)
    if replicas == 1:  # one replica: whole batches, the same pipeline as train_dataset
        ds = _pipeline(spec, which, order, batch_size)
        ds = ds.map(lambda x, y: (x, y, tf.shape(y)[0]))
    else:
        ds = _sliced_pipeline(spec, which, order, batch_size, replicas, first_replica, local_replicas)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _sliced_pipeline(
    spec: DataSpec, which: str, order: np.ndarray, batch_size: int, replicas: int, first: int, local: int
):
    import tensorflow as tf

    split = {"train": spec._train, "val": spec._val, "test": spec._test}[which]
    shape = spec.input_shape

    def my_slices(idx):
        b = tf.shape(idx)[0]
        sizes = b // replicas + tf.cast(tf.range(replicas) < b % replicas, tf.int32)
        bounds = tf.concat([[0], tf.cumsum(sizes)], axis=0)
        ids = tf.data.Dataset.range(first, first + local)
        return ids.map(lambda r: (idx[bounds[r] : bounds[r + 1]], b))

    index_ds = tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).batch(batch_size).flat_map(my_slices)
    y_t = tf.convert_to_tensor(split.y)
    if split.x is None:  # CACHE=none: decode this replica's files only
        paths = tf.constant(np.asarray(split.files, dtype=object).astype(str))
        info = tf.constant(split.info)
        decode = images.read_and_decode(shape)

        def gather(idx):
            return tf.map_fn(
                lambda p_i: decode(p_i[0], p_i[1]),
                (tf.gather(paths, idx), tf.gather(info, idx)),
                fn_output_signature=tf.TensorSpec(shape, tf.uint8),
            )
    else:
        gather = _cached_gather(spec, which, split.x)

    ds = index_ds.map(
        lambda i, b: (tf.cast(gather(i), tf.float32), tf.gather(y_t, i), b),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return released_at_once(ds.prefetch(tf.data.AUTOTUNE))


def _pipeline(spec: DataSpec, which: str, order: np.ndarray, batch_size: int):
    import tensorflow as tf

    split = {"train": spec._train, "val": spec._val, "test": spec._test}[which]
    shape = spec.input_shape
    if split.x is None:  # CACHE=none: decode again every epoch
        images_ds = images.decode_dataset([split.files[i] for i in order], shape, split.info[order])
        labels_ds = tf.data.Dataset.from_tensor_slices(split.y[order])
        ds = tf.data.Dataset.zip(images_ds, labels_ds).batch(batch_size)
        # The decode above is the parallel part; a cast per batch is cheap, and a sequential map
        # keeps the batches in order by construction.
        ds = ds.map(lambda x, y: (tf.cast(x, tf.float32), y))
        return released_at_once(ds.prefetch(tf.data.AUTOTUNE))
    gather, y_t = _cached_gather(spec, which, split.x), tf.convert_to_tensor(split.y)
    ds = tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).batch(batch_size)
    ds = ds.map(
        lambda i: (tf.cast(gather(i), tf.float32), tf.gather(y_t, i)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return released_at_once(ds.prefetch(tf.data.AUTOTUNE))


def _cached_gather(spec: DataSpec, which: str, x):
    """gather(indices) -> the uint8 images of split `which`, cached as `x`: from the memory-mapped .npy
    (CACHE=file), or from one tensor per process, made on first use (in memory)."""
    import tensorflow as tf

    if isinstance(x, np.memmap):

        def gather(idx):
            out = tf.numpy_function(lambda i: x[np.asarray(i)], [idx], tf.uint8, stateful=False)
            return tf.ensure_shape(out, (None, *spec.input_shape))

        return gather
    if which not in spec._tensors:
        spec._tensors[which] = tf.convert_to_tensor(x)
    x_t = spec._tensors[which]
    return lambda idx: tf.gather(x_t, idx)


# --- .npz and built-in data sets -----------------------------------------------------------------


def _builtin(name: str, data_dir: Path) -> tuple[dict[str, np.ndarray], str, str]:
    path = data_dir / f"{name}.npz"
    if path.exists() or path.is_symlink():  # read_npz names what is wrong with a FIFO or a broken link
        return read_npz(path), sha256_file(path), str(path)
    cache = data_dir / "keras"
    try:
        arrays = DATASETS[name].load(cache)
    # get_file raises a bare Exception for network failures, so nothing narrower catches them all.
    except Exception as e:  # noqa: BLE001
        host = compose_volume_hint(path)  # in the container: where /data is on the host
        raise DataError(
            f"{path} not found and the download of {name} failed ({type(e).__name__}: {first_line(e) or 'no message'}); "
            f"put {name}.npz (Keras format: x_train, y_train, x_test, y_test) at {path}, or allow network access"
            + (f"; {host}" if host else "")
        ) from None
    # A fork's own loader: what it returns is read here first, where a missing array is a KeyError.
    missing = [k for k in NPZ_KEYS if k not in arrays] if isinstance(arrays, Mapping) else list(NPZ_KEYS)
    if missing:
        got = f"no array(s) {', '.join(missing)}" if isinstance(arrays, Mapping) else type(arrays).__name__
        raise DataError(
            f"the loader of {name} returned {got}; a loader returns the Keras layout, a dict of "
            "x_train, y_train, x_test, y_test (fix its register(Dataset(...)) loader)"
        )
    h = hashlib.sha256()
    for k in NPZ_KEYS:
        h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
    return arrays, h.hexdigest(), f"downloaded, cached in {cache}"


def _smoke_subset(n: int, k: int, seed: int, salt: int) -> np.ndarray:
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, salt]).choice(n, k, replace=False))


def _from_arrays(settings, arrays, fingerprint: str, source: str, builtin: str | None) -> DataSpec:
    names = npz_class_names(source, arrays["class_names"]) if "class_names" in arrays else None
    entry = DATASETS[builtin] if builtin else None
    if entry:
        names = check_class_names(builtin, entry.classes, "fix the classes of its register(Dataset(...)) entry")
    x_tr, y_tr, x_te, y_te, classes = check_arrays(source, arrays, len(names) if names else None)
    if entry and x_tr.shape[1:] != entry.shape:
        raise DataError(f"{source}: images are {x_tr.shape[1:]} but {builtin} has {entry.shape}; is it the right file?")
    if settings.val_from == "test":  # a run recorded before validation was split off: it validated on the test split
        train, val, test = _Split(x_tr, y_tr), _Split(x_te, y_te), None
    else:
        tr, va = split_indices(y_tr, settings.val_split, settings.seed)
        if settings.val_split > 0 and len(va) == 0:
            raise DataError(
                f"{source}: VAL_SPLIT={settings.val_split} of {np.bincount(y_tr).max()} examples in the largest "
                "class leaves no example for validation; raise VAL_SPLIT or add examples"
            )
        train, val, test = _Split(x_tr[tr], y_tr[tr]), _Split(x_tr[va], y_tr[va]), _Split(x_te, y_te)
    if settings.smoke:
        train, val = _subset(train, SMOKE_TRAIN, settings.seed, 0), _subset(val, SMOKE_VAL, settings.seed, 1)
        test = _subset(test, SMOKE_VAL, settings.seed, 2) if test is not None else None
    return DataSpec(
        name=settings.dataset,
        input_shape=tuple(int(d) for d in x_tr.shape[1:]),
        num_classes=classes,
        class_names=names or tuple(str(i) for i in range(classes)),
        n_train=len(train.y),
        n_val=len(val.y),
        fingerprint=fingerprint,
        source=source,
        val_from=settings.val_from,
        n_test=len(test.y) if test is not None else 0,
        _train=train,
        _val=val,
        _test=test,
    )


def _subset(split: _Split, k: int, seed: int, salt: int) -> _Split:
    """A smoke run's share of an array split (salt 0: train, 1: validation, 2: test)."""
    keep = _smoke_subset(len(split.y), k, seed, salt)
    return _Split(split.x[keep], split.y[keep])


# --- images:<dir> --------------------------------------------------------------------------------


def _load_images(root: Path, settings) -> DataSpec:
    def smoke(n: int, salt: int) -> np.ndarray:
        return _smoke_subset(n, (SMOKE_TRAIN, SMOKE_VAL)[salt], settings.seed, salt)

    names, shape, fingerprint, (tr, va) = images.read_image_dir(root, settings, smoke if settings.smoke else None)
    return DataSpec(
        name=settings.dataset,
        input_shape=shape,
        num_classes=len(names),
        class_names=names,
        n_train=len(tr[1]),
        n_val=len(va[1]),
        fingerprint=fingerprint,
        source=str(root),
        val_from="images",
        _train=_Split(*tr),
        _val=_Split(*va),
    )
