"""What the export calls: LiteRT and ONNX files beside the SavedModel, each checked in a fresh process.

The core's export (train.results.export) finds this module through train.extras and asks
`Formats.from_settings` what to write; it calls `write` once the SavedModel passed its own check,
and asks `Formats.files` which files of a previous export are its own (they are kept when made from
the same weights). Each format is converted into the staging folder of the export, then run by
train.formats.runtime_check in a fresh process of EXPORT_CHECK_PYTHON (numpy and the format's own
runtime only) on the parity batch. Its largest difference from the reloaded SavedModel's answers
goes into parity.json; above the format's tolerance, or with any output not finite, the file is
removed and the format is reported as failed. A converter that cannot express the model
(ConversionError) fails only its own format: the others are still written and checked.

The quantised LiteRT file (export/model.<mode>.tflite) is not held to a tolerance against the
float model (quantisation changes the answers by design); it is refused only when an output is
not finite, and its accuracy change on the validation set is recorded instead.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import train

from ..errors import ConfigError, DataError, ExportError, first_line
from ..run.rundir import ExportDir
from . import litert, onnx_export
from .settings import QUANTIZE_MODES, wanted

log = logging.getLogger("train")

# Largest |difference| in a probability against the reloaded SavedModel on the parity batch. Both
# runtimes reorder float32 sums (XNNPACK, MLAS) against TensorFlow's oneDNN kernels, so the
# SavedModel's own 1e-5 would fail at random on a deeper network; 1e-4 is still far below any
# change of a predicted class the user could notice.
TOLERANCE = {"litert": 1e-4, "onnx": 1e-4}
FILES = {"litert": "model.tflite", "onnx": "model.onnx"}
CALIBRATION_IMAGES = 300


def quantized_file(mode: str) -> str:
    return f"model.{mode}.tflite"


# Every file this extra may put into an export.
EXPORT_FILES = (*FILES.values(), *(quantized_file(m) for m in QUANTIZE_MODES[1:]))


@dataclass(frozen=True)
class Formats:
    """The formats one export writes beyond the SavedModel (none: it only keeps a previous export's files)."""

    wanted: tuple[str, ...] = ()  # litert, onnx: in the order they are written
    quantize: str = "none"
    check_python: str = ""
    data: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # for EXPORT_QUANTIZE
    given: str = ""  # EXPORT_FORMATS as the user gave it, for the messages
    files: ClassVar[tuple[str, ...]] = EXPORT_FILES

    @classmethod
    def from_settings(cls, settings, run_dir: Path | None = None) -> Formats:
        """EXPORT_FORMATS, EXPORT_QUANTIZE and EXPORT_CHECK_PYTHON (no settings: none wanted); `run_dir`'s
        data calibrates a quantised file, read only once the float files passed."""
        if settings is None:
            return cls()
        formats = wanted(settings.export_formats, settings.export_quantize)
        data = None
        if settings.export_quantize != "none" and run_dir is not None:
            data = lambda: quantize_data(run_dir)  # noqa: E731
        others = tuple(f for f in formats if f != "savedmodel")
        return cls(others, settings.export_quantize, settings.export_check_python, data, settings.export_formats)

    def check(self, given_as: Mapping[str, str] | None = None) -> None:
        """Refuse EXPORT_FORMATS now, before anything is trained or converted, when a runtime is missing;
        `given_as`: setting -> the command-line flag it came from (the message names what was typed)."""
        given_as, python = given_as or {}, parity_python(self.check_python)
        # litert asked for by EXPORT_QUANTIZE alone is named as that: EXPORT_FORMATS=savedmodel is not what to fix.
        named = wanted(self.given) if self.given else self.wanted
        implied = tuple(f for f in self.wanted if f not in named)
        asked = tuple(f for f in self.wanted if f not in implied)
        require_runtimes(python, asked, given_as.get("export_formats", "EXPORT_FORMATS"), self.given)
        require_runtimes(python, implied, given_as.get("export_quantize", "EXPORT_QUANTIZE"), self.quantize)

    def write(
        self, model, staging: ExportDir, work: Path, *, serving, at_once
    ) -> tuple[dict[str, Any], list[ExportError]]:
        """Convert and check each wanted format into `staging`; returns (records, failures).

        `work` holds x.npy and y.npy: the parity batch and the SavedModel's answers to it. `data` gives
        (calibration images, validation images, validation labels), uint8, for EXPORT_QUANTIZE.
        `serving(model)` gives the function every format computes and its input signature (the export's,
        so that all formats agree). `at_once` is the export's context in which a stop signal ends a child
        process at once.
        """

        def run(cmd: list[str]) -> subprocess.CompletedProcess:
            with at_once():
                return _run(cmd)

        x, reference = np.load(work / "x.npy"), np.load(work / "y.npy")
        records: dict[str, Any] = {}
        failures: list[ExportError] = []
        python = parity_python(self.check_python)
        for fmt in self.wanted:
            path = staging.path / FILES[fmt]
            try:
                _convert(fmt, model, staging, path, serving)
                out = _answers(run, python, fmt, path, x, work)
                records[fmt] = _compare(fmt, path, out, reference)
            except ExportError as exc:
                path.unlink(missing_ok=True)  # a refused or half-written file never stays in the export
                failures.append(exc)  # said once, in the ExportError that names every failure at the end
                continue
            log.info("export: %s (%s, max |diff| %.2e)", path.name, _mb(path), records[fmt]["max_abs_diff"])
            if fmt == "litert" and self.quantize != "none":
                try:
                    records[f"litert-{self.quantize}"] = _quantized(
                        run, python, model, staging, self.quantize, x, reference, work, self.data
                    )
                except ExportError as exc:
                    (staging.path / quantized_file(self.quantize)).unlink(missing_ok=True)
                    failures.append(exc)
        return records, failures

    @property
    def asked(self) -> tuple[str, ...]:
        """The files this export makes: a previous export's copy of one is never kept in its place (it
        is made again, or it failed now, and then the previous export stays whole)."""
        quantized = (quantized_file(self.quantize),) if self.quantize != "none" else ()
        return (*(FILES[f] for f in self.wanted if f in FILES), *quantized)

    @staticmethod
    def again(dropped: list[str], run: str) -> str:
        """The export commands that make `dropped` (files of EXPORT_FILES) of `run` again: one per
        quantised mode, since --quantize takes one (the second keeps what the first made)."""
        fmts = sorted({"litert" if n.endswith(".tflite") else "onnx" for n in dropped})
        modes = sorted({n.split(".")[1] for n in dropped if n.count(".") == 2})
        first = f"export {run} --format {','.join(fmts)}" + (f" --quantize {modes[0]}" if modes else "")
        if len(modes) < 2:
            return f"{first} makes them"
        return f"`{first}` then `export {run} --quantize {modes[1]}` make them"


# Made by scripts/venv-runtime-check.sh (scripts/venv.sh --extra onnx makes it too): numpy and the
# runtimes, without TensorFlow. Found beside the package, as a checkout has it.
RUNTIME_VENV = Path(train.__file__).resolve().parent.parent / ".venv-runtime-check"


def parity_python(setting: str = "") -> str:
    """The Python that runs the parity check: EXPORT_CHECK_PYTHON, else the runtime environment the
    set-up made, else this Python (the check refuses TensorFlow at import wherever it runs)."""
    if setting:
        return setting
    made = RUNTIME_VENV / "bin" / "python"
    try:
        return str(made) if made.is_file() else sys.executable
    except OSError as exc:  # the folder is there but this user cannot look into it
        raise ConfigError(
            "EXPORT_CHECK_PYTHON",
            setting,
            f"empty, and {made} cannot be looked at ({exc.strerror or exc}): give that folder this user's "
            "read permission, or name another Python that has the runtimes",
        ) from None


def require_runtimes(python: str, formats: tuple[str, ...], name: str, value: str) -> None:
    """Refuse `name=value` (EXPORT_FORMATS, --format) before anything is trained or converted when
    `python` lacks the runtime of one of its formats.

    One short process of `python` looks for the modules (none imported): a missing runtime is said
    once, with the command that installs it, instead of after each conversion."""
    from .runtime_check import RUNTIMES

    wanted = {fmt: RUNTIMES[fmt] for fmt in formats if fmt in RUNTIMES}
    if not wanted:
        return
    absent = _absent_modules(python, list(wanted.values()))
    if missing := [fmt for fmt, module in wanted.items() if module in absent]:
        lacks = ", ".join(wanted[f].replace("_", "-") for f in missing)
        raise ConfigError(
            name,
            value,
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} checked by running the file without "
            f"TensorFlow, and {python} lacks {lacks}: {_RUNTIME_FIX}",
        )


