"""`python -m train predict <run> <images>`: class and probability for each image file.

Uses the run's exported SavedModel (what a serving user gets) when it exists, else rebuilds the
model from the run's best weights (verified against their recorded sha256); images go through the
same decode/resize as training. A run without either says so (NoWeightsError, exit 4).

The export is checked first against its source.json: a file whose sha256 differs, or a SavedModel
that does not load, is an ExportError (exit 8) naming the fix, `export` again. An export made from
other weights than the ones the run would export now (a resume with EXPORT=false after it) is used
with one warning line saying so. Each image that is not a readable regular image file is one
DataError line and is left out; the others are still predicted (the command then exits 3).
"""

from __future__ import annotations

import io
import logging
import os
import stat
import unicodedata
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import DataError, ExportError, first_line
from ..locations import runs_dir_flag
from ..run.files import read_json
from ..run.manifest import section
from ..run.rundir import ExportDir, RunDir
from ..setup.hardware import compose_volume_hint

log = logging.getLogger("train")
# Images decoded and predicted at once: memory bounded however many files are given (thousands of
# 224x224 images in one batch took gigabytes, as pixels and again as the model's activations).
BATCH = 64
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def predict_files(run_dir: Path, files: list[str], runs_dir: object = None) -> list[dict]:
    """One row per file: {"file", "class", "index", "probability"}, or {"file", "error": DataError}.
    `runs_dir`: where the command found the run, for the command a damaged weights file's message gives."""
    run_files = RunDir(run_dir)
    if run_files.export.savedmodel.is_dir():
        labels = run_files.data_description()[0]  # the run's one list of class names, as every reader
        shape, run = _open_export(run_files, labels, runs_dir)
    else:
        from .export import rebuild_model

        model, labels, _ = rebuild_model(run_dir, runs_dir)
        shape = tuple(model.inputs[0].shape[1:])

        def run(batch):
            return np.asarray(model(batch.astype(np.float32), training=False))

    rows: list[dict] = [{"file": str(f)} for f in files]  # in the order given, bad files in their place
    for start in range(0, len(files), BATCH):
        _predict_batch(rows[start : start + BATCH], shape, run, labels)
    return rows


def _open_export(run_files: RunDir, labels: list[str], runs_dir: object = None):
    """open_savedmodel of the run's export once check_export passed on that same folder (open_checked)."""
    path, check = run_files.export.path, partial(check_export, run_files, runs_dir)
    return open_checked(
        path,
        check_folder(path, check),
        check,
        partial(open_savedmodel, run_files.export, run_files.name, labels, runs_dir),
    )


def check_folder(path: Path, check: Callable[[], object]) -> tuple[int, int] | None:
    """check() of the export folder at `path`, again once when an export swapped a new folder in
    meanwhile (its files read against the previous one's source.json would be called damaged); the
    identity of the folder checked, for open_checked."""
    before = _folder_id(path)
    try:
        check()
    except ExportError:
        if _folder_id(path) == before:
            raise
        before = _folder_id(path)
        check()
    return before


def open_checked(
    path: Path, checked: tuple[int, int] | None, check: Callable[[], object], load: Callable[[], tuple]
) -> tuple:
    """load() of the export folder at `path`, `checked` by check_folder (predict just before, serve before it
    listens); when an export swapped a new folder in since, the model loaded might not be the one checked,
    or fail to load as a damaged one: the new folder is checked and loaded instead, once."""
    try:
        opened = load()
    except ExportError:
        if _folder_id(path) == checked:
            raise
    else:
        if _folder_id(path) == checked:
            return opened
    check()
    return load()


