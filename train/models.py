"""The model registry: MODEL=<name> or package.module:function -> a keras.Model and how to train it.

A registered model is one `register(...)` call below: the factory (the Keras-examples signature
`make_model(input_shape, num_classes)`), a one-line description (it becomes MODEL's help, in
`.env.example` and the README), the smallest image it takes, and what it is trained with:
`loss(reduction)` returns a Keras loss, which the loop asks for per example (`reduction=None`) and
averages over the global batch itself, and `metrics` maps a name (it becomes the metrics.csv
column, `val_<name>` and a MONITOR choice) to a function of (labels, outputs) giving one value per
example; `optimizer(learning_rate, settings)` returns the Keras optimizer (Adam by default). The
defaults are those of classification into integer labels; a regression or multi-label model, or
one that trains with another optimizer, gives its own, in this file alone (docs/extending.md).

Inputs are raw pixel values (0..255, float32); a model rescales them itself, so the exported model
takes raw images and the data pipeline stays free of preprocessing. The softmax output is float32
even under a mixed-precision policy (numerically safe loss). Keras is imported inside the functions:
the settings check reads this registry before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import logging
import sys
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .digest import sha256_file
from .errors import ModelError, RegisterError, TemplateError, first_line, refuse_second
from .setup.modelcheck import check_model, user_code

if TYPE_CHECKING:
    import keras

Factory = Callable[[tuple, int], Any]  # (input_shape, num_classes) -> keras.Model


def sparse_crossentropy(reduction: str | None = "sum_over_batch_size"):
    """Cross-entropy between integer labels and the model's probabilities."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(reduction=reduction)


def adam(learning_rate, settings):
    """The optimizer a model trains with unless its entry names another: `optimizer(learning_rate,
    settings)`, where `learning_rate` is LEARNING_RATE or its schedule (train.training.schedules)."""
    import keras

    return keras.optimizers.Adam(learning_rate)


def correct(labels, probs):
    """1.0 where the most probable class is the label, else 0.0 (its mean is the accuracy)."""
    import tensorflow as tf

    return tf.cast(tf.equal(tf.cast(labels, tf.int64), tf.argmax(probs, axis=-1)), tf.float32)


@dataclass(frozen=True)
class ModelEntry:
    build: Factory
    doc: str  # one line, shown in MODEL's help
    min_image_size: int = 0  # the smallest height/width the architecture takes (0: any)
    loss: Callable[..., Any] = sparse_crossentropy  # loss(reduction=None) -> a per-example Keras loss
    metrics: Mapping[str, Callable] = field(default_factory=lambda: {"accuracy": correct})
    optimizer: Callable[..., Any] = adam  # optimizer(learning_rate, settings) -> a Keras optimizer

    def compiled_metrics(self) -> list[str]:
        """The metric names Keras knows, for the exported model's compile() (training computes its own)."""
        import keras

        known = []
        for name in self.metrics:
            # ValueError: a metric of this project only; the exported model is compiled without it.
            with contextlib.suppress(ValueError):
                keras.metrics.get(name)
                known.append(name)
        return known


MODELS: dict[str, ModelEntry] = {}
# MODEL=package.module:function: a user's factory, trained as a classifier.
DEFAULT_ENTRY = ModelEntry(build=None, doc="")


def register(name: str, build: Factory, doc: str, **kw: Any) -> ModelEntry:
    refuse_second("model", name, getattr(MODELS.get(name), "build", None), build)
    problem = _entry_problem(kw)
    if problem:  # found when train.models is imported: one line, not a traceback now or mid-run
        raise RegisterError("model", name, f"{problem} (docs/extending.md)")
    MODELS[name] = ModelEntry(build, doc, **kw)
    return MODELS[name]


_FIELDS = ("min_image_size", "loss", "metrics", "optimizer")


