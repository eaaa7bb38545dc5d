"""models: every registered model builds and outputs float32 probabilities; user factories fail clearly."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from train.errors import ModelError, RegisterError
from train.models import MODELS, build_model, get_factory


@pytest.fixture
def bf16_policy():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(28, 28, 1), (64, 64, 3)])
def test_registered_models_build_with_float32_output_under_mixed_bfloat16(name, shape, bf16_policy):
    model = build_model(name, shape, 5)
    assert tuple(model.inputs[0].shape) == (None, *shape)
    assert tuple(model.outputs[0].shape) == (None, 5)
    probs = model(np.full((2, *shape), 255, np.float32), training=False)
    assert probs.dtype == "float32"
    np.testing.assert_allclose(np.sum(np.asarray(probs), axis=1), 1.0, rtol=1e-5)


def _relu_before_pooling(name: str, shape, classes: int):
    """The textbook order of `name`: each ReLU before its max pooling (the template pools first)."""
    from keras import layers

    x = inputs = keras.Input(shape=shape)
    x = layers.Rescaling(1.0 / 255)(x)
    for width in (32, 64):
        x = layers.Conv2D(width, 3, use_bias=name == "cnn")(x)
        x = layers.BatchNormalization()(x) if name == "cnn_bn" else x
        x = layers.MaxPooling2D(2)(layers.Activation("relu")(x))
    x = layers.Dense(128, activation="relu")(layers.Flatten()(x))
    x = layers.Activation("softmax", dtype="float32")(layers.Dense(classes)(x))
    return keras.Model(inputs, x)


@pytest.mark.parametrize("name", ["cnn", "cnn_bn"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_relu_after_pooling_computes_what_relu_before_it_does_bit_for_bit(name, policy):
    import tensorflow as tf

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        ours, textbook = build_model(name, (28, 28, 1), 10), _relu_before_pooling(name, (28, 28, 1), 10)
        textbook.set_weights(ours.get_weights())
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (16, 28, 28, 1)).astype(np.float32)
        y = rng.integers(0, 10, 16)
        results = []
        for model in (ours, textbook):
            with tf.GradientTape() as tape:
                probs = model(x, training=True)
                loss = keras.losses.sparse_categorical_crossentropy(y, probs)
            results.append([probs, *tape.gradient(loss, model.trainable_variables)])
        for a, b in zip(*results, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    finally:
        keras.mixed_precision.set_global_policy(previous)


USER_MODULE = '''
import signal

import keras


def good(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def three_classes(input_shape, num_classes):
    return good(input_shape, 3)


def not_a_model(input_shape, num_classes):
    return "a string"


def raises(input_shape, num_classes):
    return {}["width"]


def one_argument(input_shape):
    return good(input_shape, 2)


class ResourceExhaustedError(Exception):
    """Named as TensorFlow's out-of-memory error, which the loop reports itself."""


def out_of_memory(input_shape, num_classes):
    raise ResourceExhaustedError("OOM when allocating tensor")


def strided(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(4, 5)(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(x)))


NOT_CALLABLE = 1
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models_for_test.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_models_for_test"


def test_a_user_factory_by_module_and_function(user_module):
    model = build_model(f"{user_module}:good", (8, 8, 1), 4)
    assert tuple(model.outputs[0].shape) == (None, 4)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_such_module_xyz:make", "importing module no_such_module_xyz failed: ModuleNotFoundError: No module named"),
        ("{mod}:missing", "module {mod} has no function 'missing'"),
        ("{mod}:NOT_CALLABLE", "{mod}.NOT_CALLABLE is not a function (its type is int): give module:function"),
        ("{mod}:not_a_model", "not_a_model((8, 8, 1), 4) returned str, expected a keras.Model"),
        ("{mod}:three_classes", "outputs 3 values but the data has 4 classes"),
        ("{mod}:raises", "raises((8, 8, 1), 4) raised KeyError: 'width'"),
        ("{mod}:one_argument", "one_argument(input_shape) cannot be called as one_argument(input_shape, num_classes)"),
        ("{mod}:strided", "strided((4, 4, 1), 4) raised ValueError: Computed output size would be zero or negative"),
    ],
)
def test_bad_user_factories_are_one_line_model_errors(user_module, spec, words):
    spec = spec.format(mod=user_module)
    shape = (4, 4, 1) if spec.endswith("strided") else (8, 8, 1)
    with pytest.raises(ModelError) as info:
        build_model(spec, shape, 4)
    assert (info.value.name, info.value.value, info.value.exit_code) == ("MODEL", spec, 2)
    assert str(info.value).startswith(f"MODEL={spec}: ")
    assert words.format(mod=user_module) in str(info.value) and "\n" not in str(info.value)


