"""The model registry: a name or `package.module:function` -> an uncompiled keras.Model.

Every factory has the Keras-examples signature `make_model(input_shape, num_classes)`. Inputs are
raw pixel values (0..255, float32); the model rescales them itself, so the exported model takes
raw images and the data pipeline stays free of preprocessing. The softmax output is float32 even
under a mixed-precision policy (numerically safe loss).
"""

from __future__ import annotations

import importlib
from typing import Callable

import keras
from keras import layers

from .errors import ConfigError

Factory = Callable[[tuple, int], keras.Model]


def _head(x, num_classes: int):
    x = layers.Dense(num_classes, name="logits")(x)
    return layers.Activation("softmax", dtype="float32", name="probabilities")(x)


def cnn(input_shape: tuple, num_classes: int) -> keras.Model:
    """The reference guide's CNN: Conv32-Pool-Conv64-Pool-Flatten-Dense128-Dense(classes)."""
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
    """The guide's CNN with batch normalisation after each convolution: converges in fewer epochs."""
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
    """A registered name, or `package.module:function` for a user's own factory."""
    if name in REGISTRY:
        return REGISTRY[name]
    module_name, _, func_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("MODEL", name, f"cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ConfigError("MODEL", name, f"module {module_name!r} has no function {func_name!r}")
    return factory


def build_model(name: str, input_shape: tuple, num_classes: int) -> keras.Model:
    model = get_factory(name)(tuple(input_shape), int(num_classes))
    if not isinstance(model, keras.Model):
        raise ConfigError("MODEL", name, f"the factory returned {type(model).__name__}, expected a keras.Model")
    out = model.outputs[0].shape
    if out[-1] != num_classes:
        raise ConfigError("MODEL", name, f"the model outputs {out[-1]} values but the data has {num_classes} classes")
    return model