def _entry_problem(kw: Mapping[str, Any]) -> str | None:
    """What in register()'s keywords the loop cannot use (Keras habits: metrics=["accuracy"], a loss
    object), or None."""
    for key in kw:
        if key not in _FIELDS:
            near = difflib.get_close_matches(key, _FIELDS, 1)
            hint = f" (did you mean {near[0]}=?)" if near else ""
            return f"register() has no {key}={hint}; it takes " + ", ".join(f"{f}=" for f in _FIELDS)
    size = kw.get("min_image_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"min_image_size= is a whole number of pixels (0: any), not {size!r}"
    metrics = kw.get("metrics", {})
    if not isinstance(metrics, Mapping) or not all(
        isinstance(k, str) and _takes(f, None, None) and not _keras_metric(f) for k, f in metrics.items()
    ):
        return (
            "metrics= maps each name to a function of (labels, outputs) giving one value per example, e.g. "
            f'metrics={{"accuracy": correct, "top2": top2}} (not a keras.metrics class or object, whose '
            f"running mean is not one value per example); not {_short(metrics)}"
        )
    if "loss" in kw and not _takes(kw["loss"], reduction=None):  # the loop passes reduction= always
        return (  # the example imports keras as this file's functions do: a lambda naming it is a NameError here
            "loss= is a function loss(reduction) that returns a Keras loss, e.g. a def mse(reduction=None) that "
            "imports keras, as sparse_crossentropy does, and returns keras.losses.MeanSquaredError(reduction="
            f"reduction); not {_short(kw['loss'])}"
        )
    optimizer = kw.get("optimizer", adam)
    # A Keras optimizer class binds (learning_rate, settings) too, the settings becoming its momentum or beta_1.
    if not _takes(optimizer, None, None) or _keras_own(optimizer):
        return (
            "optimizer= is a function optimizer(learning_rate, settings) that returns a Keras optimizer, e.g. a def "
            "sgd(learning_rate, settings) that imports keras, as adam does, and returns "
            f"keras.optimizers.SGD(learning_rate); not {_short(optimizer)}"
        )
    return None


def _takes(fn: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether `fn` can be called with these arguments (a callable without a signature: assumed so)."""
    if not callable(fn):
        return False
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:
        pass
    return True


_KERAS = ("keras", "tf_keras")


def _keras_own(fn: Any) -> bool:
    """A class whose constructor is Keras' own (keras.optimizers.SGD), not a fork's subclass with its own."""
    return inspect.isclass(fn) and getattr(fn.__init__, "__module__", "").partition(".")[0] in _KERAS


def _keras_metric(fn: Any) -> bool:
    """A keras.metrics.Metric class or object: its call keeps a running mean, not one value per example."""
    cls = fn if inspect.isclass(fn) else type(fn)
    return any(c.__name__ == "Metric" and c.__module__.partition(".")[0] in _KERAS for c in cls.__mro__)


def _short(value: Any) -> str:
    text = getattr(value, "__qualname__", None) if callable(value) else None
    text = text or repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def entry(name: str) -> ModelEntry:
    """The registry entry of MODEL (a user's module:function gets the classification defaults)."""
    return MODELS.get(name, DEFAULT_ENTRY)


def monitors(name: str) -> tuple[str, ...]:
    """The values MONITOR may take for MODEL: the loss and every metric, on validation or training data."""
    metrics = tuple(entry(name).metrics)
    return (*(f"val_{m}" for m in metrics), "val_loss", *metrics, "loss")


def describe() -> str:
    """MODEL's help: every registered model with its description."""
    return " | ".join(f"{n} ({e.doc})" if e.doc else n for n, e in MODELS.items()) + " | package.module:function"


def _head(x, num_classes: int):
    from keras import layers

    x = layers.Dense(num_classes, name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(x)


def cnn(input_shape: tuple, num_classes: int) -> keras.Model:
    """The classic Keras MNIST CNN from the TensorFlow quick-start tutorials:
    Conv32-Pool-Conv64-Pool-Flatten-Dense128-Dense(classes), each convolution with its ReLU.

    Each ReLU comes after its max pooling instead of before: ReLU never changes which value is
    largest, so both orders compute the same outputs and the same gradients (the same weights,
    bit for bit), and after the pooling the ReLU and its gradient touch a quarter of the values.
    The ReLU's gradient is an element-wise kernel outside oneDNN, slow in bfloat16 on CPUs.
    """
    return _classic_cnn(input_shape, num_classes, "cnn", batch_norm=False)


def cnn_bn(input_shape: tuple, num_classes: int) -> keras.Model:
    """The classic CNN with batch normalisation after each convolution: converges in fewer epochs."""
    return _classic_cnn(input_shape, num_classes, "cnn_bn", batch_norm=True)


def _classic_cnn(input_shape: tuple, num_classes: int, name: str, batch_norm: bool) -> keras.Model:
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, name="image")
    x = layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    for i, width in enumerate((32, 64), start=1):
        x = layers.Conv2D(width, 3, use_bias=not batch_norm, name=f"conv{i}")(x)
        if batch_norm:
            x = layers.BatchNormalization(name=f"bn{i}")(x)
        x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
        x = layers.Activation("relu", name=f"relu{i}")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(128, activation="relu", name="dense")(x)
    return keras.Model(inputs, _head(x, num_classes), name=name)


def _residual_block(x, width: int, stride: int, name: str):
    from keras import layers

    shortcut = x
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1")(x)
    y = layers.BatchNormalization(name=f"{name}_bn1")(y)
    y = layers.Activation("relu", name=f"{name}_relu1")(y)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = layers.BatchNormalization(name=f"{name}_bn2")(y)
    if stride != 1 or shortcut.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False, name=f"{name}_proj")(shortcut)
        shortcut = layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    return layers.Activation("relu", name=f"{name}_out")(layers.Add(name=f"{name}_add")([y, shortcut]))


def resnet_small(input_shape: tuple, num_classes: int) -> keras.Model:
    """A small ResNet for larger images from an image directory (e.g. 64x64 to 224x224)."""
    import keras
    from keras import layers

    inputs = keras.Input(shape=input_shape, name="image")
    x = layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    stem_stride = 2 if min(input_shape[:2]) >= 64 else 1
    x = layers.Conv2D(32, 3, strides=stem_stride, padding="same", use_bias=False, name="stem_conv")(x)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.Activation("relu", name="stem_relu")(x)
    for i, width in enumerate((32, 64, 128)):
        x = _residual_block(x, width, 1 if i == 0 else 2, f"block{i + 1}")
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, _head(x, num_classes), name="resnet_small")


# Two 3x3 convolutions and two 2x2 poolings need images of at least 10x10.
register("cnn", cnn, "the classic Keras MNIST CNN from the TensorFlow quick-start tutorials", min_image_size=10)
register("cnn_bn", cnn_bn, "CNN with batch norm", min_image_size=10)
register("resnet_small", resnet_small, "a small ResNet, for larger images from a directory")


def get_factory(name: str) -> Factory:
    """A registered name, or `package.module:function` for a user's own factory.

    Importing runs the user's module: any error in it becomes a ModelError naming the module.
    """
    if name in MODELS:
        return MODELS[name].build
    module_name, _, func_name = name.partition(":")
    try:
        with user_code(name, f"importing module {module_name}"):
            module = _import_as_saved(module_name)
    except TemplateError:
        raise
    except Exception as exc:  # their module's own code runs here: anything it raises is theirs to fix
        raise ModelError(name, f"importing module {module_name} failed: {_error_text(exc)}") from exc
    if not hasattr(module, func_name):
        raise ModelError(name, f"module {module_name} has no function {func_name!r}")
    factory = getattr(module, func_name)
    if not callable(factory):
        raise ModelError(
            name,
            f"{module_name}.{func_name} is not a function (its type is {type(factory).__name__}): give module:function",
        )
    try:
        inspect.signature(factory).bind((1, 1, 1), 2)
    except TypeError as exc:
        raise ModelError(
            name,
            f"{func_name}{inspect.signature(factory)} cannot be called as {func_name}(input_shape, num_classes): {exc}",
        ) from None
    except ValueError:
        pass  # no signature to inspect (a builtin or C callable): the call itself will tell
    return factory


_SOURCES: dict[str, str] = {}  # a user's model module -> sha256 of its file when this process last imported it
_THIS_RUN: set[str] = set()  # the modules this run has taken: it builds every copy of its model from the same code


def start_of_run() -> None:
    """train() starts a run: a model module edited since the last run is imported again at this run's
    first use of it, and only then (the test split's and the export's copies at the end are built from
    the code the run trained, whatever was saved to the file meanwhile)."""
    _THIS_RUN.clear()


def _import_as_saved(module_name: str):
    """The module as its file is now: in a long-lived process (a notebook) a module edited since the
    last run is imported again, not taken from sys.modules (the run trained the old code, or said the
    new function did not exist although MODEL's check had just found it in the file). Within one run,
    the module it started with: a file edited during training (the next experiment's) would give the
    export a different network, whose weights then fail to load into it."""
    module = sys.modules.get(module_name)
    if module is not None and module_name in _THIS_RUN:
        return module
    if module is None:
        module = importlib.import_module(module_name)
        now = _source_digest(module)
    elif (now := _source_digest(module)) is not None and _SOURCES.get(module_name, _kept(module, now)) != now:
        # Edited since a run imported it, or imported by the user (a notebook cell) before any run: what
        # that import holds may be older than the file, whose code MODEL's check has just read.
        if module_name not in _SOURCES:  # said: what the cell changed in the module's globals is gone too
            logging.getLogger("train").info(
                "MODEL: %s was imported before this run; imported again from its file, which the run records",
                module_name,
            )
        module = importlib.reload(module)
    if now is not None:
        _SOURCES[module_name] = now  # the file as imported
    _THIS_RUN.add(module_name)
    return module


def _kept(module, now: str | None) -> str | None:
    """What a module no run imported counts as: `now` (taken as it is) for an installed package's, the
    standard library's or this package's own module, which nobody edits between runs and whose reload
    would run their registrations again; None (imported again) for a user's file."""
    path = Path(getattr(module, "__file__", None) or "").resolve()
    installed = {"site-packages", "dist-packages"} & set(path.parts)
    own = [Path(sysconfig.get_paths()["stdlib"]).resolve(), Path(__file__).resolve().parent]
    return now if installed or any(path.is_relative_to(root) for root in own) else None


def _source_digest(module) -> str | None:
    path = getattr(module, "__file__", None) or ""
    try:
        return sha256_file(Path(path)) if path.endswith(".py") else None
    except OSError:
        return None


@contextlib.contextmanager
def float32_policy():
    """Inside, models are built under Keras's float32 policy (the test split's and the export's copies);
    the policy before is restored after."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def build_model(name: str, input_shape: tuple, num_classes: int) -> keras.Model:
    """The factory's model for the data, or a ModelError naming MODEL and the first line of the problem."""
    import keras

    factory = get_factory(name)
    shape, classes = tuple(int(d) for d in input_shape), int(num_classes)
    call = f"{name.partition(':')[2] or name}({shape}, {classes})"
    least = entry(name).min_image_size
    if min(shape[:2]) < least:
        raise ModelError(
            name,
            f"the images are {shape[0]}x{shape[1]}, smaller than the {least}x"
            f"{least} {name} needs: use larger images or MODEL=resnet_small",
        )
    try:
        with user_code(name, call):
            model = factory(shape, classes)
    except TemplateError:
        raise
    except Exception as exc:
        if type(exc).__name__ == "ResourceExhaustedError":
            raise  # out of memory: the loop's own message and exit code
        if type(exc).__name__ in ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError"):
            raise  # another worker was lost while the variables were broadcast: WorkerLostError, not the model
        hint = ""
        if any(w in str(exc) for w in ("negative", "zero", "Pooling")):  # Keras' words for images too small
            hint = f"; if the images ({shape[0]}x{shape[1]}) are too small for the model, use larger ones"
        raise ModelError(name, f"{call} raised {_error_text(exc)}{hint}") from exc
    if not isinstance(model, keras.Model):
        raise ModelError(name, f"{call} returned {type(model).__name__}, expected a keras.Model")
    task = entry(name)
    check_model(name, call, model, shape, classes, task.loss is sparse_crossentropy, task.metrics, task.loss)
    return model


def _error_text(exc: BaseException) -> str:
    line = first_line(exc)
    return f"{type(exc).__name__}: {line.rstrip('.')}" if line else type(exc).__name__