def test_out_of_memory_while_building_is_not_called_a_model_error(user_module):
    with pytest.raises(Exception, match="OOM when allocating") as info:
        build_model(f"{user_module}:out_of_memory", (8, 8, 1), 4)
    assert type(info.value).__name__ == "ResourceExhaustedError"


@pytest.mark.parametrize(
    "source, words",
    [
        ("def make(input_shape, num_classes)\n    pass\n", "SyntaxError"),
        ("import no_such_dependency_xyz\n", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
        ("raise RuntimeError('needs a licence key')\n", "RuntimeError: needs a licence key"),
    ],
)
def test_a_user_module_that_fails_to_import_is_named(tmp_path, monkeypatch, source, words):
    name = f"failing_models_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelError) as info:
        build_model(f"{name}:make", (8, 8, 1), 4)
    assert str(info.value).startswith(f"MODEL={name}:make: importing module {name} failed: ")
    assert words in str(info.value) and "\n" not in str(info.value)


def _editable_module(tmp_path, monkeypatch, name: str, returns: str) -> Path:
    """A user's model file `name.py` whose `make` returns `returns`, importable and not imported yet, that
    the test edits between imports: read from its source each time (no .pyc of the same second and size
    to load instead)."""
    path = tmp_path / f"{name}.py"
    path.write_text(f"def make(input_shape, num_classes):\n    return {returns!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delitem(sys.modules, name, raising=False)
    return path


def test_a_user_module_edited_between_two_runs_of_one_process_is_imported_again(tmp_path, monkeypatch):
    """A notebook: train, edit the model file, train again. The second run took the module from
    sys.modules: it trained the old code, or (a function renamed) said `module m has no function 'make2'`
    though MODEL's check of the file had just found it."""

    from train.models import get_factory, start_of_run

    name = "edited_models_for_test"
    path = _editable_module(tmp_path, monkeypatch, name, "first")
    start_of_run()
    assert get_factory(f"{name}:make")((8, 8, 1), 4) == "first"
    start_of_run()
    assert get_factory(f"{name}:make")((8, 8, 1), 4) == "first"  # unchanged: the module as imported
    path.write_text("def make2(input_shape, num_classes):\n    return 'second, renamed'\n")
    start_of_run()
    assert get_factory(f"{name}:make2")((8, 8, 1), 4) == "second, renamed"
    monkeypatch.delitem(sys.modules, name)


def test_a_user_module_imported_by_the_notebook_and_edited_before_the_first_run_trains_as_saved(
    tmp_path, monkeypatch, caplog
):
    """A notebook cell imported the module to try it, the file was edited, then train(): the run took
    the cell's import from sys.modules and trained the old code, as every later run did, though
    MODEL's check had read the new file."""
    import importlib

    from train.models import get_factory, start_of_run

    name = "notebook_imported_models_for_test"
    path = _editable_module(tmp_path, monkeypatch, name, "tried in a cell")
    assert importlib.import_module(name).make((8, 8, 1), 4) == "tried in a cell"
    path.write_text("def make(input_shape, num_classes):\n    return 'as saved'\n")
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="train"):
        for _ in range(2):  # this run and the next
            start_of_run()
            assert get_factory(f"{name}:make")((8, 8, 1), 4) == "as saved"
    # Said once (what the cell changed in the module's globals is gone too), not at the next run.
    assert [r.getMessage() for r in caplog.records if name in r.getMessage()] == [
        f"MODEL: {name} was imported before this run; imported again from its file, which the run records"
    ]
    monkeypatch.delitem(sys.modules, name)


def test_an_installed_or_the_templates_own_module_imported_before_any_run_is_taken_as_it_is(caplog, monkeypatch):
    """Only a user's file is imported again: an installed package's module, or this package's (its
    registry would register every model a second time), is nobody's edit between runs."""
    import fnmatch

    from train import models

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="train"):
        models.start_of_run()
        assert models.get_factory("train.models:cnn") is models.cnn
        assert models.get_factory("fnmatch:fnmatch") is fnmatch.fnmatch  # the standard library's
        assert models.get_factory("numpy:full") is np.full
    assert not [r for r in caplog.records if "imported again" in r.getMessage()]


