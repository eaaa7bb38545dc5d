"""steps: the compiled train/validation steps on a one-layer model (no strategy: TensorFlow's default one).

What they must match is Keras' own arithmetic: the loss is the mean over the global batch, one call
runs `n` optimizer steps, the stop vote comes back summed, and float16 training goes through the
LossScaleOptimizer's scaling.
"""

from __future__ import annotations

import numpy as np
import pytest


def _model(policy="float32"):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax", dtype=None)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def _data(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def _iterator(x, y, batch):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).map(lambda a, b: (a, b, tf.shape(b)[0]))
    return iter(ds)


def test_evaluate_sums_loss_and_correct_over_every_example():
    import keras
    import tensorflow as tf

    from train.training.steps import Steps, Totals

    model = _model()
    x, y = _data()
    totals = Totals()
    totals.add(Steps(model).evaluate(_iterator(x, y, 4), tf.constant(3)).numpy())  # batches of 4, 4, 2
    probs = model(x).numpy()
    loss = keras.losses.sparse_categorical_crossentropy(y, probs).numpy()
    assert totals.count == 10
    assert totals.logs()["loss"] == pytest.approx(float(loss.mean()), rel=1e-5)
    assert totals.logs()["accuracy"] == pytest.approx(float((probs.argmax(1) == y).mean()))
    assert Totals().logs() == {}


def test_one_call_runs_n_steps_and_matches_a_hand_written_step():
    import keras
    import tensorflow as tf

    from train.training.steps import Steps

    x, y = _data()
    ours, ref = _model(), _model()
    out = Steps(ours).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0)).numpy()
    assert int(ours.optimizer.iterations.numpy()) == 2 and out[2] == 10 and out[3] == 0
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    for k in range(2):  # Keras' own mean-over-the-batch step, by hand
        with tf.GradientTape() as tape:
            loss = loss_fn(y[5 * k : 5 * k + 5], ref(x[5 * k : 5 * k + 5], training=True))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref.optimizer.apply_gradients(zip(grads, ref.trainable_variables))
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_calls_of_several_steps_give_the_weights_of_one_step_a_call():
    """STEPS_PER_EXECUTION is free on resume because it changes no weight: one call of 2 steps is two
    calls of 1, bit for bit."""
    import tensorflow as tf

    from train.training.steps import Steps

    x, y = _data()
    together, apart = _model(), _model()
    Steps(together).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0))
    steps, batches = Steps(apart), _iterator(x, y, 5)
    for _ in range(2):
        steps.train(batches, tf.constant(1), tf.constant(0.0))
    for a, b in zip(together.get_weights(), apart.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_the_stop_vote_comes_back_with_the_sums():
    import tensorflow as tf

    from train.training.steps import Steps

    x, y = _data()
    out = Steps(_model()).train(_iterator(x, y, 5), tf.constant(1), tf.constant(1.0)).numpy()
    assert out[3] > 0


def test_jit_compile_gives_the_same_step():
    import tensorflow as tf

    from train.training.steps import Steps

    x, y = _data()
    plain, jit = _model(), _model()
    Steps(plain).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0))
    Steps(jit, jit_compile=True).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0))
    for a, b in zip(plain.get_weights(), jit.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_float16_scales_the_loss_through_the_loss_scale_optimizer(monkeypatch):
    import keras
    import tensorflow as tf

    from train.training.steps import Steps

    model = _model("mixed_float16")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    scaled = []
    real = type(model.optimizer).scale_loss
    monkeypatch.setattr(type(model.optimizer), "scale_loss", lambda self, loss: scaled.append(1) or real(self, loss))
    before = [w.copy() for w in model.get_weights()]
    x, y = _data()
    Steps(model).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0))
    assert scaled, "the loss was not scaled"
    after = model.get_weights()
    assert all(np.isfinite(w).all() for w in after) and any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_totals_add_up_over_calls():
    from train.training.steps import Totals

    totals = Totals()
    totals.add([2.0, 1.0, 4.0, 0.0])
    totals.add([1.0, 3.0, 4.0, 0.0])
    assert (totals.loss, totals.sums, totals.count) == (3.0, [4.0], 8.0)  # the sum of "correct"
    assert totals.logs("val_") == {"val_loss": 3.0 / 8, "val_accuracy": 0.5}


def _batchnorm_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


