"""Fault injection for the reliability tests: `python -m train fit` in a subprocess, killed on cue.

Also importable *inside* that subprocess (tests/ is on its PYTHONPATH): small model factories for
MODEL=faults:<function> (different widths, a loss that turns NaN after a few steps).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# -- running the CLI -----------------------------------------------------------------------------
def fit_flags(tmp_path: Path, npz: Path, **changes) -> list[str]:
    """Command-line flags for a CPU-sized run (like helpers.tiny_settings), `changes` by field name."""
    from helpers import tiny_values

    from train.config import as_flags

    return as_flags({**tiny_values(tmp_path, npz), **changes})


def env(**extra: str) -> dict[str, str]:
    from helpers import subprocess_env

    return subprocess_env(PYTHONPATH=f"{ROOT}{os.pathsep}{TESTS}", **extra)


# `python -m train` with module constants changed first: {"train.tracking.mlflow_run.FLUSH_SECONDS": 8.0}
# lets a test see a deadline end without waiting out the product's minute.
_SET_CONSTANTS = """
import importlib
for name, value in {constants!r}.items():
    module, attr = name.rsplit(".", 1)
    setattr(importlib.import_module(module), attr, value)
"""
_RUN_TRAIN = """
import runpy, sys
sys.argv = ["train", *sys.argv[1:]]
runpy.run_module("train", run_name="__main__")
"""


def with_constants(constants: dict, script: str | None = None) -> str:
    """A `python -c` program: set `constants` (dotted name -> value), then run `script` (default:
    `python -m train` with the program's arguments)."""
    return _SET_CONSTANTS.format(constants=constants) + (script if script is not None else _RUN_TRAIN)


def start_fit(
    args: list[str], cwd: Path, extra_env: dict | None = None, preexec_fn=None, constants: dict | None = None
) -> subprocess.Popen:
    """`python -m train fit ARGS` in the background; stdout+stderr go to cwd/fit-<n>.out. `constants`
    (dotted name -> value) are set in the child before the command runs."""
    n = len(list(cwd.glob("fit-*.out")))
    out = open(cwd / f"fit-{n}.out", "w")
    start = ["-c", with_constants(constants)] if constants else ["-m", "train"]
    proc = subprocess.Popen(
        [sys.executable, *start, "fit", *args],
        cwd=cwd,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env(**(extra_env or {})),
        preexec_fn=preexec_fn,
    )
    proc.out_path = cwd / f"fit-{n}.out"  # type: ignore[attr-defined]
    out.close()
    return proc


def output(proc: subprocess.Popen) -> str:
    return proc.out_path.read_text()  # type: ignore[attr-defined]


def run_fit(args: list[str], cwd: Path, timeout: float = 180, **kw) -> tuple[int, str]:
    """Run to the end; (exit code, combined output)."""
    proc = start_fit(args, cwd, **kw)
    rc = proc.wait(timeout=timeout)
    return rc, output(proc)


def run_python(
    code: str, cwd: Path, timeout: float = 180, preexec_fn=None, **extra_env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env(**extra_env),
        timeout=timeout,
        preexec_fn=preexec_fn,
    )


def file_modes_apply():
    """A preexec_fn under which file modes bind even for root (mode 000 denies), or None if they already do.

    root reads any file through two capabilities, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH; the
    child drops them from its bounding set, so the program it runs never has them. Skips the test
    where that is not allowed (no CAP_SETPCAP)."""
    import pytest

    if os.geteuid() != 0:
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    try:
        subprocess.run([sys.executable, "-c", ""], preexec_fn=drop, check=True)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("running as root without CAP_SETPCAP: cannot make file modes bind")
    return drop


# -- watching a run ------------------------------------------------------------------------------
def only_run(runs_dir: Path) -> Path:
    from train.run.find import list_run_dirs

    runs = list_run_dirs(runs_dir)
    assert len(runs) == 1, runs
    return runs[0]


def states(run_dir: Path) -> list[str]:
    d = run_dir / "checkpoints"
    # Complete states only: a kill during a write leaves ckpt-<step>.tmp-<random>.npz (cleaned at the next start).
    return sorted(p.name for p in d.glob("ckpt-*.npz") if ".tmp-" not in p.name) if d.is_dir() else []


def step_of(name: str) -> int:
    return int(name[len("ckpt-") : -len(".npz")])


def wait_until(predicate, proc: subprocess.Popen, timeout: float = 120, poll: float = 0.005) -> bool:
    """Poll until predicate() is true (True) or the process exits first (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return bool(predicate())
        time.sleep(poll)
    raise TimeoutError("the run neither reached the point nor exited")


def kill_after_new_checkpoint(proc, runs_dir: Path, delay: float, sig=signal.SIGKILL) -> bool:
    """Once a checkpoint newer than those present at start appears, wait `delay` s and send `sig`.

    True when the signal was sent to a live process; False when the run ended first.
    """

    def newest():
        from train.run.find import list_run_dirs

        return max((s for r in list_run_dirs(runs_dir) for s in states(r)), default=None)

    before = newest()
    if not wait_until(lambda: newest() not in (None, before), proc):
        return False
    time.sleep(delay)
    if proc.poll() is not None:
        return False
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return True


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def optimizer_iterations(ckpt: Path) -> int:
    """The optimizer's step counter stored in a checkpoint."""
    import numpy as np

    with np.load(ckpt) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        for i, (name, _shape) in enumerate(meta["optimizer_variables"]):
            if name.rsplit("/", 1)[-1] in ("iteration", "iterations"):
                return int(z[f"o{i:05d}"])
    raise KeyError("no optimizer iteration variable in " + str(ckpt))


# -- model factories for MODEL=faults:<name> (run inside the training subprocess) -----------------
def _dense(input_shape, num_classes, width):
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(width, activation="relu", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax", name="head")(x))


def dense16(input_shape, num_classes):
    return _dense(input_shape, num_classes, 16)


def dense32(input_shape, num_classes):
    return _dense(input_shape, num_classes, 32)


def nan_after_10_steps(input_shape, num_classes):
    """A model whose output turns NaN from its 11th training call on: the loss diverges mid-run."""
    import keras

    class PoisonAfter(keras.layers.Layer):
        def build(self, _shape):
            self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

        def call(self, x, training=False):
            if training:
                self.calls.assign_add(1.0)
            # A factor (not where(cond, x * nan, x)): the untaken branch would put NaN into the gradient.
            factor = keras.ops.where(keras.ops.greater(self.calls, 10.0), float("nan"), 1.0)
            return x * keras.ops.cast(factor, x.dtype)

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    x = PoisonAfter(name="poison")(keras.layers.Dense(16, activation="relu", name="hidden")(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax", name="head")(x))


# -- factories that break the model contract, for MODEL=faults:<name> -----------------------------
def logits(input_shape, num_classes):
    """Scores without a softmax: trained as if they were probabilities, it would learn nonsense."""
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="scores")(x))


def two_outputs(input_shape, num_classes):
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    head = keras.layers.Dense(num_classes, activation="softmax", name="head")
    return keras.Model(inputs, [head(x), keras.layers.Dense(num_classes, activation="softmax", name="aux")(x)])


def subclassed(input_shape, num_classes):
    """A subclassed model, never called: Keras knows neither its inputs nor its outputs."""
    import keras

    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.flat = keras.layers.Flatten()
            self.head = keras.layers.Dense(num_classes, activation="softmax")

        def call(self, x):
            return self.head(self.flat(x / 255.0))

    return Classifier()


def sequential_without_input(input_shape, num_classes):
    import keras

    return keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(num_classes, activation="softmax")])