def test_a_user_module_edited_during_a_run_gives_the_runs_later_copies_its_first_code(tmp_path, monkeypatch):
    """The model file saved mid-training (the next experiment's change): the test split's and the
    export's copies at the run's end were built from the edited file, a different network, and the run
    failed with `best.weights.h5 does not load ... damaged` (or exported a model it never trained).
    The next run takes the file as it is then."""

    from train.models import get_factory, start_of_run

    name = "edited_mid_run_models_for_test"
    path = _editable_module(tmp_path, monkeypatch, name, "trained")
    start_of_run()
    assert get_factory(f"{name}:make")((8, 8, 1), 4) == "trained"
    path.write_text("def make(input_shape, num_classes):\n    return 'edited meanwhile'\n")
    assert get_factory(f"{name}:make")((8, 8, 1), 4) == "trained"  # the export's copy, same run
    start_of_run()
    assert get_factory(f"{name}:make")((8, 8, 1), 4) == "edited meanwhile"
    monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("name", sorted(n for n in MODELS if MODELS[n].min_image_size))
def test_builtin_minimum_image_sizes_are_exact(name):
    n = MODELS[name].min_image_size
    build_model(name, (n, n, 1), 3)
    with pytest.raises(ModelError, match=rf"the images are {n - 1}x{n - 1}, smaller than the {n}x{n} {name} needs"):
        build_model(name, (n - 1, n - 1, 1), 3)
    with pytest.raises(ValueError):  # what Keras says without the check: a traceback
        MODELS[name].build((n - 1, n - 1, 1), 3)


# Each built-in model: a layer its architecture has and layers it lacks. A fork's own model needs no
# row here (adding a model is one place: train/models.py).
ARCHITECTURES = [
    ("cnn", "Conv2D", ("BatchNormalization", "Add")),
    ("cnn_bn", "BatchNormalization", ("Add",)),
    ("resnet_small", "Add", ()),
]


@pytest.mark.parametrize("name, has, lacks", ARCHITECTURES)
def test_each_registered_name_builds_its_own_architecture(name, has, lacks):
    from train import models

    assert get_factory(name) is getattr(models, name)  # the name is the factory's own, not another's
    kinds = {type(layer).__name__ for layer in build_model(name, (28, 28, 1), 3).layers}
    assert has in kinds and not kinds & set(lacks)


# One model that cannot be built at the command line: the CLI turns every ModelError into the same
# exit 2 and one line. What a user's factory that raises makes of it (its one-line message, exit code 2)
# is test_bad_user_factories_are_one_line_model_errors's, with no TensorFlow start of its own.
@pytest.mark.slow
def test_a_model_that_cannot_be_built_is_one_line_and_exit_2_from_the_cli(tmp_path):
    """After TensorFlow has loaded: the documented exit 2, one line, no traceback."""
    import subprocess

    from builders import write_npz
    from helpers import PYTHON, subprocess_env

    npz = write_npz(tmp_path / "tiny.npz", n_train=64, n_test=32, shape=(2, 2), classes=3)
    env = subprocess_env()
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "train",
            "fit",
            "--dataset",
            f"npz:{npz}",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--model",
            "cnn",
            "--epochs",
            "1",
            "--progress",
            "line",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "ModelError: MODEL=cnn: the images are 2x2, smaller than the 10x10 cnn needs: use larger images "
        "or MODEL=resnet_small"
    )
    assert "Traceback" not in proc.stderr


def test_the_exported_model_is_compiled_only_with_metrics_keras_knows():
    from train.models import ModelEntry, correct

    entry = ModelEntry(None, "", metrics={"accuracy": correct, "top2": correct, "mae": correct})
    assert entry.compiled_metrics() == ["accuracy", "mae"]  # "top2" would break evaluate() on the loaded model
    assert MODELS["cnn"].compiled_metrics() == ["accuracy"]


# -- what a factory must return (tests/faults.py) -----------------------------------------------
@pytest.mark.parametrize(
    "factory, words",
    [
        ("logits", "the model's outputs are not probabilities (on a probe batch a row sums to"),
        ("sigmoid", "the model's outputs are not probabilities"),
        ("two_outputs", "the model has 1 input(s) and 2 output(s); the template trains one image input and one output"),
        ("subclassed", "subclassed((28, 28, 1), 4) returned a Classifier whose inputs and outputs Keras does not know"),
        ("sequential_without_input", "returned a Sequential whose inputs and outputs Keras does not know"),
        ("subclassed_built", "returned a Classifier whose inputs and outputs Keras does not know"),
        ("image_grid_output", "the model's output has shape (None, 28, 28, 4); the template needs (batch, 4)"),
        ("fixed_input_size", "the model takes inputs of shape (32, 32, 3) but the images are (28, 28, 1)"),
        ("compiled", "compiled((28, 28, 1), 4) returned a compiled model (its optimizer SGD)"),
    ],
)
def test_a_model_the_template_cannot_train_is_a_one_line_model_error(factory, words):
    with pytest.raises(ModelError) as info:
        build_model(f"faults:{factory}", (28, 28, 1), 4)
    assert info.value.exit_code == 2 and words in str(info.value) and "\n" not in str(info.value)


