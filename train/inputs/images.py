"""`images:<dir>`: one sub-directory per class of image files, decoded once, up front.

Listing, fingerprinting, the checks of the split, decoding and the decode cache live here;
`train.inputs.pipeline` wraps the result in a DataSpec and builds the pipelines. Every file is decoded before
training starts (a broken file stops the run with its name, not an hour in), and that same pass
fills the cache: a uint8 array in memory, or a `.npy` memory-mapped from disk. Before that, the
fingerprint pass reads each file's header (PIL, no pixels decoded): an image that declares more
than MAX_IMAGE_PIXELS is refused before it can take gigabytes to decode. The decode applies the
EXIF orientation, as a photo viewer shows the image.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Settings
from ..datasets import describe_file_type
from ..digest import sha256_file
from ..errors import DataError, first_line
from ..run.files import atomic_write, shared_writes
from ..run.remote import local_dir
from ..run.rundir import CACHE_DIR
from .arrays import check_class_names, released_at_once, split_indices

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
    (.git, .ipynb_checkpoints, ...) are skipped; other files not named as an image (.webp, .txt, ...)
    are skipped with one warning that counts them.
    """
    root = Path(root)
    try:
        entries = [e for e in root.iterdir() if not e.name.startswith(".")]
        classes = sorted(e.name for e in entries if e.is_dir())
    except OSError as exc:
        raise DataError(f"{root}: cannot read the folder ({exc.strerror}); fix its permissions") from None
    check_class_names(str(root), classes, "class names are the sub-directory names: rename the folder")
    if not classes:
        raise DataError(
            f"{root}: no class sub-directories; put the images in one sub-directory per class, e.g. {root}/cats/001.jpg"
        )
    rels: list[str] = []
    labels: list[int] = []
    owner: dict[tuple[int, int], tuple[str, str]] = {}  # real file -> (its path, its class)
    skipped: list[str] = []  # files of the class folders that are not named as an image
    for label, name in enumerate(classes):
        found: list[str] = []
        for path, key in sorted(_walk_class(root / name, skipped)):
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
    _warn_left_out(root, skipped, sorted(e.name for e in entries if not e.is_dir()))
    return tuple(classes), rels, np.asarray(labels, np.int32)


def _warn_left_out(root: Path, skipped: list[str], loose: list[str]) -> None:
    """One warning line for the files of the class folders not named as images, one for the files
    beside the class folders (in no class): neither is trained on."""
    if skipped:
        log.warning(
            "WARNING: %s: %d file(s) skipped, not named as %s (e.g. %s); convert the images among them to train on them",
            root,
            len(skipped),
            SUPPORTED,
            sorted(skipped)[0],
        )
    if loose:
        log.warning(
            "WARNING: %s: %d file(s) beside the class sub-directories, in no class, are not used (e.g. %s); "
            "move each into the sub-directory of its class",
            root,
            len(loose),
            root / loose[0],
        )


def _walk_class(top: Path, skipped: list[str]):
    """(path, (device, inode)) of every image file under `top`, following links but never around a loop;
    the paths of the other files are added to `skipped`."""
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
                if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
                    raise DataError(
                        f"{e.path} is {describe_file_type(st.st_mode)}, not an image file; remove it from the folder"
                    )
                yield e.path, (st.st_dev, st.st_ino)
            else:
                skipped.append(e.path)

    yield from walk(str(top))


def scan_files(root: str | os.PathLike, rels: Sequence[str], max_pixels: int | None) -> tuple[str, np.ndarray]:
    """(fingerprint, info): the one pass that reads every file, in parallel.

    The fingerprint is sha256 over the sorted relative paths and each file's bytes; info holds the
    (EXIF orientation, CMYK) of each file, from its header, for the decode. With `max_pixels`, an
    image whose header declares more is refused here, before anything decodes it.
    """
    root = Path(root)

    def read(chunk: Sequence[str]) -> list[tuple[bytes, tuple[int, int]]]:
        out = []
        for rel in chunk:
            raw = read_image_bytes(root / rel)
            out.append((hashlib.sha256(raw).digest(), image_info(raw, root / rel, max_pixels)))
        return out

    # Chunks of files per task: one task per small file costs more than hashing it.
    chunks = [rels[i : i + 128] for i in range(0, len(rels), 128)]
    outer = hashlib.sha256()
    info = np.ones((len(rels), 2), np.int32)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
        for start, found in zip(range(0, len(rels), 128), pool.map(read, chunks)):
            for i, (digest, file_info) in enumerate(found, start):
                outer.update(rels[i].replace(os.sep, "/").encode() + b"\0" + digest)
                info[i] = file_info
    return outer.hexdigest(), info