def exits_0(input_shape, num_classes):
    os._exit(0)


def sys_exit_3(input_shape, num_classes):
    sys.exit(3)


def sys_exit_7(input_shape, num_classes):
    sys.exit(7)


def ctrl_c(input_shape, num_classes):
    raise KeyboardInterrupt


def subclassed_built(input_shape, num_classes):
    import numpy as np

    model = subclassed(input_shape, num_classes)
    model(np.zeros((1, *input_shape), "float32"))
    return model


def sequential_built(input_shape, num_classes):
    model = sequential_without_input(input_shape, num_classes)
    model.build((None, *input_shape))
    return model


def slow(input_shape, num_classes):
    """A factory that takes an hour (a large download, say); it says when it has started.

    It waits in short steps, as a download's loop does between chunks. The kernel may hand SIGTERM to
    any thread of the process (TensorFlow runs many); Python then runs its handler only once the main
    thread runs Python again, so one hour-long sleep would not see the stop until the hour is over."""
    import time

    Path("slow-factory.started").write_text(str(os.getpid()))  # in the run's working directory
    for _ in range(36000):
        time.sleep(0.1)
    return dense16(input_shape, num_classes)


def image_grid_output(input_shape, num_classes):
    """One value per class and pixel: the output of a segmentation model, not of a classifier."""
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(inputs))


def fixed_input_size(input_shape, num_classes):
    """Built for 32x32 RGB images whatever the data."""
    return dense16((32, 32, 3), num_classes)


def sigmoid(input_shape, num_classes):
    """Independent probabilities per class (multi-label), not one distribution over the classes."""
    import keras

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="sigmoid")(x))


def compiled(input_shape, num_classes):
    """Compiled as the Keras examples do: its optimizer and loss would be replaced by the template's."""
    model = dense16(input_shape, num_classes)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