_ANSWER = "runtime-check-modules:"  # the probe's answer starts so: any other program is no Python


# Answers already had in this process: a run checks its formats before training and again at its
# export, the export command before it looks for the run and again in export_run.
_ANSWERS: dict[tuple[str, tuple[str, ...]], set[str]] = {}


def _absent_modules(python: str, modules: list[str]) -> set[str]:
    """Which of `modules` `python` lacks (none imported). ConfigError naming EXPORT_CHECK_PYTHON when
    it is no Python at all (missing, a folder, /bin/true): not a missing runtime, nor a converter's fault."""
    key = (python, tuple(modules))
    if key in _ANSWERS:
        return _ANSWERS[key]
    if shutil.which(python) is None:
        path = Path(python)
        why = "is a directory" if path.is_dir() else "is not executable" if path.exists() else "does not exist"
        raise _not_a_python(python, why)
    code = f"import importlib.util as u, sys; print({_ANSWER!r}, *(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    try:
        proc = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # no answer says nothing of the runtimes: never "lacks"
        raise ConfigError(
            "EXPORT_CHECK_PYTHON",
            python,
            f"gave no answer within {exc.timeout:g} s when asked whether it has {', '.join(modules)} (it hangs at "
            f"start, or the machine is too busy), so whether the runtimes are there is not known: run "
            f"`{shlex.quote(python)} -c 'import {modules[0]}'` to see what it waits for, then the command again",
        ) from None
    except OSError as exc:
        raise _not_a_python(python, f"cannot be run ({exc.strerror or exc})") from None
    answer = next((line.split()[1:] for line in proc.stdout.splitlines() if line.startswith(_ANSWER)), None)
    if proc.returncode != 0 or answer is None:
        said = first_line(proc.stderr) or f"exit status {proc.returncode}, no answer"
        raise _not_a_python(python, f"is not a Python that runs (`-c` gave: {said})")
    _ANSWERS[key] = set(answer)
    return _ANSWERS[key]


