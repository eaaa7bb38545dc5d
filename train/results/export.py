"""Export: a SavedModel that takes raw uint8 images, a `.keras` file and labels, checked for parity.

After writing, the SavedModel is loaded by plain TensorFlow in a fresh Python process (no import
of this package, nor of Keras) and its predictions on a fixed batch are compared with the in-memory model; the
largest difference goes into the manifest and anything above 1e-5 (or any NaN/inf output) fails
the export.

The export is built in a staging folder (export.tmp-*) and swapped into place only once complete and
checked, so a failure or a signal at any moment leaves the previous export as it was; staging folders
left by a SIGKILL are removed by the next export or fit of the run (both hold the run's lock, so no
live process is writing them). export/source.json says which weights file (name, epoch, sha256) the
export was made from and holds the sha256 of every file of the export, for `predict` to check.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import extras
from ..digest import sha256_file
from ..errors import ExportError, Interrupted, NoWeightsError
from ..locations import found_in, runs_dir_flag
from ..run.files import TMP_MARK, make_temp_dir, read_json, storage_error
from ..run.manifest import now_iso, update_manifest
from ..run.rundir import ExportDir, RunDir, labels_text, read_run_settings

log = logging.getLogger("train")
TOLERANCE = 1e-5
PARITY_BATCH = 32

# Runs in a fresh interpreter: only TensorFlow and numpy, exactly what a serving user has. Keras is
# refused (`import tensorflow` would load it and its plotting helpers' matplotlib, 0.55 s of a 2.2 s
# start on a 2-core Xeon): the SavedModel must load without it, as TF Serving loads it.
_RELOAD = """
import sys
sys.modules["keras"] = None
import numpy as np, tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
x = np.load(sys.argv[2])
out = model.signatures["serving_default"](images=tf.constant(x))
np.save(sys.argv[3], next(iter(out.values())).numpy())
import gc
gc.freeze()  # the file is written: skip shutdown's collection of every TensorFlow object (0.3 s)
"""


def _parity_batch(input_shape) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(PARITY_BATCH, *input_shape), dtype=np.uint8)


def serving_function(model):
    """(serve, input_signature): what every exported format computes, and its one input."""
    import tensorflow as tf

    shape = [None, *model.inputs[0].shape[1:]]

    def serve(images):
        # Preprocessing lives in the artefact: raw uint8 pixels in, float32 probabilities out.
        return {"probabilities": tf.cast(model(tf.cast(images, tf.float32), training=False), tf.float32)}

    return serve, [tf.TensorSpec(shape, tf.uint8, name="images")]


def write_savedmodel(model, path: Path) -> None:
    import keras

    archive = keras.export.ExportArchive()
    archive.track(model)
    serve, signature = serving_function(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=signature)
    archive.write_out(str(path), verbose=False)


def check_parity(model, savedmodel: Path, workdir: Path) -> float:
    x = _parity_batch(tuple(model.inputs[0].shape[1:]))
    expected = np.asarray(model(x.astype(np.float32), training=False), dtype=np.float32)
    np.save(workdir / "x.npy", x)
    with _SignalStop.at_once():
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _RELOAD, str(savedmodel), str(workdir / "x.npy"), str(workdir / "y.npy")],
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
        except subprocess.TimeoutExpired as exc:
            raise ExportError(
                f"the SavedModel at {savedmodel} does not load in a fresh process: no answer within {exc.timeout:g} s"
            ) from None
    if -proc.returncode in _SignalStop.SIGNALS:
        # Ctrl-C or `timeout` signals the whole process group: the check's process died of the stop
        # meant for this one, which says nothing about the SavedModel.
        again = _SignalStop.active.again if _SignalStop.active else _again("python -m train export RUN")
        raise Interrupted(
            f"export stopped by {signal.Signals(-proc.returncode).name} during its parity check: the previous "
            f"export is unchanged; {again}"
        )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ExportError(f"the SavedModel at {savedmodel} does not load in a fresh process: {tail[0]}")
    got = np.load(workdir / "y.npy")
    for name, out in (("the trained model", expected), ("the reloaded SavedModel", got)):
        if not np.isfinite(out).all():
            # NaN compares false with any tolerance: a model that answers NaN must never pass.
            raise ExportError(
                f"{name} gives NaN/inf probabilities on the parity batch ({int((~np.isfinite(out)).sum())} of "
                f"{out.size} values): its weights are damaged or diverged; export a run whose weights are finite"
            )
    return float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))


def float32_copy(model, model_name: str):
    """The same network and weights under the float32 policy, uncompiled.

    The export serves in float32 whatever the training precision: it runs on any CPU or GPU, and
    its fresh-process parity can be held to 1e-5 (bfloat16 keeps ~3 significant digits, so a
    mixed-precision graph and the eager model already differ by ~1e-3 after fusion). A copy also
    in float32: model.keras then never carries the training optimizer, whose learning-rate
    schedule (train.training.schedules) only this package could load.
    """
    from ..models import build_model, float32_policy

    with float32_policy():
        copy = build_model(model_name, tuple(model.inputs[0].shape[1:]), int(model.outputs[0].shape[-1]))
    copy.set_weights(model.get_weights())
    return copy


def export_model(
    model,
    run_dir: Path,
    labels: list[str],
    source: dict[str, Any] | None = None,
    formats=None,
    command: str = "",
    runs_dir: object = None,  # where the command found the run, for a command a message gives (runs_dir_flag)
) -> dict[str, Any]:
    """Write run_dir/export/{savedmodel/, model.keras, labels.txt, source.json} atomically and verify parity.

    `labels` are the run's class names (RunDir.data_description); export/labels.txt is a copy of
    them for serving code that has only the export folder. `source` ({"file", "sha256", "epoch"})
    names the weights the model holds, recorded in export/source.json. `formats`: the files beyond the
    SavedModel (other_formats), or None. `command`: the one to run again when a signal stops it (the
    export command as typed, with its flags), else `python -m train export RUN`.
    """
    files = RunDir(run_dir)
    final = files.export.path
    records: dict[str, Any] = {}
    failures: list[ExportError] = []
    others = formats is not None and bool(formats.wanted)
    owned = formats.files if formats is not None else ()  # the extra's files a previous export may hold
    _refuse_other_than_a_folder(final)
    with _SignalStop(_again(command or f"python -m train export {run_dir.name}")) as stop:
        # A staging folder with the export's layout, swapped into place when complete.
        try:
            staging = ExportDir(make_temp_dir(run_dir, final.name))  # readable by others as the umask allows
        except OSError as exc:
            raise storage_error(final, exc) from exc
        try:
            write_savedmodel(model, staging.savedmodel)
            stop.check()
            model.save(staging.keras)
            staging.labels.write_text(labels_text(labels), encoding="utf-8")
            with tempfile.TemporaryDirectory() as work:
                diff = _parity(model, staging, Path(work), files)
                if others:
                    records, failures = formats.write(
                        model, staging, Path(work), serving=serving_function, at_once=_SignalStop.at_once
                    )
                    _write_format_records(staging, records)
            stop.check()
            kept, dropped = keep_other_formats(files.export, staging, source, formats, runs_dir)
            if kept:
                records = {**kept, **records}
                _write_format_records(staging, records)
            write_source(staging, source)
            stop.check()
            _keep_good_files(failures, staging, files, owned)
            _swap_into_place(staging.path, final)
            if dropped:
                log.warning("WARNING: export: %s", dropped)
        except BaseException as exc:
            shutil.rmtree(staging.path, ignore_errors=True)
            cause = storage_cause(exc)
            if cause is not None:
                raise storage_error(final, cause) from exc
            raise
    return _record_export(files, diff, source, others, records, failures)


def _record_export(files: RunDir, diff: float, source, others: bool, records: dict, failures: list) -> dict[str, Any]:
    """The export in the manifest; ExportError naming a format that failed (the others are in place)."""
    final = files.export.path
    report = {
        "savedmodel": str(files.export.savedmodel),
        "keras": str(files.export.keras),
        "labels": str(files.export.labels),
        "max_abs_diff": diff,
        "tolerance": TOLERANCE,
        "source": _source_fields(source),
    }
    if others or records:
        report["formats"] = records
        report["failed"] = [str(e) for e in failures]
    update_manifest(files.manifest, export=report)
    log.info("export: %s (fresh-process parity: max |diff| %.2e)", final, diff)
    if failures:
        written = ", ".join(["savedmodel", *sorted(k for k, r in records.items() if not r.get("kept"))])
        kept = ", ".join(sorted(k for k, r in records.items() if r.get("kept")))
        kept = f"; kept from the previous export: {kept}" if kept else ""
        raise ExportError(f"{'; '.join(map(str, failures))} (written and checked: {written} in {final}{kept})")
    return report


def other_formats(settings=None, run_dir: Path | None = None):
    """What the formats extra (LiteRT, ONNX) writes for these settings, or None when this template has
    no such extra: the export then writes the SavedModel, the .keras file and the labels alone."""
    module = extras.part("onnx", "convert")
    return module.Formats.from_settings(settings, run_dir) if module is not None else None


def _write_format_records(staging: ExportDir, records: dict[str, Any]) -> None:
    parity = json.loads(staging.parity.read_text())
    staging.parity.write_text(json.dumps({**parity, "formats": records}, indent=2, sort_keys=True) + "\n")


def keep_other_formats(
    previous: ExportDir, staging: ExportDir, source, formats=None, runs_dir: object = None
) -> tuple[dict[str, Any], str]:
    """Copy into `staging` the files of formats the export in place has and this one was not asked for
    (one that failed now is not kept: _keep_good_files then leaves the previous export whole).

    An export of one format never deletes another's files: a file is kept, with its record, when it
    was made from the same weights (the sha256 in source.json) and is still the file recorded
    there. Otherwise it would be wrong beside the new SavedModel; it is left out, and the second
    value, empty when nothing is left out, is a line that names it and how to make it again.
    """
    names = formats.files if formats is not None else ()
    asked = formats.asked if formats is not None else ()
    others = sorted(
        n for n in names if n not in asked and (previous.path / n).is_file() and not (staging.path / n).exists()
    )
    if not others:
        return {}, ""
    try:
        record = read_json(previous.source)  # a named pipe in its place is never waited on
        recorded = record["files"]
        weights = record["weights"]["sha256"]
        made = read_json(previous.parity).get("formats") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        recorded, weights, made = {}, None, {}
    same = weights is not None and weights == (source or {}).get("sha256")
    kept: dict[str, Any] = {}
    for name in others if same else []:
        if recorded.get(name) != sha256_file(previous.path / name):
            continue
        shutil.copy2(previous.path / name, staging.path / name)
        kept.update(
            {key: {**r, "kept": True} for key, r in made.items() if isinstance(r, dict) and r.get("file") == name}
        )
    dropped = [n for n in others if not (staging.path / n).exists()]
    if not dropped:
        return kept, ""
    why = "were made from other weights" if not same else "differ from what its source.json records"
    if weights is None:  # no record to tell: an unreadable source.json (or one without the weights' sha256)
        why = f"cannot be checked against these weights ({previous.source} cannot be read)"
    return kept, (
        f"{', '.join(dropped)} of the previous export {why} and are not in the new one; "
        f"{formats.again(dropped, previous.path.parent.name + runs_dir_flag(runs_dir))} from these weights"
    )


_SPECIAL = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def keep_added_files(previous: ExportDir, staging: ExportDir, owned=()) -> list[str]:
    """Copy into `staging` what was added to the export in place by hand (a README, a labels file of
    one's own): each entry of its folder that export does not write (its own files, and the formats'
    files `owned`, which keep_other_formats keeps or names). The names copied, for the line that says so."""
    if not previous.path.is_dir():
        return []
    written = {p.name for p in (staging.savedmodel, staging.keras, staging.labels, staging.parity, staging.source)}
    added = sorted(p.name for p in previous.path.iterdir() if p.name not in written.union(owned))
    left_out: list[str] = []

    def special(folder: str | Path, names) -> list[str]:
        """A named pipe, socket or device: no file to copy (shutil refuses them with SpecialFileError)."""
        kinds = {n: _SPECIAL.get(stat.S_IFMT(os.lstat(Path(folder, n)).st_mode)) for n in names}
        left_out.extend(f"{Path(folder, n).relative_to(previous.path)} ({kind})" for n, kind in kinds.items() if kind)
        return [n for n, kind in kinds.items() if kind]

    skipped = special(previous.path, added)
    added = [name for name in added if name not in skipped]
    for name in added:
        if (previous.path / name).is_dir() and not (previous.path / name).is_symlink():
            shutil.copytree(previous.path / name, staging.path / name, symlinks=True, ignore=special)
        else:
            shutil.copy2(previous.path / name, staging.path / name, follow_symlinks=False)
    if left_out:
        log.warning(
            "note: export: left out %s of the previous export: only files, folders and links are copied into the new one",
            ", ".join(left_out),
        )
    return added


def _keep_good_files(failures: list[ExportError], staging: ExportDir, files: RunDir, names) -> None:
    """The new export never takes away a file of the current one: not a good file of a format that
    failed now, nor one added by hand (copied into `staging`, keep_added_files).

    The new export holds the other formats and lacks the failed one's file, so swapping it in would
    remove the old file: then the previous export stays whole and the new one goes to export.rejected/.
    """
    lost = sorted(n for n in names if (files.export.path / n).is_file() and not (staging.path / n).is_file())
    if failures and lost:
        raise ExportError(
            f"{'; '.join(map(str, failures))}; the previous export, which has {', '.join(lost)}, is unchanged "
            f"and {_reject(staging, files, 'the new files')}"
        )
    if added := keep_added_files(files.export, staging, names):
        # A warning's level, so that the export command (which shows no info lines) says it too.
        log.warning("note: export: kept %s, which export does not write, from the previous export", ", ".join(added))


def _parity(model, staging: ExportDir, work: Path, files: RunDir) -> float:
    """The fresh-process difference; a failure keeps the staged files as export.rejected/ for inspection."""
    try:
        diff = check_parity(model, staging.savedmodel, work)
    except ExportError as exc:
        raise ExportError(f"{exc}; {_reject(staging, files)}") from None
    staging.parity.write_text(json.dumps({"max_abs_diff": diff, "tolerance": TOLERANCE}) + "\n")
    if diff > TOLERANCE:
        raise ExportError(
            f"the exported SavedModel differs from the trained model by {diff:.3g} (> {TOLERANCE}); "
            f"{_reject(staging, files)}"
        )
    return diff


def _reject(staging: ExportDir, files: RunDir, what: str = "the files") -> str:
    """Keep a rejected export as export.rejected/ (one only: the newest replaces an older one); the
    clause saying where its files are, or why they are not kept (a file or link of that name is left as it is)."""
    rejected = files.path / f"{files.export.path.name}.rejected"
    if rejected.is_symlink() or rejected.exists() and not rejected.is_dir():
        kind = "a link" if rejected.is_symlink() else "a file"
        return f"{what} are not kept: {rejected} is {kind}, not a folder; move it aside to keep them next time"
    shutil.rmtree(rejected, ignore_errors=True)
    try:
        staging.path.rename(rejected)
    except OSError as exc:  # the staging folder is removed on the way out
        return f"{what} are not kept: they could not be moved to {rejected} ({exc.strerror or exc})"
    return f"{what} are left in {rejected} for inspection"


def _source_fields(source: dict[str, Any] | None) -> dict[str, Any]:
    source = source or {}
    return {"file": source.get("file"), "epoch": source.get("epoch"), "sha256": source.get("sha256")}


def write_source(export: ExportDir, source: dict[str, Any] | None) -> None:
    """source.json: the weights the export came from, and the sha256 of each of its own files."""
    digests = {
        p.relative_to(export.path).as_posix(): sha256_file(p)
        for p in sorted(export.path.rglob("*"))
        if p.is_file() and p != export.source
    }
    record = {"weights": _source_fields(source), "exported_at": now_iso(), "files": digests}
    export.source.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# How TensorFlow and HDF5 report a write that the file system refused: text, not an errno.
_STORAGE_TEXT = {
    "No space left on device": errno.ENOSPC,
    "Disk quota exceeded": errno.EDQUOT,
    "File too large": errno.EFBIG,
    "Read-only file system": errno.EROFS,
    "Permission denied": errno.EACCES,
}


def storage_cause(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write (an OSError itself, or TensorFlow's ResourceExhaustedError /
    PermissionDeniedError naming the cause); None for anything that is not a storage problem."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc
    if not (isinstance(exc, OSError) or type(exc).__module__.startswith("tensorflow")):
        return None  # this package's own errors, and anything else, are not rewritten
    text = str(exc)
    for phrase, code in _STORAGE_TEXT.items():
        if phrase in text:
            return OSError(code, os.strerror(code))
    if type(exc).__name__ == "ResourceExhaustedError":  # TensorFlow's name for ENOSPC when writing
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return exc if isinstance(exc, OSError) else None


def _swap_into_place(staging: Path, final: Path) -> None:
    """Put the staged export at `final` with no moment at which neither export is complete there.

    Where the file system can, the two folders are exchanged in one step (renameat2 RENAME_EXCHANGE)
    and the staging name then holds the old export, removed after. Elsewhere: the old export is
    renamed to export.previous (which the next export restores if a kill came between the renames).
    Signals wait until this is done.
    """
    blocked = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        if not final.exists():
            staging.rename(final)
        elif _exchange(staging, final):
            shutil.rmtree(staging, ignore_errors=True)
        else:
            previous = _previous(final)
            shutil.rmtree(previous, ignore_errors=True)
            final.rename(previous)
            staging.rename(final)
            shutil.rmtree(previous, ignore_errors=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _refuse_other_than_a_folder(final: Path) -> None:
    """ExportError when run_dir/export is a link or a file: the swap would move it aside under a staging
    name that nothing shows or cleans, and a link's target (a serving folder, say) would silently never
    get the new export."""
    if final.is_symlink():
        raise ExportError(
            f"{final} is a link to {os.readlink(final)}: export writes a folder of its own there and would "
            "replace the link, leaving its target as it is; remove the link, export, then copy the folder "
            "where the link pointed"
        )
    if final.exists() and not final.is_dir():
        raise ExportError(f"{final} is a file, not the folder export writes: move it aside and export again")


def _previous(final: Path) -> Path:
    return final.with_name(final.name + ".previous")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def clean_stale_exports(run_dir: Path) -> list[Path]:
    """Remove staging folders left by a killed export; put back an export.previous left between two renames.

    Call only while holding the run's lock: then no live process is writing any of them.
    """
    files = RunDir(run_dir)
    final, previous = files.export.path, _previous(files.export.path)
    removed = []
    if previous.is_dir():
        if final.exists():
            shutil.rmtree(previous, ignore_errors=True)
            removed.append(previous)
        else:
            previous.rename(final)
    for p in files.path.glob(f"{final.name}{TMP_MARK}*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _again(command: str) -> str:
    return f"run `{command}` again"


class _SignalStop:
    """SIGTERM, SIGHUP and SIGINT end the `export` command by an exception, so its staging folder goes.

    The handler only notes the signal; `check()` between the steps of the export raises it. An
    exception raised by a handler while TensorFlow's C++ code calls back into Python comes out as
    a SystemError instead, so it is raised at once only inside `at_once()`: around the wait for
    the parity process, which subprocess.run then kills.

    Installed only where nobody else handles the signals (SIGTERM would kill the process at
    once): inside `fit` they set the stop flag, and the export, the last step of a run, finishes.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    active: _SignalStop | None = None  # the export's, for at_once() and the command it says to run again

    def __init__(self, again: str) -> None:
        self.again = again  # what the stopped export's message ends with: the command to run again
        self.signum: int | None = None
        self.immediate = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalStop:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            for sig in self.SIGNALS:
                if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                    self.previous[sig] = signal.signal(sig, self._noted)
        _SignalStop.active = self  # installed or not (inside fit): what a stopped parity check says to run
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if _SignalStop.active is self:
            _SignalStop.active = None

    def _noted(self, signum, _frame) -> None:
        self.signum = signum
        if self.immediate:
            self.check()

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(
                f"export stopped by {signal.Signals(self.signum).name}: the previous export is unchanged; {self.again}"
            )

    @staticmethod
    @contextlib.contextmanager
    def at_once() -> Iterator[None]:
        """Inside: a signal raises at once (only pure-Python waits belong here)."""
        stop = _SignalStop.active
        if stop is None:
            yield
            return
        stop.check()
        stop.immediate = True
        try:
            yield
        finally:
            stop.immediate = False