def _folder_id(path: Path) -> tuple[int, int] | None:
    """What tells one export folder from the next swapped in at the same path (None: none there now)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _predict_batch(rows: list[dict], shape: tuple[int, ...], run, labels: list[str]) -> None:
    """Decode and predict the files of `rows` (at most BATCH), each row filled in place."""
    from ..inputs.images import decode_image_bytes

    good, images = [], []
    for row in rows:
        try:
            contents, shown = read_image_file(row["file"])
            images.append(decode_image_bytes(contents, shown, shape))
            good.append(row)
        except DataError as exc:
            row["error"] = exc
            continue
        if converted := _conversion(contents, shape):
            row["converted"] = converted
    probs = run(np.stack(images)) if images else []
    for row, p in zip(good, probs):
        k = int(np.argmax(p))
        row.update({"class": labels[k] if k < len(labels) else str(k), "index": k, "probability": float(p[k])})


def open_savedmodel(export: ExportDir, name: str, labels: list[str], runs_dir: object = None, copied: bool = False):
    """(input shape, run(uint8 batch) -> float32 probabilities) of an export's serving signature.

    ExportError when it does not load or predicts another number of classes than `labels` holds (`runs_dir`:
    where the command found the run, for the command its message gives; `copied`: an export folder copied
    away from its run, named by its path, as verify_export_files names it).
    """
    import tensorflow as tf

    which, again = (
        (f"the export folder {export.path}", COPIED_AGAIN)
        if copied
        else (f"the export of run {name}", export_again(name, runs_dir))
    )
    try:
        serve = tf.saved_model.load(str(export.savedmodel)).signatures["serving_default"]
        shape = tuple(serve.structured_input_signature[1]["images"].shape[1:])
        width = next(iter(serve.structured_outputs.values())).shape[-1]
    except Exception as exc:  # a damaged SavedModel: OSError, IndexError, KeyError, DataLossError...
        raise ExportError(
            f"{which} ({export.savedmodel}) does not load ({type(exc).__name__}: {first_line(exc)}): {again}"
        ) from None
    if width != len(labels):
        has = f"its {export.labels.name} names" if copied else "the run has"
        why = "" if copied else " (it was exported before the run trained on other data)"
        raise ExportError(f"{which} predicts {width} classes but {has} {len(labels)}{why}: {again}")

    def run(batch):
        return next(iter(serve(images=tf.constant(batch)).values())).numpy()

    return shape, run


COPIED_AGAIN = "copy the whole export/ folder of its run again, or export the run again (`python -m train export RUN`)"


def export_again(name: str, runs_dir: object = None, file: str = "") -> str:
    """The fix of a damaged export of run `name`, found in `runs_dir` (RUNS_DIR or --runs-dir); for a
    LiteRT or ONNX `file` of it, with the --format (and --quantize) that makes that file again."""
    flags = ""
    if file.endswith(".onnx"):
        flags = " --format onnx"
    elif file.endswith(".tflite"):  # model.tflite, or model.<mode>.tflite quantised
        flags = " --format litert" + (f" --quantize {file.split('.')[1]}" if file.count(".") == 2 else "")
    return f"export it again with `python -m train export {name}{runs_dir_flag(runs_dir)}{flags}`"


def check_export(run_files: RunDir, runs_dir: object = None) -> None:
    """Refuse an export whose files differ from its source.json; warn when it is not from the run's weights now."""
    again = export_again(run_files.name, runs_dir)
    _require_source_json(run_files, again)
    source = verify_export_files(run_files.export, run_files.name, runs_dir=runs_dir)
    if source is not None:
        _warn_if_stale(run_files, source, again)


def _require_source_json(run_files: RunDir, again: str) -> None:
    """ExportError when source.json is gone from an export the manifest says wrote one: without it the
    export's files would go unchecked, with only the warning meant for exports older than source.json."""
    export = run_files.export
    if export.source.exists() or "source" not in section(run_files.read_manifest(missing_ok=True), "export"):
        return
    raise ExportError(
        f"the export of run {run_files.name} is damaged: {export.source} is missing, though the run's manifest "
        f"records an export that wrote it, so its files cannot be checked: {again}"
    )