def test_the_messages_say_what_the_template_trains():
    with pytest.raises(ModelError, match=r"keras\.Input\(shape=input_shape\)"):
        build_model("faults:subclassed", (28, 28, 1), 4)
    with pytest.raises(
        ModelError,
        match=r'end the model with a softmax, e\.g\. keras\.layers\.Dense\(num_classes, activation="softmax"',
    ):
        build_model("faults:logits", (28, 28, 1), 4)


def test_a_sequential_built_on_the_images_and_inputs_of_any_size_are_accepted():
    assert tuple(build_model("faults:sequential_built", (28, 28, 1), 4).outputs[0].shape) == (None, 4)
    assert tuple(build_model("resnet_small", (40, 40, 3), 4).inputs[0].shape) == (None, 40, 40, 3)


def test_a_model_with_its_own_loss_is_not_held_to_probabilities_but_to_a_loss_that_fits(monkeypatch):
    from train import models

    def logits(reduction=None):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)

    monkeypatch.setitem(models.MODELS, "scores", models.ModelEntry(get_factory("faults:logits"), "", loss=logits))
    build_model("scores", (28, 28, 1), 4)  # a fork's regression or logits loss: its outputs are its own
    # A loss that does not fit the class-id labels: one line as the model is built, not the first step's traceback.
    onehot = models.ModelEntry(get_factory("faults:logits"), "", loss=keras.losses.CategoricalCrossentropy)
    monkeypatch.setitem(models.MODELS, "scores", onehot)
    with pytest.raises(ModelError) as info:
        build_model("scores", (28, 28, 1), 4)
    assert str(info.value).startswith(
        "MODEL=scores: its loss raised ValueError on a probe batch of class-id labels and the model's outputs: "
    )
    assert "\n" not in str(info.value)


def _top2(labels, probs):
    return keras.metrics.sparse_top_k_categorical_accuracy(labels, probs, k=2)


@pytest.mark.parametrize(
    "metric, words",
    [
        (lambda labels, probs: probs, "metric 'mine' gives shape (4, 4) for a batch of 4"),
        (keras.metrics.SparseTopKCategoricalAccuracy(k=2), "metric 'mine' gives shape () for a batch of 4"),
        (lambda labels, probs: labels + probs, "metric 'mine' raised InvalidArgumentError"),
    ],
)
def test_a_metric_that_is_not_one_value_per_example_is_a_one_line_model_error(monkeypatch, metric, words):
    """The loop sums a metric over the examples and divides by their number: a value per class or a Keras
    Metric object's running mean would be averaged into metrics.csv as if it were right."""
    from train import models

    entry = models.ModelEntry(get_factory("faults:dense16"), "", metrics={"accuracy": models.correct, "mine": metric})
    monkeypatch.setitem(models.MODELS, "measured", entry)
    with pytest.raises(ModelError) as info:
        build_model("measured", (28, 28, 1), 4)
    assert info.value.exit_code == 2 and words in str(info.value) and "\n" not in str(info.value), str(info.value)
    good = models.ModelEntry(entry.build, "", metrics={"accuracy": models.correct, "top2": _top2})
    monkeypatch.setitem(models.MODELS, "measured", good)
    build_model("measured", (28, 28, 1), 4)


def test_a_metric_of_one_value_per_example_in_a_column_is_accepted(monkeypatch):
    """Shape (batch, 1) is one value per example too: the steps and the test split sum it to the right mean."""
    from train import models

    column = {"accuracy": models.correct, "col": lambda labels, probs: models.correct(labels, probs)[:, None]}
    monkeypatch.setitem(models.MODELS, "measured", models.ModelEntry(get_factory("faults:dense16"), "", metrics=column))
    build_model("measured", (28, 28, 1), 4)