def no_weights_why(manifest: dict, name: str, runs_dir: object = None) -> str:
    """Why a run has no weights file, and the fix: it never finished an epoch (resume or train), or
    its manifest counts finished epochs and the files were moved or deleted since (`runs_dir`: where
    the command found the run, for the resume command)."""
    done, name = manifest.get("epochs_completed"), name + runs_dir_flag(runs_dir)
    if type(done) is int and done > 0:
        return (
            f"although {done} epoch(s) finished: the files were moved or deleted; put them back, or if its "
            f"checkpoints are there, `python -m train --resume {name}` writes final.weights.h5 from the last one"
        )
    return f"because no epoch finished: resume it with `python -m train --resume {name}`, or train a new run"


def rebuild_model(run_dir: Path, runs_dir: object = None):
    """The run's model with its best (else final) weights, verified against their recorded sha256
    (`runs_dir`: where the command found the run, for the command a damaged file's message gives).

    Returns (model, class names, source): source is {"file", "sha256", "epoch"} of the weights loaded.
    """
    from ..models import build_model, float32_policy
    from ..run.weights import load_weights

    files = RunDir(run_dir)
    settings = read_run_settings(run_dir, need_data=False)  # the model and weights: the data may have moved
    manifest = files.read_manifest()
    weights = files.weights()
    if not weights:
        ended = manifest.get("status") or "unknown"
        error = f": {manifest['error']}" if manifest.get("error") else ""
        raise NoWeightsError(
            f"run {run_dir.name} has no weights (no {files.best_weights.name} or {files.final_weights.name}; "
            f"its status: {ended}{error}) {no_weights_why(manifest, run_dir.name, runs_dir)}"
        )
    class_names, input_shape = files.data_description()
    with float32_policy():  # see float32_copy: the export serves in float32
        model = build_model(settings.model, input_shape, len(class_names))
    source = load_weights(model, run_dir, weights[0], runs_dir)
    return model, class_names, source