def verify_export_files(export: ExportDir, name: str, copied: bool = False, runs_dir: object = None) -> dict | None:
    """ExportError unless every file source.json records has its sha256; the weights it names, or None
    (with a warning) for an export made before source.json was written. `name`, `runs_dir`: the run's and
    where the command found it, for messages;
    `copied`: an export folder copied away from its run, named by its path (it is no run)."""
    if copied:
        which, again = f"the export folder {export.path}", COPIED_AGAIN
        unrecorded = f"WARNING: {which} has no source.json: its files cannot be checked against what export wrote; %s"
    else:
        which, again = f"the export of run {name}", export_again(name, runs_dir)
        unrecorded = (
            f"WARNING: {which} does not record the weights it was made from (exported before that was kept): it "
            "may be older than the run's best weights; %s to be sure"
        )
    try:
        record = read_json(export.source)  # never waits on a named pipe in its place
        recorded, source = dict(record["files"]), dict(record["weights"])
    except FileNotFoundError:
        log.warning(unrecorded, again)
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{which}: {export.source} is unreadable ({exc}): {again}") from None
    damaged = f"{which} is damaged"
    if not recorded:
        raise ExportError(f"{damaged}: {export.source} lists no files, so nothing in it could be checked: {again}")
    missing = _unrecorded(export, recorded)
    if missing:
        raise ExportError(f"{damaged}: {export.source} records no sha256 of {missing[0]}, which is served: {again}")
    for rel, digest in recorded.items():
        try:
            actual = _recorded_file_sha256(export, rel, damaged, again)
        except FileNotFoundError:  # deleted or moved by hand: not a damaged file, and its format's command
            fix = again if copied else export_again(name, runs_dir, str(rel))
            raise ExportError(f"{which} is missing {export.path / rel}, which export wrote: {fix}") from None
        if actual != digest:
            path = export.path / rel
            raise ExportError(f"{damaged}: {path} has sha256 {actual}, not the {digest} written: {again}")
    return source


def _unrecorded(export: ExportDir, recorded: dict) -> list[str]:
    """The files of the SavedModel (what is served) that source.json does not record, in order.

    A source.json that lists nothing, or only some files, would otherwise let what is served go
    unchecked; export records every file it wrote."""
    found = sorted(p.relative_to(export.path).as_posix() for p in export.savedmodel.rglob("*") if not p.is_dir())
    return [rel for rel in found or ["savedmodel/saved_model.pb"] if rel not in recorded]


def _recorded_file_sha256(export: ExportDir, rel: object, damaged: str, again: str) -> str:
    """The sha256 of one file source.json records: a relative path to a regular file inside the export.

    source.json travels with the export and may come from anyone, so an entry never names a file
    elsewhere (../../etc/hostname, /etc/hostname, a link out of the folder), nor a device or a pipe
    (/dev/zero would be hashed forever): the file is opened without blocking and checked by fstat
    before a byte of it is read."""
    from ..digest import sha256_fd

    path = _inside(export.path.resolve(), rel)
    if path is None:
        shown = printable(repr(rel))[:200]
        raise ExportError(f"{damaged}: {export.source} lists {shown}, not a file inside the export folder: {again}")
    try:
        # Resolved already: O_NOFOLLOW refuses a link put in its place since.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        if path.is_socket():  # open() refuses it (No such device or address) before fstat can tell
            raise ExportError(
                f"{damaged}: {export.path / rel} is a socket, not a file export writes: {again}"
            ) from None
        raise ExportError(f"{damaged}: {export.path / rel} cannot be read ({exc.strerror or exc}): {again}") from None
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            what = _KINDS.get(kind, "not a regular file")
            raise ExportError(f"{damaged}: {export.path / rel} is {what}, not a file export writes: {again}")
        return sha256_fd(fd)
    except OSError as exc:
        raise ExportError(f"{damaged}: {export.path / rel} cannot be read ({exc.strerror or exc}): {again}") from None
    finally:
        os.close(fd)


def _inside(root: Path, rel: object) -> Path | None:
    """The real path (links resolved) of the relative path `rel` when it is below `root`, else None."""
    if not isinstance(rel, str) or not rel or "\0" in rel or Path(rel).is_absolute():
        return None
    try:
        path = (root / rel).resolve()
    except (OSError, RuntimeError):  # a link loop
        return None
    return path if path.is_relative_to(root) and path != root else None


def _warn_if_stale(run_files: RunDir, source: dict, again: str) -> None:
    from ..digest import sha256_file
    from ..run.weights import records

    current = run_files.weights()
    if not current:
        return
    now = current[0]
    entry = records(run_files.path).get(now.name) or {}
    try:
        sha, epoch = entry.get("sha256") or sha256_file(now), entry.get("epoch")
    except OSError:
        return  # unreadable weights: export and a fit say so; predict uses the export
    if sha == source.get("sha256"):
        return
    made = f"{source.get('file') or 'the trained model'}" + (
        f" of epoch {source['epoch']}" if source.get("epoch") else ""
    )
    holds = f" (epoch {epoch})" if epoch else ""
    log.warning(
        "WARNING: the export of run %s was made from %s, but the run's weights are now %s%s: these predictions "
        "come from the export's weights, not those; %s",
        run_files.name,
        made,
        now.name,
        holds,
        again.replace("export it again", "bring it up to date"),
    )