def test_training_steps_use_batch_statistics_and_evaluation_the_moving_ones():
    import keras
    import tensorflow as tf

    from train.training.steps import Steps, Totals

    x, y = _data()
    x = x * 3 + 5  # far from BatchNormalization's initial moving mean (0) and variance (1)
    model = _batchnorm_model()
    moving_mean = model.layers[0].moving_mean
    totals = Totals()
    totals.add(Steps(model).evaluate(_iterator(x, y, 5), tf.constant(2)).numpy())
    assert np.array_equal(moving_mean.numpy(), np.zeros(4)), "evaluation updated the moving statistics"
    probs = model(x, training=False).numpy()
    assert totals.logs()["loss"] == pytest.approx(
        float(keras.losses.sparse_categorical_crossentropy(y, probs).numpy().mean()), rel=1e-5
    )

    Steps(model).train(_iterator(x, y, 5), tf.constant(1), tf.constant(0.0))
    assert (moving_mean.numpy() > 0).all(), "a training step left the moving statistics alone"


def test_jit_compile_asks_tensorflow_for_xla_and_only_then(monkeypatch):
    import tensorflow as tf

    from train.training.steps import Steps

    real, asked = tf.function, []

    def spy(fn=None, **kw):
        asked.append(kw.get("jit_compile"))
        return real(fn, **kw)

    monkeypatch.setattr(tf, "function", spy)
    Steps(_model())
    assert True not in asked
    asked.clear()
    Steps(_model(), jit_compile=True)
    assert asked.count(True) == 2  # the forward and the forward-backward pass


def test_regularization_losses_are_added_to_the_loss():
    import keras
    import tensorflow as tf

    from train.training.steps import Steps

    def regularized():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(3, activation="softmax", kernel_regularizer=keras.regularizers.L2(0.5)),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
        return model

    x, y = _data()
    ours, ref = regularized(), regularized()
    Steps(ours).train(_iterator(x, y, 10), tf.constant(1), tf.constant(0.0))
    with tf.GradientTape() as tape:
        probs = ref(x, training=True)
        loss = keras.losses.SparseCategoricalCrossentropy()(y, probs) + tf.add_n(ref.losses)
    ref.optimizer.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_a_models_own_loss_and_metrics_drive_the_steps():
    """A registry entry with another loss (squared error on one-hot targets) and two metrics:
    the step trains with that loss, averaged over the batch, and sums each metric per example."""
    import keras
    import tensorflow as tf

    from train.models import ModelEntry
    from train.training.steps import Steps, Totals

    def squared_error(reduction="sum_over_batch_size"):
        return keras.losses.MeanSquaredError(reduction=reduction)

    def squared(y, probs):
        return tf.reduce_sum(tf.square(tf.one_hot(tf.cast(y, tf.int32), 3) - probs), axis=-1) / 3

    task = ModelEntry(
        None,
        "",
        loss=lambda reduction: _OneHot(squared_error(reduction)),
        metrics={"sq": squared, "top": lambda y, p: tf.reduce_max(p, axis=-1)},
    )
    x, y = _data()
    ours, ref = _model(), _model()
    out = Steps(ours, task=task).train(_iterator(x, y, 5), tf.constant(2), tf.constant(0.0)).numpy()
    assert out.shape == (5,) and out[3] == 10 and out[4] == 0  # [loss, sq, top, examples, votes]
    loss_fn = squared_error()
    for k in range(2):  # the same loss, Keras' mean over each batch, by hand
        with tf.GradientTape() as tape:
            loss = loss_fn(tf.one_hot(y[5 * k : 5 * k + 5], 3), ref(x[5 * k : 5 * k + 5], training=True))
        ref.optimizer.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    totals = Totals(("sq", "top"))
    totals.add(Steps(ours, task=task).evaluate(_iterator(x, y, 4), tf.constant(3)).numpy())
    probs = ours(x).numpy()
    expected_sq = float(np.mean(np.sum((np.eye(3)[y] - probs) ** 2, axis=1) / 3))
    assert set(totals.logs()) == {"loss", "sq", "top"}
    assert totals.logs()["loss"] == pytest.approx(expected_sq, rel=1e-5)  # MSE over one-hot = sq
    assert totals.logs()["sq"] == pytest.approx(expected_sq, rel=1e-5)
    assert totals.logs()["top"] == pytest.approx(float(probs.max(1).mean()), rel=1e-5)


class _OneHot:
    """A loss over integer labels made from one over one-hot targets (3 classes)."""

    def __init__(self, loss):
        self.loss = loss

    def __call__(self, y, probs):
        import tensorflow as tf

        return self.loss(tf.one_hot(tf.cast(y, tf.int32), 3), probs)