def test_a_factory_calling_sys_exit_is_a_model_error_naming_it():
    for factory, code in (("sys_exit_3", 3), ("sys_exit_7", 7)):
        with pytest.raises(ModelError) as info:
            build_model(f"faults:{factory}", (28, 28, 1), 4)
        assert f"{factory}((28, 28, 1), 4) called sys.exit({code})" in str(info.value)


@pytest.fixture(scope="module")
def tiny_npz(tmp_path_factory):
    from builders import write_tiny_npz

    return write_tiny_npz(tmp_path_factory.mktemp("data"), n_train=64, n_test=32)


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory, words",
    [
        ("exits_0", "exits_0((28, 28, 1), 4) called os._exit(0)"),
        ("sys_exit_3", "sys_exit_3((28, 28, 1), 4) called sys.exit(3)"),
        ("ctrl_c", "ctrl_c((28, 28, 1), 4) raised KeyboardInterrupt without a Ctrl-C"),
        ("logits", "the model's outputs are not probabilities"),
        ("two_outputs", "2 output(s)"),
        ("subclassed", "inputs and outputs Keras does not know"),
        ("compiled", "remove the compile() call"),
    ],
)
def test_a_factory_that_exits_or_returns_what_cannot_be_trained_is_exit_2_and_recorded(
    tmp_path, tiny_npz, factory, words, monkeypatch, capsys
):
    from faults import fit_flags, manifest, only_run

    from train.cli import main

    # Through the CLI's edge in this process: the factory itself runs in the model check's child.
    monkeypatch.chdir(tmp_path)
    rc = main(["fit", *fit_flags(tmp_path, tiny_npz, epochs=1, model=f"faults:{factory}")])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert rc == 2, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"ModelError: MODEL=faults:{factory}: ") and words in last, out[-3000:]
    assert "Traceback" not in out
    record = manifest(only_run(tmp_path / "runs"))
    assert record["status"] == "failed" and record["error"] == last


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_a_slow_factory_runs_ends_at_once_with_75_and_nothing_trained(tmp_path, tiny_npz, sig):
    from faults import fit_flags, manifest, only_run, output, start_fit, states, wait_until

    proc = start_fit(fit_flags(tmp_path, tiny_npz, epochs=1, model="faults:slow"), tmp_path)
    try:
        # The event: the factory has started (it would then sleep for an hour).
        assert wait_until(lambda: (tmp_path / "slow-factory.started").exists(), proc), output(proc)[-3000:]
        proc.send_signal(sig)
        assert proc.wait(timeout=600) == 75, output(proc)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = output(proc)
    assert "stopped before training started" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    assert manifest(run)["status"] == "interrupted" and states(run) == []


def test_a_name_registered_twice_is_refused_naming_both_factories(monkeypatch):
    """A fork's `register("cnn", mine, ...)` would silently replace the built-in model of that name."""
    import types

    from train import models

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))

    def mine(input_shape, num_classes): ...

    with pytest.raises(RegisterError) as info:
        models.register("cnn", mine, "my own")
    assert str(info.value) == (
        "model 'cnn': registered twice (cnn and test_a_name_registered_twice_is_refused_naming_both_factories."
        "<locals>.mine): give the new model a name of its own, or remove the other register line"
    )
    # A module reloaded (a notebook's autoreload) registers a new function of the same module and name.
    reloaded = types.FunctionType(models.cnn.__code__, models.cnn.__globals__, "cnn")
    reloaded.__qualname__, reloaded.__module__ = models.cnn.__qualname__, models.cnn.__module__
    assert models.register("cnn", reloaded, "again").build is reloaded


