"""models: every registered model builds and outputs float32 probabilities; user factories fail clearly."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from train.errors import ConfigError
from train.models import REGISTRY, build_model, get_factory


@pytest.fixture
def bf16_policy():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("shape", [(28, 28, 1), (64, 64, 3)])
def test_registered_models_build_with_float32_output_under_mixed_bfloat16(name, shape, bf16_policy):
    model = build_model(name, shape, 5)
    assert tuple(model.inputs[0].shape) == (None, *shape)
    assert tuple(model.outputs[0].shape) == (None, 5)
    probs = model(np.full((2, *shape), 255, np.float32), training=False)
    assert probs.dtype == "float32"
    np.testing.assert_allclose(np.sum(np.asarray(probs), axis=1), 1.0, rtol=1e-5)


USER_MODULE = '''
import keras


def good(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def three_classes(input_shape, num_classes):
    return good(input_shape, 3)


def not_a_model(input_shape, num_classes):
    return "a string"


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


@pytest.mark.parametrize("spec, words", [
    ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'"),
    ("{mod}:missing", "has no function 'missing'"),
    ("{mod}:NOT_CALLABLE", "has no function 'NOT_CALLABLE'"),
    ("{mod}:not_a_model", "returned str, expected a keras.Model"),
    ("{mod}:three_classes", "outputs 3 values but the data has 4 classes"),
])
def test_bad_user_factories_are_config_errors_naming_model(user_module, spec, words):
    spec = spec.format(mod=user_module)
    with pytest.raises(ConfigError) as info:
        build_model(spec, (8, 8, 1), 4)
    assert info.value.name == "MODEL" and info.value.value == spec
    assert words in str(info.value)


@pytest.mark.parametrize("name, has, lacks", [
    ("cnn", "Conv2D", ("BatchNormalization", "Add")),
    ("cnn_bn", "BatchNormalization", ("Add",)),
    ("resnet_small", "Add", ()),
])
def test_each_registered_name_builds_its_own_architecture(name, has, lacks):
    from train import models

    assert get_factory(name) is getattr(models, name)  # the name is the factory's own, not another's
    kinds = {type(layer).__name__ for layer in build_model(name, (28, 28, 1), 3).layers}
    assert has in kinds and not kinds & set(lacks)
    assert sorted(REGISTRY) == ["cnn", "cnn_bn", "resnet_small"]  # a new model gets a row above
