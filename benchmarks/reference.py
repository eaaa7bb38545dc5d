"""The classic Keras MNIST recipe of the TensorFlow quick-start tutorials, reimplemented faithfully as the baseline.

numpy normalisation (/255 in float32), `from_tensor_slices(...).shuffle(1024).batch(128)
.prefetch(AUTOTUNE)`, the test set batched without shuffling, float32, Adam with Keras defaults,
and the recipe's Sequential CNN declared with `input_shape=(28, 28, 1)`. Nothing from `train/`.
"""

from __future__ import annotations

import time

import numpy as np

BATCH_SIZE = 128
SHUFFLE_BUFFER = 1024


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
