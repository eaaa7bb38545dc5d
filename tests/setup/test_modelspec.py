"""modelspec: MODEL=module:function judged from the source, without importing it (no TensorFlow)."""

from __future__ import annotations

import sys

import pytest

from train.errors import ConfigError
from train.setup.modelspec import check_model_spec

SOURCE = """
import keras
from keras import layers as L


def make(input_shape, num_classes):
    return None


def one_arg(input_shape):
    return None


def three_args(input_shape, num_classes, width):
    return None


def with_default(input_shape, num_classes, width=8, *, depth=2):
    return None


def star(*args):
    return None


def kw_only(input_shape, num_classes, *, width):
    return None


@staticmethod
def decorated(x):
    return None


if True:
    try:
        def guarded(input_shape, num_classes):
            return None
    except ImportError:
        pass

alias = make
"""


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    (tmp_path / "zoo_for_test").mkdir()
    (tmp_path / "zoo_for_test" / "__init__.py").write_text("")
    (tmp_path / "zoo_for_test" / "cnns.py").write_text(SOURCE)
    (tmp_path / "zoo_for_test" / "bad.py").write_text("def make(input_shape, num_classes):\n  return (\n")
    (tmp_path / "zoo_for_test" / "lazy.py").write_text("def __getattr__(name):\n    return None\n")
    (tmp_path / "flat_for_test.py").write_text(SOURCE)
    (tmp_path / "zoo_for_test" / "dyn.py").write_text("for n in ('a', 'b'):\n    globals()[n] = print\n")
    (tmp_path / "ns_for_test" / "deep").mkdir(parents=True)  # namespace packages: no __init__.py
    (tmp_path / "ns_for_test" / "deep" / "nets.py").write_text("def make(input_shape):\n    pass\n")
    (tmp_path / "zoo_for_test" / "fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "spec",
    [
        "zoo_for_test.cnns:make",
        "flat_for_test:make",
        "flat_for_test:with_default",
        "flat_for_test:star",
        "flat_for_test:decorated",
        "flat_for_test:guarded",
        "flat_for_test:alias",
        "flat_for_test:L",
        "zoo_for_test.lazy:anything",
        "zoo_for_test.dyn:a",
        "zoo_for_test.fast:make",
    ],
)
def test_specs_that_may_work_pass(pkg, spec):
    check_model_spec(spec)
    assert "flat_for_test" not in sys.modules and "zoo_for_test.cnns" not in sys.modules  # nothing imported


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_such_module_xyz:make", "cannot find module 'no_such_module_xyz': run from the folder that holds it"),
        ("zoo_for_test.nothere:make", "cannot find module 'zoo_for_test.nothere'"),
        ("flat_for_test.sub:make", "flat_for_test is a module, not a package"),
        ("zoo_for_test.bad:make", "bad.py, line 2: SyntaxError"),
        ("zoo_for_test.cnns:missing", "cnns.py defines no function 'missing'"),
        ("flat_for_test:one_arg", "one_arg() in {root}/flat_for_test.py (line 10) takes 1 positional argument"),
        ("flat_for_test:three_args", "three_args() in {root}/flat_for_test.py (line 14) requires 3 arguments"),
        ("flat_for_test:kw_only", "requires the keyword argument width"),
        (
            "ns_for_test.deep.nets:make",
            "make() in {root}/ns_for_test/deep/nets.py (line 1) takes 1 positional argument",
        ),
        ("ns_for_test.deep.nothere:make", "cannot find module 'ns_for_test.deep.nothere'"),
        ("flat_for_test:keras", "'keras' in {root}/flat_for_test.py (line 2) is an imported module, not a function"),
        ("__main__:tiny", "a function defined in a notebook or script has no module to import it from: register it"),
    ],
)
def test_specs_that_cannot_work_are_config_errors_before_import(pkg, spec, words):
    with pytest.raises(ConfigError) as e:
        check_model_spec(spec)
    assert (e.value.name, e.value.value) == ("MODEL", spec)
    assert words.format(root=pkg) in str(e.value)
    assert "flat_for_test" not in sys.modules
