"""Shared pieces of the benchmarks: the data, the template's parts, side-by-side timing, records."""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def mnist_path() -> Path | None:
    """The real MNIST (Keras-format .npz) named by MNIST_NPZ, or None."""
    value = os.environ.get("MNIST_NPZ")
    return Path(value) if value and Path(value).is_file() else None


def generated_mnist(n_train: int = 60000, n_test: int = 10000, seed: int = 0) -> dict[str, np.ndarray]:
    """MNIST-shaped uint8 data (28x28, 10 classes) that a CNN can learn: a digit-like bar per class."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for k in range(10):
            rows = np.flatnonzero(y == k)
            r, c = 3 + (k // 5) * 12, 2 + (k % 5) * 5
            x[rows, r : r + 10, c : c + 3] = 230
        out[f"x_{split}"], out[f"y_{split}"] = x, y
    return out


def mnist_arrays(quick: bool) -> tuple[dict[str, np.ndarray], str]:
    """(arrays, description): real MNIST when MNIST_NPZ points at it, generated otherwise."""
    path = mnist_path()
    if path:
        with np.load(path) as z:
            arrays = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
        what = f"MNIST ({path.name})"
    else:
        arrays, what = generated_mnist(), "generated MNIST-shaped data"
    if quick:
        arrays = {
            "x_train": arrays["x_train"][:2048],
            "y_train": arrays["y_train"][:2048],
            "x_test": arrays["x_test"][:512],
            "y_test": arrays["y_test"][:512],
        }
        what += ", quick subset 2048/512"
    return arrays, what


def write_npz(arrays: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def settings(**values: Any):
    """Template settings from defaults plus `values`, ignoring any .env and the environment."""
    from train.config import load_settings

    values.setdefault("progress", "line")
    return load_settings(values, env_file=None, environ={})


def run_manifest(result) -> dict:
    """A `train.train` run's manifest.json."""
    import json

    return json.loads((Path(result.run_dir) / "manifest.json").read_text(encoding="utf-8"))


def test_accuracy(result) -> float | None:
    """A `train.train` run's accuracy on the test split through its final weights, as its manifest
    records it: what the recipe's figure measures (the history's val_accuracy is the validation
    data held out of the training split)."""
    from train.training.test_split import on_test

    return (on_test(run_manifest(result), "final") or {}).get("accuracy")


def median(values) -> float:
    return float(statistics.median(values))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def interleave(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call each runner in turn, `repeats` rounds, alternating who goes first; lists of results."""
    names = list(runs)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names if r % 2 == 0 else names[::-1]:
            out[n].append(runs[n]())
    return out


def record(benchmark, name: str, goal: str, value: float | None, passed: bool | None, **figures: Any) -> None:
    """Store one comparison in pytest-benchmark's extra_info (summarise.py reads these keys)."""
    benchmark.extra_info.update(
        {
            "comparison": name,
            "goal": goal,
            "ratio": value,
            "passed": passed,
            **{k: _plain(v) for k, v in figures.items()},
        }
    )


def _plain(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def once(benchmark, fn: Callable[[], Any]) -> Any:
    """Run `fn` once under pytest-benchmark (its time is the whole comparison's wall time)."""
    return benchmark.pedantic(fn, rounds=1, iterations=1, warmup_rounds=0)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def resolve_precision(requested: str = "auto") -> tuple[str, str]:
    """(policy, reason) as `train.training.fit` resolves PRECISION on this machine, oneDNN variables and
    the bfloat16 probe included (measured in this process, not read from a run directory's cache). One
    probe a process: every side of a comparison trains in the same precision, even where a loaded
    machine would make two probes disagree."""
    from train.setup.hardware import choose_precision, cpu_flags, onednn_enabled, onednn_max_isa

    return choose_precision(requested, gpu_capabilities(), cpu_flags(), onednn_enabled(), onednn_max_isa(), _bf16_probe)


def as_a_new_run(s):
    """`s` with the BATCH_SIZE and LEARNING_RATE a new run takes on this machine when it sets neither
    (train.training.fit; the probe measured here, not read from a cache)."""
    from train.config import given
    from train.setup.devices import batch_choice

    if {"batch_size", "learning_rate"} & given(s):
        return s
    batch, rate, _ = batch_choice(s, _bf16_probe)
    return s.replace(batch_size=batch, learning_rate=rate)


@functools.cache
def _bf16_probe() -> tuple[float | None, str]:
    """The bfloat16 probe, once a benchmark process (each call takes seconds)."""
    from train.setup.hardware import measure_bf16_speedup

    return measure_bf16_speedup(), "probe measured now"


def cpu_family(flags=None, max_isa: str | None = "unset") -> str:
    """This machine's CPU family (train.setup.hardware.cpu_family), or that of the flags and cap given."""
    from train.setup import hardware

    flags = hardware.cpu_flags() if flags is None else flags
    return hardware.cpu_family(flags, hardware.onednn_max_isa() if max_isa == "unset" else max_isa)


def template_parts(s, policy: str | None = None):
    """(spec, compiled model) built as `train.training.fit` builds them, under `policy` (default: what
    PRECISION resolves to on this machine). For side-by-side epochs without a run directory."""
    import keras

    from train import models
    from train.inputs import pipeline as data

    policy = policy or resolve_precision(s.precision)[0]
    keras.mixed_precision.set_global_policy(policy)
    spec = data.load_data(s)
    model = models.build_model(s.model, spec.input_shape, spec.num_classes)
    from train.training.schedules import OverTraining, needs_schedule

    lr: Any = s.learning_rate
    if needs_schedule(s.lr_schedule, s.lr_warmup_epochs):
        per_epoch = data.steps_per_epoch(spec, s.batch_size)
        lr = OverTraining(s.learning_rate, s.epochs, per_epoch, s.lr_schedule, s.lr_warmup_epochs)
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=s.jit_compile,
        steps_per_execution=s.steps_per_execution,
    )
    return spec, model


def gpu_capabilities() -> list[tuple[int, int]]:
    import tensorflow as tf

    out = []
    for g in tf.config.list_physical_devices("GPU"):
        cc = tf.config.experimental.get_device_details(g).get("compute_capability")
        if cc:
            out.append(tuple(cc))
    return out


def fit_epoch(model, ds, n: int) -> float:
    """Samples per second of one `model.fit` epoch over `ds` (n examples)."""
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0)
    return n / (time.perf_counter() - t0)


def throughput_row(
    steps_per_second: float,
    batch_size: int,
    count,  # train.training.flops.FlopCount
    device_name: str | None,
    dtype: str,
    measured_peak: float | None = None,
) -> dict:
    """The GPU benchmark's row beside its steps/s: model FLOP/s, and MFU against the datasheet peak of
    `device_name` in `dtype` (DATASHEET), else against `measured_peak`; MFU None when neither is known."""
    from train.training import flops

    achieved = steps_per_second * batch_size * count.train_per_example
    datasheet = flops.datasheet_peak(device_name, dtype)
    peak = datasheet or measured_peak
    return {
        "steps_per_second": steps_per_second,
        "model_flops_per_second": achieved,
        "dtype": dtype,
        "peak_flops": peak,
        "peak_source": "datasheet" if datasheet else ("measured" if measured_peak else None),
        "mfu": achieved / peak if peak else None,
    }