def read_image_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of an image file, or DataError naming it (no permission, a FIFO, gone)."""
    try:
        mode = os.stat(path).st_mode  # before opening: opening a FIFO blocks until someone writes to it
        if not stat.S_ISREG(mode):  # a directory too: describe_file_type says "a directory"
            raise DataError(
                f"{path} is {describe_file_type(mode)}, not an image file; give the image files ({SUPPORTED})"
            )
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist" + (" (a broken link)" if Path(path).is_symlink() else "")) from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror}); fix its permissions") from None


_ORIENTATION = 0x0112  # the EXIF tag: how the camera was held, 1 (upright) .. 8


def image_info(raw: bytes, path: str | os.PathLike, max_pixels: int | None, fix: str | None = None) -> tuple[int, int]:
    """(EXIF orientation 1..8, 1 if CMYK else 0) of an encoded image, from its header only (PIL).

    DataError when the header declares more than `max_pixels` (width x height, times the frames of a
    GIF: TensorFlow decodes them all to keep the first), ending with `fix` (default: shrink it or
    raise MAX_IMAGE_PIXELS, for a reader whose limit is that setting), and when a JPEG is cut short or
    damaged. Any other file PIL cannot parse gets (1, 0) and is left to the decoder, whose error names it.
    """
    from PIL import Image

    # MAX_IMAGE_PIXELS (checked below, for every image) is the limit; PIL's own process-wide default
    # would warn, or refuse with its own message, on other terms.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(io.BytesIO(raw)) as im:
            (width, height), frames = im.size, _frames(im)
            if im.format == "PNG":  # PIL's getexif would decode a PNG whose eXIf chunk is not up front
                exif = Image.Exif()
                if im.info.get("exif"):
                    exif.load(im.info["exif"])
            else:
                exif = im.getexif()
            orientation, cmyk = int(exif.get(_ORIENTATION, 1)), int(im.mode == "CMYK")
    except Exception:  # noqa: BLE001  (PIL raises many types for files it cannot parse)
        _check_jpeg_whole(raw, path)  # a JPEG cut inside its header
        return 1, 0
    pixels = width * height * frames
    if max_pixels is not None and pixels > max_pixels:
        shown = f"{frames} frames of {width}x{height}" if frames > 1 else f"{width}x{height}"
        raise DataError(
            f"{path}: {shown} is {_pixels_text(pixels)}, more than MAX_IMAGE_PIXELS={max_pixels:,} "
            f"(decoding it would take about {_bytes_text(pixels * 3)}); "
            + (fix or "shrink the image (it is resized to IMAGE_SIZE anyway) or raise MAX_IMAGE_PIXELS")
        )
    _check_jpeg_whole(raw, path)
    return (orientation if 1 <= orientation <= 8 else 1), cmyk


def _pixels_text(pixels: int) -> str:
    """Millions where they are many; a limit set below a million is shown an exact count, never "0 million"."""
    return f"{pixels / 1e6:,.0f} million pixels" if pixels >= 1_000_000 else f"{pixels:,} pixels"


def _bytes_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if size >= scale / 10:  # "0.1 GB" at least, never "0.0 GB"
            return f"{size / scale:.1f} {unit}"
    return f"{size / 1e3:.1f} kB"


_EXIF_END = 2 + 65_537  # after the start marker, the most an APP1 segment (EXIF and its thumbnail) can hold


def _check_jpeg_whole(raw: bytes, path: str | os.PathLike) -> None:
    """DataError when a JPEG (by its first bytes) cannot be decoded whole: cut short, or damaged.

    TensorFlow refuses such a file too, but its libjpeg first writes its own line to stderr from C
    ("Improper call to JPEG library in state 201", "Premature end of JPEG data"), which no log
    level hides. A whole JPEG has its end-of-image marker (FF D9) at its end or, when a camera appends
    data after the image, somewhere past its headers (in the pixel data FF is never followed by D9):
    only a file without one is decoded here, by PIL, whose libjpeg prints nothing. Past its headers:
    an EXIF thumbnail, itself a JPEG with its own marker, sits in the first 64 KB.
    """
    if not raw.startswith(b"\xff\xd8\xff") or raw.endswith(b"\xff\xd9") or raw.find(b"\xff\xd9", _EXIF_END) >= 0:
        return
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
    except Exception:  # noqa: BLE001  (PIL raises OSError, SyntaxError, ... for broken data; its words vary by version)
        raise DataError(
            f"{path}: not a readable image (JPEG data cut short or damaged); copy the whole file again, or remove it"
        ) from None


def declared_pixels(raw: bytes) -> int | None:
    """The pixels an encoded image's header declares (width x height, times the frames of a GIF),
    read without decoding it: what decoding it will cost. None when PIL cannot parse the header."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # the caller's limit decides, as in image_info
    try:
        with Image.open(io.BytesIO(raw)) as im:
            return im.size[0] * im.size[1] * _frames(im)
    except Exception:  # noqa: BLE001  (PIL raises many types for files it cannot parse)
        return None


