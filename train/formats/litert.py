"""export/model.tflite: the staged SavedModel converted by TensorFlow's TFLiteConverter.

TensorFlow 2.20 deprecated `tf.lite`'s interpreter in favour of LiteRT (ai-edge-litert), but the
converter still converts a SavedModel in TF 2.21; its serving_default signature (uint8 `images` in,
float32 `probabilities` out) becomes the file's signature of the same name. Only LiteRT's built-in
ops are allowed: a file with TensorFlow ("flex") ops needs TensorFlow's kernels on the device, which
is what this format is chosen to avoid.

Quantisation (EXPORT_QUANTIZE): `dynamic` stores the weights as int8 and computes in float;
`int8` also quantises the activations, calibrated on a few hundred training images. The input
stays uint8 images and the output float32 probabilities either way.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from . import ConversionError

_UNSUPPORTED = re.compile(r"'(tf\.\w+)' op is neither a custom op nor a flex op")
_WHERE = re.compile(r'fused\["(\w+):", "([^"@]+)@')


def convert(savedmodel: Path, out: Path, quantize: str = "none", calibration: Iterable[np.ndarray] = ()) -> None:
    """Write `out` from the SavedModel; ConversionError when LiteRT lacks an op the model uses."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(savedmodel), signature_keys=["serving_default"])
    if quantize != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "int8":
        batches = [np.asarray(x, np.uint8) for x in calibration]
        if not batches:
            raise ConversionError("litert", "int8 quantisation has no calibration images", "use --quantize dynamic")
        converter.representative_dataset = lambda: ({"images": x[None]} for b in batches for x in b)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        with warnings.catch_warnings():
            # The int8 calibration runs tf.lite's own (deprecated) interpreter inside the converter.
            warnings.filterwarnings("ignore", message=".*tf.lite.Interpreter is deprecated")
            flatbuffer = converter.convert()
    except Exception as exc:  # tf.lite's ConverterError and friends; their text names the op
        raise _explain(exc) from None
    out.write_bytes(flatbuffer)


def _explain(exc: Exception) -> ConversionError:
    text = str(exc)
    ops = sorted(set(_UNSUPPORTED.findall(text)))
    if ops:
        where = {op: path for op, path in _WHERE.findall(text)}
        layers = sorted({where[o[3:]].rsplit("/", 1)[0] for o in ops if o[3:] in where})
        inside = f" (in {', '.join(layers)})" if layers else ""
        return ConversionError(
            "litert",
            f"LiteRT has no built-in op {', '.join(ops)}{inside}",
            "build that layer from ops LiteRT supports, or leave litert out of EXPORT_FORMATS / --format",
        )
    first = next((line.strip() for line in text.splitlines() if "error" in line.lower()), text.strip()[:300])
    return ConversionError(
        "litert", f"the converter failed ({type(exc).__name__}: {first[:300]})", "leave litert out of --format"
    )
