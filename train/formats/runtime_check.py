"""Run an exported model.tflite or model.onnx the way a device or an ONNX server does: numpy only.

    python -m train.formats.runtime_check {litert,onnx} MODEL_FILE X.npy OUT.npy

Reads the uint8 images X.npy, writes the float32 probabilities to OUT.npy. The export starts this in
a fresh process, in the interpreter EXPORT_CHECK_PYTHON names (.venv-runtime-check: ai-edge-litert,
onnxruntime and numpy, no TensorFlow), so a file that needs TensorFlow to run fails here and not on
the device. TensorFlow and Keras are refused at import even where they are installed: the check
proves the file runs without them in any environment. Imports nothing of this package beyond this
module (train/__init__.py and train/formats/__init__.py import only the standard library).

Exit status: 0 written; 3 the runtime is not installed; 4 the file does not load or run.
"""

from __future__ import annotations

import importlib.abc
import sys

FORMATS = ("litert", "onnx")
RUNTIMES = {"litert": "ai_edge_litert", "onnx": "onnxruntime"}  # the module each format's check imports
_REFUSED = ("tensorflow", "keras", "tf_keras", "jax", "torch")


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _REFUSED:
            raise ImportError(f"{name} imported by the runtime check: the exported file must run without it")
        return None


def run_litert(path: str, x):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path)
    runner = interpreter.get_signature_runner("serving_default")
    return runner(images=x)["probabilities"]


def run_onnx(path: str, x):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initialisers are not the user's business
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    (out,) = session.run(["probabilities"], {"images": x})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in FORMATS:
        print("usage: python -m train.formats.runtime_check {litert,onnx} MODEL X.npy OUT.npy", file=sys.stderr)
        return 2
    fmt, path, x_path, out_path = argv
    sys.meta_path.insert(0, _NoTensorFlow())
    import numpy as np

    run = run_litert if fmt == "litert" else run_onnx
    x = np.load(x_path)
    try:
        y = run(path, x)
    except ImportError as exc:
        print(f"the {fmt} runtime is not installed here ({exc}): run scripts/venv-runtime-check.sh", file=sys.stderr)
        return 3
    except Exception as exc:  # the runtime's own error types; the export turns the text into an ExportError
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 4
    np.save(out_path, np.asarray(y, dtype=np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
