"""How much arithmetic a training step costs, and how close a run gets to the device's limit.

Model-FLOP utilisation (MFU) = achieved model FLOP/s / the device's peak FLOP/s. The count follows
the usual MFU convention: only the matrix multiplications of dense and convolution layers, 2 FLOPs
per multiply-add, and a training example costs 3x its forward pass (the backward pass computes the
gradients with respect to both the activations and the weights, each as large as the forward).
Element-wise layers (activations, pooling, normalisation) are a few percent of a CNN's work and are
left out, as in every published MFU figure; the layers that are not counted are listed, so a fork
with exotic layers knows the count is a lower bound.

The peak is a short matmul in the training precision on the training device, the measurement
`python -m train check` makes. One probe moves by 2x with the load of a shared machine, so the peak
is the best of PROBE_ROUNDS probes, measured once per machine, precision and TensorFlow version and
cached under RUNS_DIR/.cache/peak-flops/: every later run on that machine divides by the same
number, so their MFUs compare. PEAK_FLOPS=measure measures it again (and replaces the cached one);
a number sets it. On a GPU whose datasheet peak is known (DATASHEET), that peak is used instead, as
published MFU figures do, and the measured one is recorded beside it; the manifest says which one
the MFU divides by and where the measured one came from (`origin`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..run.manifest import now_iso
from ..setup.hardware import PROBE_N, measure_bf16_speedup, measure_peak_flops

log = logging.getLogger("train")

TRAIN_MULTIPLIER = 3  # forward + backward (activations) + backward (weights)
PROBE_ROUNDS = 5  # probes of PROBE_REPS matmuls each; the best is the machine's, the rest its load
PEAK_CACHE = "peak-flops"  # under RUNS_DIR/.cache
SPEEDUP_CACHE = "bf16-speedup"  # PRECISION=auto's probe on a CPU with native bfloat16, beside it


# Dense tensor-core peaks in TFLOP/s from NVIDIA's datasheets (SXM parts where there are two; no
# sparsity). Keyed by a substring of the name NVML/TensorFlow reports; checked in order. "tfloat32"
# is float32 as TensorFlow runs it on these GPUs by default (TF32 tensor cores, compute capability
# 8.0 and later; half the bfloat16 rate on every one of them, A10G's derived so); "float32" is the
# peak without tensor cores, for GPUs before them or with TF32 turned off.
DATASHEET: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"float32": 67.0, "tfloat32": 494.5, "bfloat16": 989.0, "float16": 989.0}),
    ("H100", {"float32": 67.0, "tfloat32": 494.5, "bfloat16": 989.0, "float16": 989.0}),
    ("A100", {"float32": 19.5, "tfloat32": 156.0, "bfloat16": 312.0, "float16": 312.0}),
    ("L4", {"float32": 30.3, "tfloat32": 60.0, "bfloat16": 121.0, "float16": 121.0}),
    ("A10G", {"float32": 31.2, "tfloat32": 35.0, "bfloat16": 70.0, "float16": 70.0}),
    ("V100", {"float32": 15.7, "float16": 125.0}),
    ("T4", {"float32": 8.1, "float16": 65.0}),
)


def compute_dtype(policy: str, tf32: bool = False) -> str:
    """The dtype the matmuls run in under a Keras precision policy; `tf32`: on a GPU with TensorFlow's
    TF32 execution on (its default), float32 is "tfloat32", which DATASHEET maps to the tensor-core
    peak where the GPU has one and to the float32 one elsewhere."""
    dtype = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(policy, "float32")
    return "tfloat32" if dtype == "float32" and tf32 else dtype


def datasheet_peak(device_name: str | None, dtype: str) -> float | None:
    """The published dense peak in FLOP/s for a GPU name and dtype, or None when not in DATASHEET."""
    for key, peaks in DATASHEET:
        if device_name and key in device_name:
            if dtype == "tfloat32" and dtype not in peaks:
                dtype = "float32"  # no TF32 tensor cores: TensorFlow runs plain float32 there
            return peaks[dtype] * 1e12 if dtype in peaks else None
    return None


@dataclass(frozen=True)
class Peak:
    flops: float | None  # FLOP/s of the whole set of replicas: what the MFU divides by
    source: str  # e.g. "measured: 1024x1024 float32 matmul on CPU, x1"
    measured_per_device: float | None = None
    datasheet_per_device: float | None = None
    origin: str = ""  # where measured_per_device comes from: "measured now ...", "cached from FILE (DATE)", ...

    def to_dict(self) -> dict:
        return asdict(self)


def choose_peak(
    measured: float | None, datasheet: float | None, devices: int, where: str, dtype: str, origin: str = ""
) -> Peak:
    """The datasheet peak when there is one (GPUs), else the measured one; times the devices in sync."""
    if datasheet:
        return Peak(
            datasheet * devices,
            f"datasheet: {datasheet / 1e12:g} TFLOP/s {dtype} per {where}, x{devices}",
            measured,
            datasheet,
            origin,
        )
    if measured:
        return Peak(
            measured * devices,
            f"measured: {PROBE_N}x{PROBE_N} {dtype} matmul on {where}, x{devices}",
            measured,
            None,
            origin,
        )
    return Peak(None, "unknown: the probe failed", None, None, origin)


def usable_cpus() -> int | None:
    """The CPUs this process may run on (taskset, a container's cpuset), which TensorFlow sizes its
    thread pools by; os.cpu_count() counts the machine's whatever this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return os.cpu_count()


def machine_key(where: str, dtype: str, environ: Mapping[str, str] | None = None) -> dict:
    """What the measured peak depends on: the device, the CPU and how many of its cores this process
    may use, the dtype, TensorFlow and oneDNN."""
    import tensorflow as tf

    from ..setup.hardware import cpu_model, onednn_enabled, onednn_max_isa

    return {
        "device": where,
        "cpu": cpu_model(),
        # Once "cpu_count", the machine's, under which a probe pinned to fewer cores was cached: renamed,
        # so such a cache no longer matches and is measured again.
        "usable_cpus": usable_cpus(),
        "dtype": dtype,
        "tensorflow": tf.__version__,
        # Once "onednn", read as on wherever TF_ENABLE_ONEDNN_OPTS was unset, so on AVX2-only CPUs a peak of
        # Eigen's kernels: renamed, so such a cache no longer matches and is measured again.
        "onednn_on": onednn_enabled(environ),
        "onednn_max_isa": onednn_max_isa(environ),
    }


def peak_cache_file(cache_dir: Path, key: Mapping, folder: str = PEAK_CACHE) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / folder / f"{digest}.json"


def _read_cached(path: Path, key: Mapping, field: str = "flops_per_device") -> tuple[float, str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    value = data[field]
    if data.get("key") != dict(key):
        raise ValueError("it was measured for another machine, precision or TensorFlow version")
    number = float(value) if isinstance(value, float) or (isinstance(value, int) and value < 1e300) else math.nan
    if isinstance(value, bool) or not (0 < number < math.inf):
        raise ValueError(f"{field} is {repr(value)[:40]}, not a positive number")
    if not isinstance(data["measured_at"], str):
        raise ValueError(f"measured_at is {data['measured_at']!r}, not a time")
    if data.get("beaten_by_a_run") and not data.get("short_batches_counted"):
        # Raised by a run of a version that counted an epoch's short last batch as a full one: a small
        # data set at a large batch "beat" the true peak.
        raise ValueError("it was raised by a run of an older version, which could overstate a run's speed")
    return number, data["measured_at"]


def cached_peak(
    cache_dir: Path, key: Mapping, probe: Callable[[], float], remeasure: bool = False
) -> tuple[float, str]:
    """(FLOP/s per device, where it came from): the cached measurement for `key`, else the best of
    PROBE_ROUNDS probes, then cached for the next run. A cache that cannot be read is measured again,
    with a warning; one that cannot be written leaves this run's measurement in use."""
    path = peak_cache_file(cache_dir, key)
    if not remeasure and (path.exists() or path.is_symlink()):
        try:
            flops, when = _read_cached(path, key)
            return flops, f"cached from {path} (measured {when})"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("WARNING: the cached peak %s cannot be used (%s): measuring it again", path, exc)
    probes = [probe() for _ in range(PROBE_ROUNDS)]
    best = max(probes)
    when = now_iso()
    record = {"key": dict(key), "flops_per_device": best, "probes": probes, "measured_at": when}
    if not _write_cache(path, record, "measured peak", "the next run measures again"):
        return best, f"measured now (best of {PROBE_ROUNDS} probes; not cached)"
    return best, f"measured now (best of {PROBE_ROUNDS} probes), cached in {path}"


def _write_cache(path: Path, record: dict, what: str, otherwise: str) -> bool:
    """Write a measurement to the cache; an unwritable cache is one warning (saying `otherwise`), never an error."""
    from ..run.files import shared_writes, write_json

    try:
        with shared_writes(path.parent):  # other runs sharing RUNS_DIR may measure at the same time
            write_json(path, record)
    except Exception as exc:
        log.warning("WARNING: the %s cannot be cached in %s (%s): %s", what, path, exc, otherwise)
        return False
    return True


def machine_cache(runs_dir: str) -> Path:
    """RUNS_DIR/.cache, where a machine's measurements (the peak, the bfloat16 probe) are shared by its
    runs; a bucket RUNS_DIR's local staging copy holds it."""
    from ..run.remote import local_dir
    from ..run.rundir import CACHE_DIR

    return local_dir(runs_dir) / CACHE_DIR


def cached_bf16_speedup(cache_dir: Path | None, probe: Callable[[], float] = measure_bf16_speedup) -> tuple[float, str]:
    """(bfloat16's speed over float32's on this CPU, where the figure came from), for PRECISION=auto:
    measured once per machine and TensorFlow version and cached under RUNS_DIR/.cache/bf16-speedup/,
    as the peak is, so every run on the machine (a resumed one too) makes the same choice.
    `cache_dir` None: measured, not cached (no local RUNS_DIR yet)."""
    if cache_dir is None:
        return probe(), "probe measured now, not cached"
    key = machine_key("CPU", "bfloat16 over float32")
    path = peak_cache_file(cache_dir, key, SPEEDUP_CACHE)
    if path.exists() or path.is_symlink():
        try:
            speedup, when = _read_cached(path, key, "speedup")
            return speedup, f"probe cached from {path}, measured {when}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("WARNING: the cached bfloat16 probe %s cannot be used (%s): measuring it again", path, exc)
    speedup = probe()
    when = now_iso()
    record = {"key": key, "speedup": speedup, "measured_at": when}
    if not _write_cache(path, record, "bfloat16 probe's figure", "the next run measures again"):
        return speedup, "probe measured now, not cached"
    return speedup, f"probe measured now, cached in {path}"


def bf16_probe(runs_dir: str) -> Callable[[], tuple[float, str]]:
    """PRECISION=auto's probe for a run under `runs_dir` (train.setup.hardware.choose_precision calls it
    only where it can matter): cached in RUNS_DIR/.cache, or measured uncached where the store of a
    bucket RUNS_DIR is not open yet (`train.train` with several workers opens it after their join).
    Asked twice (the batch a new run chooses, then its devices' precision), it answers the same."""

    @functools.cache
    def probe() -> tuple[float, str]:
        from ..errors import StorageError

        try:
            cache = machine_cache(runs_dir)
        except StorageError:
            cache = None
        return cached_bf16_speedup(cache)

    return probe


def beaten_peak(
    peak: Peak, achieved: float, devices: int, cache_dir: Path, where: str, dtype: str, probe: bool = True
) -> Peak | None:
    """The peak to divide by once a run's model FLOP/s (`achieved`, all devices) passed a measured one.

    A fraction of a peak cannot pass 1: a peak that a run beats was measured while the machine was
    busy. It is measured again now and replaced, in the cache too, by the larger of the new probes and
    the run's own rate per device (a floor of the true peak); `probe=False` takes the run's rate alone
    (a run that beats the peak it raised itself). None when the peak is not a measurement
    (a datasheet's or PEAK_FLOPS's: beating those means a wrong FLOP count or setting, not a busy probe)
    or when nothing was beaten."""
    if not peak.flops or achieved <= peak.flops or peak.measured_per_device is None or peak.datasheet_per_device:
        return None
    device = "/CPU:0" if where == "CPU" else "/GPU:0"
    try:
        probes = [measure_peak_flops(dtype, device) for _ in range(PROBE_ROUNDS if probe else 0)]
    except Exception:  # the run's own rate is still a floor of the peak
        probes = []
    best = max([achieved / devices, *probes])
    when = now_iso()
    key = machine_key(where, dtype)
    path = peak_cache_file(cache_dir, key)
    record = {"key": key, "flops_per_device": best, "probes": probes, "measured_at": when, "beaten_by_a_run": True}
    record["short_batches_counted"] = True  # samples/s counts an epoch's short last batch as what it holds
    origin = f"raised at {when}: a run reached {achieved / devices / 1e9:.1f} GFLOP/s per device"
    if _write_cache(path, record, "raised peak", "this run still divides by the new figure"):
        origin += f", cached in {path}"
    return Peak(best * devices, peak.source, best, None, origin)


def peak_for(setting: str, cache_dir: Path, where: str, dtype: str, devices: int) -> Peak:
    """The MFU's denominator under PEAK_FLOPS (auto, measure or FLOP/s per device; see the module's
    docstring) for `devices` replicas of `where` ("CPU" or the first GPU's name). Never raises: a
    probe that cannot run gives an unknown peak, and the run goes on without MFU."""
    if setting not in ("auto", "measure"):
        given = float(setting)
        return Peak(
            given * devices, f"PEAK_FLOPS: {given / 1e9:g} GFLOP/s per {where}, x{devices}", origin="PEAK_FLOPS"
        )
    device = "/CPU:0" if where == "CPU" else "/GPU:0"
    try:
        measured, origin = cached_peak(
            cache_dir, machine_key(where, dtype), lambda: measure_peak_flops(dtype, device), setting == "measure"
        )
    except Exception as exc:  # a probe that cannot run leaves MFU empty, the run goes on
        log.warning("WARNING: the peak FLOP/s probe failed (%s: %s): no MFU for this run", type(exc).__name__, exc)
        measured, origin = None, "the probe failed"
    return choose_peak(measured, datasheet_peak(where, dtype), devices, where, dtype, origin)


@dataclass(frozen=True)
class FlopCount:
    forward_per_example: int
    counted_layers: tuple[str, ...] = ()
    uncounted_layers: tuple[str, ...] = field(default=())  # layers with weights the count does not cover

    @property
    def train_per_example(self) -> int:
        return TRAIN_MULTIPLIER * self.forward_per_example

    def to_dict(self) -> dict:
        return {
            "train_per_example": self.train_per_example,
            "forward_per_example": self.forward_per_example,
            "convention": "matmul and convolution multiply-adds x2, training = 3x forward",
            "counted_layers": list(self.counted_layers),
            "uncounted_layers": list(self.uncounted_layers),
        }


def _shape(tensor) -> tuple:
    return tuple(int(d) if d is not None else 1 for d in tensor.shape)


def _layer_flops(layer) -> int | None:
    """Forward FLOPs per example of one layer, or None when this module does not know the layer."""
    kind = type(layer).__name__
    if kind == "Dense":
        out = _shape(layer.output)[1:]
        return 2 * math.prod(out) * int(layer.kernel.shape[0])
    if kind in ("Conv1D", "Conv2D", "Conv3D"):
        # kernel: (*spatial, in_channels / groups, filters): each output value is one dot product
        # over the kernel's spatial extent and its input channels.
        out = _shape(layer.output)[1:]
        return 2 * math.prod(out) * math.prod(int(d) for d in layer.kernel.shape[:-1])
    if kind in ("DepthwiseConv1D", "DepthwiseConv2D"):
        out = _shape(layer.output)[1:]
        return 2 * math.prod(out) * math.prod(int(d) for d in layer.kernel.shape[:-2])
    if kind in ("SeparableConv1D", "SeparableConv2D"):
        out = _shape(layer.output)[1:]
        spatial = math.prod(int(d) for d in layer.depthwise_kernel.shape[:-2])
        inner = int(layer.depthwise_kernel.shape[-2]) * int(layer.depthwise_kernel.shape[-1])
        positions = math.prod(out[:-1])
        return 2 * positions * inner * spatial + 2 * math.prod(out) * inner
    if not layer.weights or kind in ("BatchNormalization", "LayerNormalization", "Normalization", "Embedding"):
        return 0  # no matmul (or a lookup / element-wise op)
    return None


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:  # a nested model or Sequential
            yield from _leaf_layers(layer)
        else:
            yield layer


def count_flops(model) -> FlopCount:
    """The model's forward FLOPs per example, from its layers (a built functional or Sequential model)."""
    total, counted, uncounted = 0, [], []
    for layer in _leaf_layers(model):
        flops = _layer_flops(layer)
        if flops is None:
            uncounted.append(layer.name)
        elif flops:
            total += flops
            counted.append(layer.name)
    return FlopCount(total, tuple(counted), tuple(uncounted))


def mfu(
    samples_per_second: float | None, count: FlopCount, peak_flops: float | None
) -> tuple[float | None, float | None]:
    """(achieved model FLOP/s, MFU in 0..1) for a measured training throughput; None where unknown."""
    if not samples_per_second or not peak_flops:
        return None, None
    achieved = samples_per_second * count.train_per_example
    return achieved, achieved / peak_flops