class ExportCallback:
    """The export as the loop sees it (train.training.callbacks): at a run's start, the staging folders
    a killed export left (the run holds its lock by then); once every epoch is trained, the export of
    the trained model when EXPORT is on (`result.export` is what it recorded)."""

    def __init__(self, settings):
        self.settings = settings

    def on_start(self, run_dir: Path) -> None:
        for p in clean_stale_exports(run_dir):
            log.info("removed a staging folder left by an interrupted export: %s", p.name)

    def on_complete(self, result) -> None:
        if self.settings.export:
            result.export = export_run(result.run_dir, model=result.model, settings=self.settings)


def export_run(run_dir: Path, model=None, settings=None, command: str = "") -> dict[str, Any]:
    """Export a run's best weights (else `model`'s current ones, else final.weights.h5) in float32.

    The trained model passed in is never modified: the export is a float32 copy of it. Staging
    folders left by a killed export are removed first (the caller holds the run's lock).
    `settings` say which formats beyond the SavedModel (other_formats); None: the SavedModel alone.
    `command`: what a stopped export says to run again (export_model).
    """
    from ..run.weights import verify

    run_dir = Path(run_dir)
    runs_dir = found_in(getattr(settings, "runs_dir", None), run_dir)  # where the run is, for messages
    formats = other_formats(settings, run_dir)
    if formats is not None:
        formats.check()  # before any conversion
    files = RunDir(run_dir)
    for p in clean_stale_exports(run_dir):
        log.info("removed a staging folder left by an interrupted export: %s", p.name)
    if model is None or files.best_weights.is_file():
        export, labels, source = rebuild_model(run_dir, runs_dir)
        described = f"{source['file']} (epoch {source['epoch']}, sha256 {source['sha256'][:12]})"
    else:
        run_settings = read_run_settings(run_dir, need_data=False)
        export, described = float32_copy(model, run_settings.model), "the trained model"
        labels = files.data_description()[0]
        # At the end of fit the model in memory is what final.weights.h5 was just written from.
        source = verify(run_dir, files.final_weights, runs_dir=runs_dir) if files.final_weights.is_file() else None
    log.info("export: from %s", described)
    return export_model(export, run_dir, labels, source, formats, command, runs_dir)
