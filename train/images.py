"""`images:<dir>`: one sub-directory per class of image files, decoded once, up front.

Listing, fingerprinting, the train/validation split, decoding and the decode cache live here;
`train.data` wraps the result in a DataSpec and builds the pipelines. Every file is decoded before
training starts (a broken file stops the run with its name, not an hour in), and that same pass
fills the cache: a uint8 array in memory, or a `.npy` memory-mapped from disk.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .rundir import CACHE_DIR, atomic_write, shared_writes

log = logging.getLogger("train")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# GIF: the first frame. What a message says the supported formats are.
SUPPORTED = "JPEG, PNG, GIF (first frame) or BMP"
_DECODE_BATCH = 256
# Decoded images kept for the life of the process, keyed by what they were decoded from: a second
# load_data (or a rebuilt pipeline) never decodes again.
_DECODED: dict[str, np.ndarray] = {}


def list_image_dir(root: str | os.PathLike) -> tuple[tuple[str, ...], list[str], np.ndarray]:
    """(class names, sorted relative paths, int32 labels); DataError when there is nothing to train on.

    Links are followed (a class folder may be assembled from links to files or folders), but each
    real file counts once and in one class only: a link back to a folder that contains it (a loop),
    or one file reachable from two classes, is an error naming both paths. Names starting with "."
    (.git, .ipynb_checkpoints, ...) are skipped.
    """
    root = Path(root)
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(
            f"{root}: no class sub-directories; put the images in one sub-directory per class, e.g. {root}/cats/001.jpg"
        )
    rels: list[str] = []
    labels: list[int] = []
    owner: dict[tuple[int, int], tuple[str, str]] = {}  # real file -> (its path, its class)
    for label, name in enumerate(classes):
        found: list[str] = []
        for path, key in sorted(_walk_class(root / name)):
            if key in owner:
                first, first_class = owner[key]
                if first_class != name:
                    raise DataError(
                        f"{first} (class {first_class}) and {path} (class {name}) are the same file; an image "
                        "belongs to one class only: remove one of them (or the link that leads to it)"
                    )
                continue  # the same file twice in one class (links): counted once
            owner[key] = (path, name)
            found.append(os.path.relpath(path, root))
        if not found:
            raise DataError(
                f"{root / name}: class directory has no images ({SUPPORTED}); add some or remove the directory"
            )
        rels += found
        labels += [label] * len(found)
    if len(classes) < 2:
        raise DataError(f"{root}: only one class sub-directory ({classes[0]}); a classifier needs at least two")
    return tuple(classes), rels, np.asarray(labels, np.int32)


def _walk_class(top: Path):
    """(path, (device, inode)) of every image file under `top`, following links but never around a loop."""
    chain = [os.path.realpath(top)]  # real paths of the folders from `top` down to the current one

    def walk(directory: str):
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise DataError(f"{directory}: cannot read the folder ({exc.strerror}); fix its permissions") from None
        for e in entries:
            if e.name.startswith("."):
                continue
            if e.is_dir():
                real = os.path.realpath(e.path)
                inside = real.rstrip(os.sep) + os.sep
                if any(c == real or c.startswith(inside) for c in chain):
                    raise DataError(
                        f"{e.path} links to {real}, a folder that contains it: the images would be "
                        "read round a loop; remove the link"
                    )
                chain.append(real)
                yield from walk(e.path)
                chain.pop()
            elif e.name.lower().endswith(IMAGE_EXTENSIONS):
                try:
                    st = e.stat()
                except OSError as exc:
                    why = f"a broken link ({os.readlink(e.path)!r} does not exist)" if e.is_symlink() else exc.strerror
                    raise DataError(f"{e.path}: {why}; fix or remove it") from None
                yield e.path, (st.st_dev, st.st_ino)

    yield from walk(str(top))


def fingerprint_files(root: str | os.PathLike, rels: Sequence[str]) -> str:
    """sha256 over the sorted relative paths and each file's bytes (files hashed in parallel)."""
    root = Path(root)

    def digests(chunk: Sequence[str]) -> list[bytes]:
        out = []
        for rel in chunk:
            with open(root / rel, "rb") as fh:
                out.append(hashlib.sha256(fh.read()).digest())
        return out

    # Chunks of files per task: one task per small file costs more than hashing it.
    chunks = [rels[i : i + 128] for i in range(0, len(rels), 128)]
    outer = hashlib.sha256()
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        for chunk, found in zip(chunks, pool.map(digests, chunks)):
            for rel, digest in zip(chunk, found):
                outer.update(rel.replace(os.sep, "/").encode() + b"\0" + digest)
    return outer.hexdigest()


def decode_tensor(contents, input_shape: tuple[int, int, int]):
    """Encoded image bytes -> uint8 (H, W, C): the one decode/resize used by training and predict."""
    import tensorflow as tf

    height, width, channels = input_shape
    image = _decode(contents, channels)
    # Shrinking: "area" averages every source pixel (no aliasing) at a third of the cost of
    # bilinear with antialias=True; growing: bilinear.
    shrink = tf.logical_and(tf.shape(image)[0] >= height, tf.shape(image)[1] >= width)
    image = tf.cond(
        shrink,
        lambda: tf.image.resize(image, (height, width), method="area"),
        lambda: tf.image.resize(image, (height, width), method="bilinear"),
    )
    image = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
    image.set_shape(input_shape)
    return image