def _not_a_python(python: str, why: str) -> ConfigError:
    return ConfigError(
        "EXPORT_CHECK_PYTHON",
        python,
        f"{why}: the LiteRT/ONNX parity check runs in it; give the path of a Python that has their runtimes "
        "(.venv-runtime-check/bin/python, which scripts/venv-runtime-check.sh makes), or leave it empty",
    )


_RUNTIME_FIX = (
    "run scripts/venv-runtime-check.sh (it makes .venv-runtime-check, which the export then uses by itself), "
    "or set EXPORT_CHECK_PYTHON to a Python that has the runtimes"
)


def _convert(fmt: str, model, staging: ExportDir, path: Path, serving) -> None:
    if fmt == "litert":
        litert.convert(staging.savedmodel, path)
    else:
        serve, signature = serving(model)
        onnx_export.convert(serve, signature, path)


def _answers(run, python: str, fmt: str, path: Path, x: np.ndarray, work: Path) -> np.ndarray:
    """The file's probabilities for `x`, computed in a fresh process of `python` without TensorFlow."""
    x_path, out_path = work / f"{fmt}-x.npy", work / f"{fmt}-out.npy"
    np.save(x_path, x)
    out_path.unlink(missing_ok=True)
    cmd = [python, "-m", "train.formats.runtime_check", fmt, str(path), str(x_path), str(out_path)]
    try:
        proc = run(cmd)
    except subprocess.TimeoutExpired as exc:  # a runtime that hangs on the file fails its format alone
        raise ExportError(
            f"{fmt}: {path.name} does not run in {python} without TensorFlow (no answer within {exc.timeout:g} s): "
            f"leave {fmt} out of EXPORT_FORMATS / --format, or report the converter bug"
        ) from None
    if proc.returncode != 0 or not out_path.is_file():
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        if proc.returncode == 3:
            fix = _RUNTIME_FIX
        elif proc.returncode == 0:  # it ended well without answering: no checker ran, the file is not to blame
            fix = "it wrote no answers: set EXPORT_CHECK_PYTHON to a Python that runs train.formats.runtime_check, or leave it empty"
        else:
            fix = f"leave {fmt} out of EXPORT_FORMATS / --format, or report the converter bug"
        raise ExportError(f"{fmt}: {path.name} does not run in {python} without TensorFlow ({tail[0]}): {fix}")
    return np.load(out_path)


