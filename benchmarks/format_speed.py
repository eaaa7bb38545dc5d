"""Time one exported file in a fresh process: `python format_speed.py FORMAT PATH X.npy SECONDS` -> JSON.

FORMAT savedmodel runs in TensorFlow (this project's environment); litert and onnx in their own
runtimes (.venv-runtime-check), as a device or a server would. Prints load seconds and images/s
at batch 1 and batch 64, each measured for about SECONDS after one warm-up call.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def loader(fmt: str, path: str):
    if fmt == "savedmodel":
        import tensorflow as tf

        serve = tf.saved_model.load(path).signatures["serving_default"]
        return lambda x: serve(images=tf.constant(x))["probabilities"].numpy()
    if fmt == "litert":
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_path=path).get_signature_runner("serving_default")
        return lambda x: runner(images=x)["probabilities"]
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return lambda x: session.run(["probabilities"], {"images": x})[0]


def rate(predict, x: np.ndarray, seconds: float) -> float:
    predict(x)  # warm-up: graph tracing, allocation, a resize of the input
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or n < 3:
        predict(x)
        n += 1
    return n * len(x) / elapsed


def main(fmt: str, path: str, x_path: str, seconds: str) -> None:
    x = np.load(x_path)
    t0 = time.perf_counter()
    predict = loader(fmt, path)
    load = time.perf_counter() - t0
    out = {
        "load_s": load,
        "batch1_ips": rate(predict, x[:1], float(seconds)),
        "batch64_ips": rate(predict, x[:64], float(seconds)),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