def _decode(contents, channels: int):
    """JPEG, PNG, GIF (first frame) or BMP bytes -> uint8 (H, W, channels)."""
    import tensorflow as tf

    if channels != 1:
        return tf.io.decode_image(contents, channels=channels, expand_animations=False)
    # TensorFlow's GIF and BMP decoders only give colour: decode those as RGB and convert, so a
    # grayscale model takes them too. JPEG and PNG keep their own grayscale decode.
    head = tf.strings.substr(contents, 0, 2)
    colour_only = tf.logical_or(tf.equal(head, b"GI"), tf.equal(head, b"BM"))
    return tf.cond(
        colour_only,
        lambda: tf.image.rgb_to_grayscale(tf.io.decode_image(contents, channels=3, expand_animations=False)),
        lambda: tf.io.decode_image(contents, channels=1, expand_animations=False),
    )


def load_image_file(path: str | os.PathLike, input_shape: tuple[int, int, int]) -> np.ndarray:
    """One file as uint8 (H, W, C), decoded and resized exactly as the training pipeline does."""
    import tensorflow as tf

    if Path(path).is_dir():
        raise DataError(f"{path} is a directory, not an image file; give the image files ({SUPPORTED})")
    if not Path(path).exists():
        raise DataError(f"{path} does not exist" + (" (a broken link)" if Path(path).is_symlink() else ""))
    try:
        return decode_tensor(tf.io.read_file(str(path)), tuple(input_shape)).numpy()
    except (tf.errors.OpError, ValueError) as e:
        raise DataError(
            f"{path}: not a readable image ({_first_line(e)}); the formats read are {SUPPORTED}: convert or remove it"
        ) from None


def decode_dataset(paths: Sequence[str], input_shape: tuple[int, int, int]):
    """A tf.data pipeline of uint8 images for `paths`, decoded in parallel, in the order given."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(np.asarray(paths, dtype=object).astype(str))
    return ds.map(
        lambda p: decode_tensor(tf.io.read_file(p), input_shape),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def decode_files(paths: Sequence[str], input_shape: tuple[int, int, int], out: np.ndarray | None = None) -> None:
    """Decode every file (in parallel, with tf.data) into `out` (N, H, W, C) uint8, or only check them.

    A file that is missing or not an image raises DataError naming it.
    """
    import tensorflow as tf

    batches = decode_dataset(paths, input_shape).batch(_DECODE_BATCH).prefetch(2)
    done = 0
    try:
        for batch in batches:
            n = int(batch.shape[0])
            if out is not None:
                out[done : done + n] = batch.numpy()
            done += n
    except tf.errors.OpError as e:
        # With deterministic=True the error surfaces at the batch holding the file: find it there.
        for path in paths[done : done + _DECODE_BATCH]:
            load_image_file(path, input_shape)
        raise DataError(
            f"decoding images {done}..{done + _DECODE_BATCH} of {len(paths)} failed ({_first_line(e)})"
        ) from None


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


def read_image_dir(root: Path, settings, subset: Callable[[int, int], np.ndarray] | None = None):
    """(class names, input shape, fingerprint, [(x, y, files) of train, of val]), every file decoded.

    `subset(n, salt)` (salt 0: train, 1: val) picks the indices a smoke run keeps.
    """
    class_names, rels, labels = list_image_dir(root)
    fingerprint = fingerprint_files(root, rels)
    tr, va = split_indices(labels, settings.val_split, settings.seed)
    if settings.val_split > 0 and len(va) == 0:
        raise DataError(
            f"{root}: VAL_SPLIT={settings.val_split} of {np.bincount(labels).min()} images in the smallest "
            "class leaves no image for validation; raise VAL_SPLIT or add images"
        )
    if subset is not None:
        tr, va = tr[subset(len(tr), 0)], va[subset(len(va), 1)]
    shape = (settings.image_size, settings.image_size, settings.channels)
    splits: list[tuple[Any, np.ndarray, tuple[str, ...]]] = []
    for which, idx in (("train", tr), ("val", va)):
        files = tuple(str(root / rels[i]) for i in idx)
        key = hashlib.sha256(repr((fingerprint, which, shape, idx.tolist())).encode()).hexdigest()[:16]
        splits.append((decode_cached(files, shape, key, settings, fingerprint), labels[idx], files))
    return class_names, shape, fingerprint, splits


def decode_cached(files: tuple[str, ...], shape, key: str, settings, fingerprint: str):
    """Decode (and so verify) every file once, into the cache CACHE asks for."""
    if settings.cache == "none":
        decode_files(files, shape)
        return None
    if settings.cache == "memory":
        if key not in _DECODED:
            out = np.empty((len(files), *shape), np.uint8)
            decode_files(files, shape, out)
            _DECODED[key] = out
        return _DECODED[key]
    # file: same fingerprint, shape and split -> already decoded and verified by an earlier run
    path = Path(settings.runs_dir) / CACHE_DIR / fingerprint[:16] / f"{key}.npy"
    if path.is_file():
        try:
            cached = np.load(path, mmap_mode="r")
            if cached.shape == (len(files), *shape) and cached.dtype == np.uint8:
                return cached
        except (ValueError, OSError):
            pass  # a damaged cache is rebuilt below

    def write(tmp: Path) -> None:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(files), *shape))
        decode_files(files, shape, out)
        out.flush()
        del out  # unmapped before atomic_write syncs and renames it

    # Other runs sharing RUNS_DIR may fill the same cache folder at the same time.
    with shared_writes(path.parent) as removed:
        for p in removed:
            log.info("removed a temp file left by an interrupted cache write: %s", p)
        # size_hint: a full disk is refused up front; a memory-mapped write into it would die of SIGBUS.
        atomic_write(path, write, size_hint=len(files) * int(np.prod(shape)) + (1 << 16))
    return np.load(path, mmap_mode="r")


def _first_line(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e)
    # TensorFlow wraps op errors as "{{function_node ...}} what went wrong [Op:DecodeImage] name: ".
    text = re.sub(
        r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*$", "", text.strip().splitlines()[0] if text.strip() else ""
    )
    return text[:200] or type(e).__name__