def _conversion(contents: bytes, shape: tuple[int, ...]) -> str | None:
    """How an image differs from the model's input, e.g. "200x150 RGB -> 28x28 grayscale"; None if it does not.

    From the header (PIL): the decoder has already resized it and changed its channels the way
    training does, so the answer is right; the user is only told that it happened."""
    from PIL import Image

    height, width, channels = (*shape[:2], shape[2] if len(shape) > 2 else 1)
    wanted = {1: ("L", "grayscale"), 3: ("RGB", "RGB")}.get(channels, ("", f"{channels} channels"))
    try:
        with Image.open(io.BytesIO(contents)) as im:
            (w, h), mode = im.size, im.mode
    except Exception:  # decoded by TensorFlow already: a header PIL does not read is no reason to fail
        return None
    if (w, h) == (width, height) and mode == wanted[0]:
        return None
    return f"{w}x{h} {_MODES.get(mode, mode)} -> {width}x{height} {wanted[1]}"


# PIL's modes as a person reads them (https://pillow.readthedocs.io/en/stable/handbook/concepts.html#modes).
_MODES = {"1": "1-bit", "L": "grayscale", "LA": "grayscale+alpha", "P": "palette", "I;16": "16-bit grayscale"}
_MODES |= {"I": "32-bit grayscale", "F": "float grayscale"}


def read_image_file(path: str | os.PathLike) -> tuple[bytes, str]:
    """(contents, the name to show) of a regular, readable file; DataError naming the file otherwise.

    Opened without blocking and checked with fstat before any read, so a named pipe, a device or
    a directory given as an image is refused instead of read from (a FIFO would block forever).
    """
    from ..inputs.images import SUPPORTED

    shown = printable(str(path))  # the error stays one line whatever the name holds
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        broken = " (a broken link)" if Path(path).is_symlink() else ""
        host = compose_volume_hint(path)  # in the container: the host's files are seen only through its volumes
        raise DataError(
            f"{shown} does not exist{broken}; give existing image files ({SUPPORTED})" + (f"; {host}" if host else "")
        ) from None
    except NotADirectoryError:  # notes.txt/cat.png, or a link whose target runs through a file
        below = next((p for p in Path(os.path.realpath(path)).parents if p.exists() and not p.is_dir()), None)
        where = f" ({printable(str(below))} is a file, not a folder)" if below else ""
        raise DataError(f"{shown} does not exist{where}; give existing image files ({SUPPORTED})") from None
    except PermissionError:
        raise DataError(f"{shown} cannot be read (permission denied): `chmod +r` it or run as its owner") from None
    except OSError as exc:
        raise DataError(f"{shown} cannot be opened ({exc.strerror or exc}); give regular image files") from None
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            what = _KINDS.get(kind, "not a regular file")
            raise DataError(f"{shown} is {what}, not an image file; give regular image files ({SUPPORTED})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            contents = fh.read()
    except OSError as exc:
        raise DataError(f"{shown} cannot be read ({exc.strerror or exc}); give regular image files") from None
    finally:
        os.close(fd)
    return contents, shown


def format_predictions(rows: list[dict]) -> str:
    """file, class and probability in aligned columns (by display width); bad files are left out."""
    rows = [r for r in rows if "error" not in r]
    if not rows:
        return ""
    names = [printable(r["file"]) for r in rows]
    classes = [printable(str(r["class"])) for r in rows]
    fw, cw = max(map(_width, names)), max(map(_width, classes))
    return "\n".join(f"{_pad(n, fw)}  {_pad(c, cw)}  {r['probability']:.4f}" for n, c, r in zip(names, classes, rows))


def printable(text: str) -> str:
    # A newline or tab in a file name would break the line or the columns: shown escaped instead.
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _width(text: str) -> int:
    """Terminal columns: wide (CJK) characters take two, combining marks none."""
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text
    )


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))