def _frames(im) -> int:
    # TensorFlow decodes every frame of a GIF to keep the first; other formats decode one image.
    return getattr(im, "n_frames", 1) if im.format == "GIF" else 1


def _orient(image, orientation):
    """Apply an EXIF orientation (1..8) as PIL's ImageOps.exif_transpose does."""
    import tensorflow as tf

    def transpose():
        return tf.transpose(image, [1, 0, 2])

    branches = [
        lambda: image,  # 1: upright
        lambda: tf.reverse(image, [1]),  # 2: mirrored
        lambda: tf.reverse(image, [0, 1]),  # 3: upside down
        lambda: tf.reverse(image, [0]),  # 4: mirrored upside down
        transpose,  # 5
        lambda: tf.image.rot90(image, 3),  # 6: held turned right; turned back clockwise
        lambda: tf.reverse(transpose(), [0, 1]),  # 7
        lambda: tf.image.rot90(image, 1),  # 8
    ]
    return tf.switch_case(orientation - 1, branches, default=branches[0])


def decode_tensor(contents, input_shape: tuple[int, int, int], info):
    """Encoded image bytes -> uint8 (H, W, C): the one decode/resize used by training and predict.

    `info` is the file's (EXIF orientation, CMYK) from `image_info`, read in Python beforehand: a
    Python call per image inside the pipeline would hold it to one core.
    """
    import tensorflow as tf

    height, width, channels = input_shape
    image = _decode(contents, channels, tf.cast(info, tf.int32))
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


def _decode(contents, channels: int, info):
    """JPEG, PNG, GIF (first frame) or BMP bytes -> uint8 (H, W, channels), EXIF orientation applied."""
    import tensorflow as tf

    if channels != 1:
        image = tf.io.decode_image(contents, channels=channels, expand_animations=False)
        return _orient(image, info[0])
    # TensorFlow's GIF and BMP decoders only give colour, and its JPEG decoder cannot turn CMYK into
    # gray ("Invalid JPEG data"): decode those as RGB and convert, so a grayscale model takes them
    # too. The other JPEGs and PNGs keep their own grayscale decode.
    head = tf.strings.substr(contents, 0, 2)
    colour_only = tf.logical_or(tf.logical_or(tf.equal(head, b"GI"), tf.equal(head, b"BM")), info[1] > 0)
    image = tf.cond(
        colour_only,
        lambda: tf.image.rgb_to_grayscale(tf.io.decode_image(contents, channels=3, expand_animations=False)),
        lambda: tf.io.decode_image(contents, channels=1, expand_animations=False),
    )
    return _orient(image, info[0])


def decode_image_bytes(
    raw: bytes, shown: str | os.PathLike, shape: tuple[int, ...], max_pixels: int | None = Settings.max_image_pixels
) -> np.ndarray:
    """Encoded image bytes as uint8 (H, W, C), decoded and resized exactly as the training pipeline does;
    DataError naming `shown` otherwise.

    `max_pixels` (predict: the default MAX_IMAGE_PIXELS) refuses an oversized image before decoding; None
    where the caller bounded the pixels itself (training's scan, serve's SERVE_MAX_PIXELS).
    """
    import tensorflow as tf

    # The header pass training runs: the size limit before decoding, then the EXIF orientation. The
    # limit is the default one (predict reads no MAX_IMAGE_PIXELS), so the fix is a smaller image.
    fix = f"shrink the image (the model takes {shape[1]}x{shape[0]}; this limit is MAX_IMAGE_PIXELS's default, which no setting changes here)"
    info = image_info(raw, shown, max_pixels, fix)
    try:
        return decode_tensor(tf.constant(raw), tuple(shape), tf.constant(info)).numpy()
    except Exception as e:  # tf.errors.OpError, ValueError: not an image TensorFlow reads
        raise DataError(
            # TensorFlow decodes no BMP of 1 or 4 bits a pixel, and says so as "0 channels".
            f"{shown}: not a readable image{_why_unreadable(e)}; the formats read are {SUPPORTED} "
            "(of 8, 24 or 32 bits a pixel): convert or remove it"
        ) from None


