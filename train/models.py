"""The model registry: a name or `package.module:function` -> an uncompiled keras.Model.

Every factory has the Keras-examples signature `make_model(input_shape, num_classes)`. Inputs are
raw pixel values (0..255, float32); the model rescales them itself, so the exported model takes
raw images and the data pipeline stays free of preprocessing. The softmax output is float32 even
under a mixed-precision policy (numerically safe loss).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

import keras
from keras import layers

from .config import MIN_IMAGE_SIZE
from .errors import ModelError, TemplateError

Factory = Callable[[tuple, int], keras.Model]


def _head(x, num_classes: int):
    x = layers.Dense(num_classes, name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(x)


def cnn(input_shape: tuple, num_classes: int) -> keras.Model:
    """The classic Keras MNIST CNN from the TensorFlow quick-start tutorials.

    Conv32-Pool-Conv64-Pool-Flatten-Dense128-Dense(classes), with the rescaling inside the model.
    """
    inputs = keras.Input(shape=input_shape, name="image")
    x = layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    x = layers.Conv2D(32, 3, activation="relu", name="conv1")(x)
    x = layers.MaxPooling2D(2, name="pool1")(x)
    x = layers.Conv2D(64, 3, activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(2, name="pool2")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(128, activation="relu", name="dense")(x)
    return keras.Model(inputs, _head(x, num_classes), name="cnn")


def cnn_bn(input_shape: tuple, num_classes: int) -> keras.Model:
    """The classic CNN with batch normalisation after each convolution: converges in fewer epochs."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    for i, width in enumerate((32, 64), start=1):
        x = layers.Conv2D(width, 3, use_bias=False, name=f"conv{i}")(x)
        x = layers.BatchNormalization(name=f"bn{i}")(x)
        x = layers.Activation("relu", name=f"relu{i}")(x)
        x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(128, activation="relu", name="dense")(x)
    return keras.Model(inputs, _head(x, num_classes), name="cnn_bn")


def _residual_block(x, width: int, stride: int, name: str):
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


REGISTRY: dict[str, Factory] = {"cnn": cnn, "cnn_bn": cnn_bn, "resnet_small": resnet_small}


def get_factory(name: str) -> Factory:
    """A registered name, or `package.module:function` for a user's own factory.

    Importing runs the user's module: any error in it becomes a ModelError naming the module.
    """
    if name in REGISTRY:
        return REGISTRY[name]
    module_name, _, func_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # their module's own code runs here: anything it raises is theirs to fix
        raise ModelError(name, f"importing module {module_name} failed: {_first_line(exc)}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ModelError(name, f"module {module_name} has no function {func_name!r}")
    try:
        inspect.signature(factory).bind((1, 1, 1), 2)
    except TypeError as exc:
        raise ModelError(name, f"{func_name}{inspect.signature(factory)} cannot be called as "
                               f"{func_name}(input_shape, num_classes): {exc}") from None
    except ValueError:
        pass  # no signature to inspect (a builtin or C callable): the call itself will tell
    return factory


def build_model(name: str, input_shape: tuple, num_classes: int) -> keras.Model:
    """The factory's model for the data, or a ModelError naming MODEL and the first line of the problem."""
    factory = get_factory(name)
    shape, classes = tuple(int(d) for d in input_shape), int(num_classes)
    call = f"{name.partition(':')[2] or name}({shape}, {classes})"
    if min(shape[:2]) < MIN_IMAGE_SIZE.get(name, 0):
        raise ModelError(name, f"the images are {shape[0]}x{shape[1]}, smaller than the {MIN_IMAGE_SIZE[name]}x"
                               f"{MIN_IMAGE_SIZE[name]} {name} needs: use larger images or MODEL=resnet_small")
    try:
        model = factory(shape, classes)
    except TemplateError:
        raise
    except Exception as exc:
        if type(exc).__name__ == "ResourceExhaustedError":
            raise  # out of memory: the loop's own message and exit code
        hint = ""
        if any(w in str(exc) for w in ("negative", "zero", "Pooling")):  # Keras' words for images too small
            hint = f"; if the images ({shape[0]}x{shape[1]}) are too small for the model, use larger ones"
        raise ModelError(name, f"{call} raised {_first_line(exc)}{hint}") from exc
    if not isinstance(model, keras.Model):
        raise ModelError(name, f"{call} returned {type(model).__name__}, expected a keras.Model")
    outputs = getattr(model, "outputs", None) or []  # a subclassed model has none until it is called
    if outputs and outputs[0].shape[-1] != classes:
        raise ModelError(name, f"the model outputs {outputs[0].shape[-1]} values but the data has {classes} classes")
    return model


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200].rstrip('.')}" if lines else type(exc).__name__