def test_a_partial_registered_twice_is_one_line_and_again_from_a_reload_is_not(monkeypatch):
    """A functools.partial has no __qualname__ (the refusal was an AttributeError traceback at import),
    and its repr holds an address (a notebook cell run again was refused as another factory)."""
    import functools

    from train import models

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    models.register("wide", functools.partial(models.cnn_bn), "my own")
    again = functools.partial(models.cnn_bn)  # the same cell run again
    assert models.register("wide", again, "my own").build is again
    with pytest.raises(RegisterError) as info:
        models.register("wide", functools.partial(models.cnn, name="x"), "another")
    assert str(info.value) == (
        "model 'wide': registered twice (partial(cnn_bn) and partial(cnn, name='x')): give the new model a name of "
        "its own, or remove the other register line"
    )


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"metric": {"accuracy": "correct"}}, "register() has no metric= (did you mean metrics=?)"),
        ({"metrics": ["accuracy", "top2"]}, "metrics= maps each name to a function of (labels, outputs)"),
        ({"metrics": {"accuracy": "accuracy"}}, "metrics= maps each name to a function of (labels, outputs)"),
        ({"loss": "sparse_categorical_crossentropy"}, "loss= is a function loss(reduction)"),
        ({"loss": lambda y_true, y_pred: y_pred}, "loss= is a function loss(reduction)"),
        ({"optimizer": "sgd"}, "optimizer= is a function optimizer(learning_rate, settings)"),
        # Keras' classes bind (learning_rate, settings) too: the settings would be SGD's momentum, Adam's beta_1.
        (
            {"optimizer": keras.optimizers.SGD},
            "imports keras, as adam does, and returns keras.optimizers.SGD(learning_rate)",
        ),
        ({"optimizer": keras.optimizers.Adam}, "optimizer= is a function optimizer(learning_rate, settings)"),
        ({"metrics": {"acc": keras.metrics.SparseCategoricalAccuracy}}, "not a keras.metrics class or object"),
        ({"metrics": {"acc": keras.metrics.SparseCategoricalAccuracy()}}, "not a keras.metrics class or object"),
        ({"min_image_size": "32"}, "min_image_size= is a whole number of pixels"),
    ],
)
def test_a_register_line_the_loop_cannot_use_is_refused_when_it_runs(monkeypatch, kw, words):
    """A Keras habit in a fork's register(...) (metrics=["accuracy"], a loss or optimizer object or name,
    a misspelt keyword) would otherwise be a traceback at import, or mid-run after the data loaded."""
    from train import models

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))

    def mine(input_shape, num_classes): ...

    with pytest.raises(RegisterError) as info:
        models.register("mine", mine, "my own", **kw)
    assert str(info.value).startswith("model 'mine': ") and words in str(info.value), str(info.value)
    assert "mine" not in models.MODELS
    models.register("mine", mine, "my own", loss=models.sparse_crossentropy, metrics={"acc": models.correct})


@pytest.mark.parametrize("kw", [{"optimizer": "sgd"}, {"loss": "mse"}])
def test_the_function_a_refusal_suggests_runs_where_the_register_line_is(kw):
    """train/models.py imports no Keras at its top (the settings are checked before TensorFlow loads): a
    suggested lambda naming keras, pasted there, would be a NameError once the run builds its optimizer."""
    from train import models

    problem = models._entry_problem(kw)
    assert not hasattr(models, "keras") and "lambda" not in problem and " that imports keras, as " in problem


class _Adam(keras.optimizers.Adam):
    """A fork's optimizer class that takes what the loop gives: register(..., optimizer=_Adam) is right."""

    def __init__(self, learning_rate, settings):
        super().__init__(learning_rate)


def test_what_the_loop_can_call_is_registered_whatever_its_form(monkeypatch):
    """A partial, an object with __call__, a Keras function or loss class, a fork's own optimizer class."""
    import functools

    from train import models

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))

    def mine(input_shape, num_classes): ...

    models.register(
        "mine",
        mine,
        "my own",
        loss=keras.losses.SparseCategoricalCrossentropy,
        metrics={
            "top2": functools.partial(keras.metrics.sparse_top_k_categorical_accuracy, k=2),
            "accuracy": keras.metrics.sparse_categorical_accuracy,
            "xent": keras.losses.SparseCategoricalCrossentropy(reduction=None),  # one value per example
        },
        optimizer=_Adam,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "line, error",
    [
        (
            'register("cnn", cnn_bn, "dup")',
            "RegisterError: model 'cnn': registered twice (cnn and cnn_bn): give the new model a name of its own, or "
            "remove the other register line",
        ),
        (
            'register("baseline", cnn_bn, "a baseline", metric={"accuracy": correct})',
            "RegisterError: model 'baseline': register() has no metric= (did you mean metrics=?); it takes min_image_size=, "
            "loss=, metrics=, optimizer= (docs/extending.md)",
        ),
    ],
)
def test_a_register_line_refused_is_one_line_at_the_command_line(tmp_path, line, error):
    """The registry is read when the settings are: the refusal is the command's one line, exit 2."""
    import subprocess

    from helpers import clone_of_the_package, subprocess_env

    copy = clone_of_the_package(tmp_path / "copy")
    with (copy / "train" / "models.py").open("a") as f:
        f.write(f"\n{line}\n")
    done = subprocess.run(
        [sys.executable, "-m", "train", "settings"],
        cwd=copy,
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=str(copy)),
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [error], done.stderr
