"""export/model.onnx: the serving function (uint8 `images` in, `probabilities` out) through tf2onnx.

Converted from the same tf.function the SavedModel serves, not through `tf2onnx.convert.from_keras`
or Keras's `model.export(format="onnx")`: both read the Keras 3 model's internals, which broke with
Keras 3 releases (onnx/tensorflow-onnx#2329, #2348), and the latter needs a float32 policy
(keras-team/keras#20710). The export already holds a float32 copy of the model, so the graph is
float32 whatever the training precision.

tf2onnx does not fail on a TensorFlow op it cannot map: it leaves the op in the graph under its TF
name, and ONNX Runtime would refuse the file on the server. The graph is therefore read back and
every node checked against the ONNX op schemas.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from . import ConversionError

OPSET = 17  # ONNX Runtime 1.14 and later run it; tf2onnx 1.17 supports up to 18


def convert(serve, input_signature, out: Path) -> None:
    """Write `out` from the serving tf.function; ConversionError names the ops ONNX lacks."""
    import onnx
    import tensorflow as tf
    import tf2onnx

    function = tf.function(serve, input_signature=input_signature)
    with _quiet():
        try:
            proto, _ = tf2onnx.convert.from_function(function, input_signature=input_signature, opset=OPSET)
        except Exception as exc:  # tf2onnx raises plain exceptions with the op in the text
            raise ConversionError(
                "onnx", f"tf2onnx failed ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})", _FIX
            ) from None
    unknown = sorted(
        {(n.op_type, n.name.rsplit("/", 1)[0]) for n in proto.graph.node if not onnx.defs.has(n.op_type, n.domain)}
    )
    if unknown:
        ops = ", ".join(sorted({op for op, _ in unknown}))
        layers = ", ".join(sorted({where for _, where in unknown}))
        raise ConversionError("onnx", f"ONNX has no op for TensorFlow's {ops} (in {layers})", _FIX)
    out.write_bytes(proto.SerializeToString())


_FIX = "build that layer from ops ONNX supports, or leave onnx out of EXPORT_FORMATS / --format"


@contextlib.contextmanager
def _quiet():
    """tf2onnx logs every step at INFO and prints warnings; the export says in one line what happened."""
    logger = logging.getLogger("tf2onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
