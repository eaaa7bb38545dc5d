"""The classic Keras MNIST recipe of the TensorFlow quick-start tutorials, reimplemented faithfully as the baseline.

numpy normalisation (/255 in float32), `from_tensor_slices(...).shuffle(1024).batch(128)
.prefetch(AUTOTUNE)`, the test set batched without shuffling, float32, Adam with Keras defaults,
and the recipe's Sequential CNN declared with `input_shape=(28, 28, 1)`. Nothing from `train/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BATCH_SIZE = 128
SHUFFLE_BUFFER = 1024
# The environment as the user started the benchmarks, before benchmarks/conftest.py turned oneDNN on for
# the template's sides as a run does: the recipe runs in it, with TensorFlow's own choice of kernels.
RECIPE_ENVIRON = dict(os.environ)


def prepare(arrays: dict, batch_size: int = BATCH_SIZE):
    """(train_ds, test_ds) exactly as the recipe builds them."""
    import tensorflow as tf

    x_train = arrays["x_train"][..., np.newaxis].astype("float32") / 255.0
    x_test = arrays["x_test"][..., np.newaxis].astype("float32") / 255.0
    train_ds = tf.data.Dataset.from_tensor_slices((x_train, arrays["y_train"]))
    train_ds = train_ds.shuffle(SHUFFLE_BUFFER).batch(batch_size).prefetch(tf.data.AUTOTUNE)
    test_ds = tf.data.Dataset.from_tensor_slices((x_test, arrays["y_test"])).batch(batch_size)
    return train_ds, test_ds


def make_model():
    """The recipe's CNN, compiled as the recipe compiles it (float32 whatever the global policy was)."""
    import keras
    import tensorflow as tf

    keras.mixed_precision.set_global_policy("float32")
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, (3, 3), activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(2, 2),
            tf.keras.layers.Conv2D(64, (3, 3), activation="relu"),
            tf.keras.layers.MaxPooling2D(2, 2),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class Recipe:
    """One reference training, run an epoch at a time so a benchmark can interleave it with another."""

    def __init__(self, arrays: dict, batch_size: int = BATCH_SIZE):
        self.train_ds, self.test_ds = prepare(arrays, batch_size)
        self.model = make_model()
        self.n_train = len(arrays["y_train"])
        self.history: list[dict] = []

    def epoch(self, evaluate: bool = True) -> dict:
        t0 = time.perf_counter()
        self.model.fit(self.train_ds, epochs=1, verbose=0)
        seconds = time.perf_counter() - t0
        row = {"epoch": len(self.history) + 1, "epoch_seconds": seconds, "samples_per_second": self.n_train / seconds}
        if evaluate:
            row["val_accuracy"] = float(self.model.evaluate(self.test_ds, verbose=0, return_dict=True)["accuracy"])
        self.history.append(row)
        return row


class RecipeProcess:
    """The recipe in a Python process of its own, an epoch per call as Recipe: TensorFlow reads
    TF_ENABLE_ONEDNN_OPTS once, at its import, and a run of the template sets it where TensorFlow would
    run Eigen's kernels (an AVX2-only CPU), so the recipe cannot share the benchmark's process and still
    run as its users run it. `npz`: a Keras-format file with the arrays; `seed`: keras' seed, if any."""

    def __init__(self, npz: Path, seed: int | None = None):
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(npz), "" if seed is None else str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=RECIPE_ENVIRON,
        )
        self.history: list[dict] = []

    def _ask(self, what: str) -> dict:
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the recipe's process ended (exit {self.process.wait()}): its error is above")
        return json.loads(answer)

    def epoch(self, evaluate: bool = True) -> dict:
        self.history.append(self._ask("epoch" if evaluate else "epoch without evaluation"))
        return self.history[-1]

    def test_accuracy(self) -> float:
        return self._ask("test accuracy")["accuracy"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()

    def __del__(self):
        if self.process.poll() is None:
            self.process.kill()


def _serve(npz: str, seed: str) -> None:
    """RecipeProcess's other end: one line asked on stdin, one JSON line answered."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything TensorFlow or Keras prints goes to stderr, not into the answers
    import keras

    if seed:
        keras.utils.set_random_seed(int(seed))
    with np.load(npz) as z:
        recipe = Recipe({k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")})
    for line in sys.stdin:
        if line.strip() == "test accuracy":
            result = recipe.model.evaluate(recipe.test_ds, verbose=0, return_dict=True)
            answer = {"accuracy": float(result["accuracy"])}
        else:
            answer = recipe.epoch(evaluate=line.strip() == "epoch")
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(*sys.argv[1:3])