def _compare(fmt: str, path: Path, out: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    _finite(fmt, path, out)
    if out.shape != reference.shape:
        raise ExportError(
            f"{fmt}: {path.name} answers shape {out.shape}, the SavedModel {reference.shape}: report the converter bug"
        )
    diff = float(np.max(np.abs(out.astype(np.float64) - reference.astype(np.float64))))
    if diff > TOLERANCE[fmt]:
        raise ExportError(
            f"{fmt}: {path.name} differs from the SavedModel by {diff:.3g} (> {TOLERANCE[fmt]}) on the parity batch, "
            f"so it was removed: leave {fmt} out of EXPORT_FORMATS / --format, or report the converter bug"
        )
    return {"file": path.name, "bytes": path.stat().st_size, "max_abs_diff": diff, "tolerance": TOLERANCE[fmt]}


def _finite(fmt: str, path: Path, out: np.ndarray) -> None:
    if not np.isfinite(out).all():
        raise ExportError(
            f"{fmt}: {path.name} gives NaN/inf probabilities on the parity batch ({int((~np.isfinite(out)).sum())} "
            f"of {out.size} values), so it was removed: leave {fmt} out of EXPORT_FORMATS / --format"
        )


def _quantized(run, python, model, staging: ExportDir, mode: str, x, reference, work: Path, data) -> dict[str, Any]:
    """model.<mode>.tflite, its size, its difference on the parity batch and its accuracy change."""
    path = staging.path / quantized_file(mode)
    try:
        calibration, x_val, y_val = data() if data is not None else (np.zeros((0,), np.uint8),) * 3
    except DataError as exc:  # calibration and accuracy need the run's data; the float files do not
        raise ExportError(f"litert-{mode}: {exc} (its data calibrates and measures the quantised file)") from None
    litert.convert(staging.savedmodel, path, mode, [calibration[i : i + 32] for i in range(0, len(calibration), 32)])
    fmt = f"litert-{mode}"
    out = _answers(run, python, "litert", path, x, work)
    _finite(fmt, path, out)
    record: dict[str, Any] = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "max_abs_diff": float(np.max(np.abs(out.astype(np.float64) - reference.astype(np.float64)))),
        "tolerance": None,
    }
    if len(y_val):
        quantized = _answers(run, python, "litert", path, x_val, work)
        _finite(fmt, path, quantized)
        expected = np.asarray(model.predict(x_val.astype(np.float32), batch_size=256, verbose=0))
        before, after = _accuracy(expected, y_val), _accuracy(quantized, y_val)
        record.update(validation_images=int(len(y_val)), accuracy=before, accuracy_quantized=after)
        record["accuracy_change"] = after - before
        log.info("export: %s (%s, validation accuracy %.4f -> %.4f)", path.name, _mb(path), before, after)
    return record


def _accuracy(probabilities: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))


def _mb(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.2f} MB"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    # Only the package root on the path: the check must not see this process's site-packages.
    root = str(Path(train.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def quantize_data(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CALIBRATION_IMAGES training images and the whole validation set, uint8, read as the run read them."""
    from ..inputs import pipeline as data
    from ..run.rundir import read_run_settings

    # A moved data set is load_data's DataError (the quantised file is left out, the float ones kept),
    # not a config.json refused as damaged.
    settings = read_run_settings(run_dir, need_data=False)
    spec = data.load_data(settings)
    calibration = []
    for images, _ in data.train_dataset(spec, settings, epoch=0, batch_size=100):
        calibration.append(np.asarray(images).round().clip(0, 255).astype(np.uint8))
        if sum(len(c) for c in calibration) >= CALIBRATION_IMAGES:
            break
    xs, ys = [], []
    for images, labels in data.val_dataset(spec, settings, batch_size=256):
        xs.append(np.asarray(images).round().clip(0, 255).astype(np.uint8))
        ys.append(np.asarray(labels))
    shape = (0, *spec.input_shape)
    x_val = np.concatenate(xs) if xs else np.zeros(shape, np.uint8)
    y_val = np.concatenate(ys) if ys else np.zeros((0,), np.int64)
    return np.concatenate(calibration)[:CALIBRATION_IMAGES], x_val, y_val