def _why_unreadable(e: BaseException) -> str:
    """TensorFlow's reason in brackets, but not for bytes in no format it knows: that reason lists TensorFlow's
    formats (JPEG XL, WebP, ...) beside the ones read here, which the message names."""
    text = tf_message(e)
    return "" if text.startswith("Unknown image file format") else f" ({text})"


def load_image_file(
    path: str | os.PathLike, input_shape: tuple[int, int, int], max_pixels: int | None = Settings.max_image_pixels
) -> np.ndarray:
    """One file as decode_image_bytes decodes its bytes."""
    return decode_image_bytes(read_image_bytes(path), path, input_shape, max_pixels)


def decode_dataset(paths: Sequence[str], input_shape: tuple[int, int, int], info: np.ndarray):
    """A tf.data pipeline of uint8 images for `paths`, decoded in parallel, in the order given.

    `info`: the files' `image_info` rows (from `scan_files`).
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.asarray(paths, dtype=object).astype(str), np.asarray(info, np.int32)))
    return ds.map(read_and_decode(input_shape), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def read_and_decode(input_shape: Sequence[int]):
    """f(path, info) -> decode_tensor of the file at `path`, as a tf.function traced once per input shape."""
    return _read_and_decode(tuple(input_shape))


@functools.cache
def _read_and_decode(input_shape: tuple[int, int, int]):
    """decode_tensor of a file's path, traced once per input shape and process: each tf.data map traces its
    function again, and this one (eight orientations, two resizes) took 0.13 s of each decode pass, which a
    run makes twice (train, val), with CACHE=none again for each epoch, validation and replica's slice, and
    a sweep in one process for each trial; the map now only calls it."""
    import tensorflow as tf

    @tf.function(input_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([2], tf.int32)), autograph=False)
    def read_and_decode(path, info):
        return decode_tensor(tf.io.read_file(path), input_shape, info)

    return read_and_decode


def decode_files(
    paths: Sequence[str],
    input_shape: tuple[int, int, int],
    info: np.ndarray,
    out: np.ndarray | None = None,
) -> None:
    """Decode every file (in parallel, with tf.data) into `out` (N, H, W, C) uint8, or only check them.

    A file that is missing or not an image raises DataError naming it.
    """
    import tensorflow as tf

    batches = released_at_once(decode_dataset(paths, input_shape, info).batch(_DECODE_BATCH).prefetch(2))
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
            load_image_file(path, input_shape, max_pixels=None)
        last = min(done + _DECODE_BATCH, len(paths))  # the batch that failed; the last one may be short
        raise DataError(f"decoding images {done + 1} to {last} of {len(paths)} failed ({tf_message(e)})") from None


def _check_split(root: Path, class_names, labels: np.ndarray, val: np.ndarray, val_split: float) -> None:
    """A class of one image cannot be both trained on and validated: refused. A class that VAL_SPLIT
    leaves without a validation image (a few images each) trains, but its accuracy is never
    measured: one warning naming them. No validation image at all: refused."""
    counts = np.bincount(labels, minlength=len(class_names))
    single = [class_names[c] for c in np.flatnonzero(counts == 1)]
    if single:
        raise DataError(
            f"{root / single[0]}: class {single[0]!r} has a single image"
            + (f" (and {len(single) - 1} more classes)" if len(single) > 1 else "")
            + f"; with VAL_SPLIT={val_split} a class needs at least 2 (one to train on, one to validate): "
            "add images, remove the folder, or set VAL_SPLIT=0"
        )
    if len(val) == 0:
        raise DataError(
            f"{root}: VAL_SPLIT={val_split} of {counts.min()} images in the smallest "
            "class leaves no image for validation; raise VAL_SPLIT or add images"
        )
    unseen = [class_names[c] for c in np.flatnonzero(np.bincount(labels[val], minlength=len(class_names)) == 0)]
    if unseen:
        shown = ", ".join(repr(n) for n in unseen[:5]) + (", ..." if len(unseen) > 5 else "")
        log.warning(
            "WARNING: %s: VAL_SPLIT=%s leaves %d of %d classes without a validation image (%s): their accuracy "
            "is never measured; raise VAL_SPLIT or add images",
            root,
            val_split,
            len(unseen),
            len(class_names),
            shown,
        )


def read_image_dir(root: Path, settings, subset: Callable[[int, int], np.ndarray] | None = None):
    """(class names, input shape, fingerprint, [(x, y, files, info) of train, of val]), every file decoded.

    `subset(n, salt)` (salt 0: train, 1: val) picks the indices a smoke run keeps.
    """
    class_names, rels, labels = list_image_dir(root)
    fingerprint, info = scan_files(root, rels, settings.max_image_pixels)
    tr, va = split_indices(labels, settings.val_split, settings.seed)
    if settings.val_split > 0:
        _check_split(root, class_names, labels, va, settings.val_split)
    if subset is not None:
        tr, va = tr[subset(len(tr), 0)], va[subset(len(va), 1)]
    shape = (settings.image_size, settings.image_size, settings.channels)
    splits: list[tuple[Any, np.ndarray, tuple[str, ...], np.ndarray]] = []
    for which, idx in (("train", tr), ("val", va)):
        files = tuple(str(root / rels[i]) for i in idx)
        key = hashlib.sha256(repr((fingerprint, which, shape, idx.tolist())).encode()).hexdigest()[:16]
        splits.append(
            (decode_cached(files, shape, key, settings, fingerprint, info[idx]), labels[idx], files, info[idx])
        )
    return class_names, shape, fingerprint, splits


def decode_cached(files: tuple[str, ...], shape, key: str, settings, fingerprint: str, info: np.ndarray):
    """Decode (and so verify) every file once, into the cache CACHE asks for."""
    if settings.cache == "none":
        decode_files(files, shape, info)
        return None
    if settings.cache == "memory":
        if key not in _DECODED:
            out = np.empty((len(files), *shape), np.uint8)
            decode_files(files, shape, info, out)
            _DECODED[key] = out
        return _DECODED[key]
    # file: same fingerprint, shape and split -> already decoded and verified by an earlier run
    path = local_dir(settings.runs_dir) / CACHE_DIR / fingerprint[:16] / f"{key}.npy"
    cached = _verified_cache(path, (len(files), *shape), fingerprint)
    if cached is not None:
        return cached

    def write(tmp: Path) -> None:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(files), *shape))
        decode_files(files, shape, info, out)
        out.flush()
        del out  # unmapped before atomic_write syncs and renames it

    # Other runs sharing RUNS_DIR may fill the same cache folder at the same time.
    with shared_writes(path.parent) as removed:
        for p in removed:
            log.info("removed a temp file left by an interrupted cache write: %s", p)
        # size_hint: a full disk is refused up front; a memory-mapped write into it would die of SIGBUS.
        atomic_write(path, write, size_hint=len(files) * int(np.prod(shape)) + (1 << 16))
        # The record is written last: a cache without one (a kill in between) is rebuilt, never trusted.
        record = json.dumps({"fingerprint": fingerprint, "sha256": sha256_file(path)}).encode()
        atomic_write(_record(path), lambda tmp: tmp.write_bytes(record))
    return np.load(path, mmap_mode="r")


def _record(cache: Path) -> Path:
    return cache.with_suffix(".json")


def _verified_cache(path: Path, shape: tuple[int, ...], fingerprint: str):
    """The cached array, memory-mapped, if its record says it was decoded from data with this
    fingerprint and its bytes still hash to what was written; else None (with one warning when a
    cache was there but fails the check: it is rebuilt, never trained on)."""
    if not path.exists() and not _record(path).exists():
        return None
    try:
        record = json.loads(_record(path).read_text())
        if not isinstance(record, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        problem = f"its record {_record(path).name} is missing or unreadable ({type(exc).__name__})"
    else:
        problem = ""
        if record.get("fingerprint") != fingerprint:
            problem = "it was decoded from other data (its record holds another data fingerprint)"
        else:
            try:
                if sha256_file(path) != record.get("sha256"):
                    problem = "its bytes changed since it was written"
                else:
                    cached = np.load(path, mmap_mode="r")
                    if cached.shape == shape and cached.dtype == np.uint8:
                        return cached
                    problem = f"it holds {cached.dtype} {cached.shape}, not uint8 {shape}"
            except (OSError, ValueError) as exc:
                problem = f"it cannot be read ({type(exc).__name__}: {tf_message(exc)})"
    log.warning("WARNING: decode cache %s does not match the data: %s; decoding the images again", path, problem)
    return None


def tf_message(e: BaseException) -> str:
    """What went wrong in a TensorFlow op, without the function and op names it is wrapped in."""
    text = getattr(e, "message", None) or str(e)
    # TensorFlow wraps op errors as "{{function_node ...}} what went wrong [Op:DecodeImage] name: ".
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\].*$", "", first_line(text, None))
    return text[:200] or type(e).__name__
