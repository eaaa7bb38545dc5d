"""How much arithmetic a training step costs, and how close a run gets to the device's limit.

Model-FLOP utilisation (MFU) = achieved model FLOP/s / the device's peak FLOP/s. The count follows
the usual MFU convention: only the matrix multiplications of dense and convolution layers, 2 FLOPs
per multiply-add, and a training example costs 3x its forward pass (the backward pass computes the
gradients with respect to both the activations and the weights, each as large as the forward).
Element-wise layers (activations, pooling, normalisation) are a few percent of a CNN's work and are
left out, as in every published MFU figure; the layers that are not counted are listed, so a fork
with exotic layers knows the count is a lower bound.

The peak is measured at start: a short matmul in the training precision on the training device,
the measurement `python -m train check` makes. On a GPU whose datasheet peak is known (DATASHEET),
that peak is used instead, as published MFU figures do, and the measured one is recorded beside it;
the manifest says which one the MFU divides by.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

TRAIN_MULTIPLIER = 3  # forward + backward (activations) + backward (weights)
PROBE_N, PROBE_REPS = 1024, 3


# Dense tensor-core peaks in TFLOP/s from NVIDIA's datasheets (SXM parts where there are two; no
# sparsity). Keyed by a substring of the name NVML/TensorFlow reports; checked in order.
DATASHEET: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"float32": 67.0, "bfloat16": 989.0, "float16": 989.0}),
    ("H100", {"float32": 67.0, "bfloat16": 989.0, "float16": 989.0}),
    ("A100", {"float32": 19.5, "bfloat16": 312.0, "float16": 312.0}),
    ("L4", {"float32": 30.3, "bfloat16": 121.0, "float16": 121.0}),
    ("A10G", {"float32": 31.2, "bfloat16": 70.0, "float16": 70.0}),
    ("V100", {"float32": 15.7, "float16": 125.0}),
    ("T4", {"float32": 8.1, "float16": 65.0}),
)


def compute_dtype(policy: str) -> str:
    """The dtype the matmuls run in under a Keras precision policy."""
    return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(policy, "float32")


def datasheet_peak(device_name: str | None, dtype: str) -> float | None:
    """The published dense peak in FLOP/s for a GPU name and dtype, or None when not in DATASHEET."""
    for key, peaks in DATASHEET:
        if device_name and key in device_name and dtype in peaks:
            return peaks[dtype] * 1e12
    return None


@dataclass(frozen=True)
class Peak:
    flops: float | None  # FLOP/s of the whole set of replicas: what the MFU divides by
    source: str  # e.g. "measured: 1024x1024 float32 matmul on CPU, x1"
    measured_per_device: float | None = None
    datasheet_per_device: float | None = None

    def to_dict(self) -> dict:
        return {
            "flops": self.flops,
            "source": self.source,
            "measured_per_device": self.measured_per_device,
            "datasheet_per_device": self.datasheet_per_device,
        }


def choose_peak(measured: float | None, datasheet: float | None, devices: int, where: str, dtype: str) -> Peak:
    """The datasheet peak when there is one (GPUs), else the measured one; times the devices in sync."""
    if datasheet:
        return Peak(
            datasheet * devices,
            f"datasheet: {datasheet / 1e12:g} TFLOP/s {dtype} per {where}, x{devices}",
            measured,
            datasheet,
        )
    if measured:
        return Peak(
            measured * devices, f"measured: {PROBE_N}x{PROBE_N} {dtype} matmul on {where}, x{devices}", measured, None
        )
    return Peak(None, "unknown: the probe failed", None, None)


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


def measure_peak_flops(
    dtype: str = "float32", device: str | None = None, n: int = PROBE_N, reps: int = PROBE_REPS
) -> float:
    """FLOP/s of an n x n matmul in `dtype` on `device` (the default device when None): the best of `reps`."""
    import tensorflow as tf

    with tf.device(device) if device else contextlib.nullcontext():
        a = tf.random.stateless_uniform((n, n), seed=(1, 2), dtype=tf.float32)
        a = tf.cast(a, dtype)
        float(tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))  # warm-up: kernels, thread pools
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            float(tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))  # the read forces completion
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def mfu(
    samples_per_second: float | None, count: FlopCount, peak_flops: float | None
) -> tuple[float | None, float | None]:
    """(achieved model FLOP/s, MFU in 0..1) for a measured training throughput; None where unknown."""
    if not samples_per_second or not peak_flops:
        return None, None
    achieved = samples_per_second * count.train_per_example
    return achieved, achieved / peak_flops
