"""devices: on a CPU, setup_devices applies the precision policy and seeds, and says what it did."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from train.config import Settings
from train.setup import devices

pytestmark = pytest.mark.skipif(
    bool(tf.config.list_physical_devices("GPU")), reason="CPU behaviour; GPUs change the choice"
)


@pytest.fixture(autouse=True)
def restore_policy():
    previous = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(previous)


@pytest.mark.parametrize("flags, policy", [({"avx512_bf16"}, "mixed_bfloat16"), ({"avx2"}, "float32")])
def test_auto_precision_on_cpu_follows_the_cpu_flags(monkeypatch, flags, policy):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(devices, "cpu_flags", lambda: flags)
    setup = devices.setup_devices(Settings(precision="auto"))
    assert setup.precision == policy
    assert keras.mixed_precision.global_policy().name == policy
    assert (setup.gpus, setup.strategy, setup.replicas) == ([], None, 1)
    assert setup.describe().startswith(f"devices: CPU; precision {policy} (CPU has")
    assert setup.cpu["family"] == ("AVX512-BF16" if "avx512_bf16" in flags else "AVX2")  # what the manifest records


def test_auto_precision_on_a_bf16_cpu_whose_bfloat16_is_slower_is_float32(monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx512_bf16"})
    setup = devices.setup_devices(Settings(precision="auto"), bf16_speedup=lambda: (0.55, "a probe"))
    assert setup.precision == "float32" and keras.mixed_precision.global_policy().name == "float32"
    assert setup.precision_reason.endswith("but its bfloat16 convolution ran 0.55x float32's (a probe)")
    assert setup.cpu["family"] == "AVX512-BF16"


def test_auto_precision_is_float32_when_onednn_is_turned_off(monkeypatch):
    # Read from the environment as TensorFlow reads it: without oneDNN, bf16 is emulated.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx512_bf16"})
    setup = devices.setup_devices(Settings(precision="auto"))
    assert setup.precision == "float32"
    assert "TF_ENABLE_ONEDNN_OPTS" in setup.precision_reason


def test_auto_precision_is_float32_when_onednn_is_capped_below_its_bf16_kernels(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx512_bf16"})
    setup = devices.setup_devices(Settings(precision="auto"))
    assert setup.precision == "float32"
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE" in setup.precision_reason


def test_bfloat16_under_a_cap_where_tensorflow_crashes_is_a_config_error_before_any_bf16_op(monkeypatch):
    from train.errors import ConfigError

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA=AVX2"):
        devices.setup_devices(Settings(precision="mixed_bfloat16"))


@pytest.mark.parametrize(
    ("precision", "flags", "environ", "speedup", "pair"),
    [
        ("auto", {"avx2"}, {}, None, (256, 0.008)),  # no native bfloat16: float32
        ("auto", {"avx512_bf16"}, {}, 1.4, (512, 0.007)),  # bfloat16 the probe found faster
        ("auto", {"avx512_bf16"}, {}, 0.55, (256, 0.008)),  # slower: float32
        ("auto", {"avx512_bf16"}, {"TF_ENABLE_ONEDNN_OPTS": "0"}, None, (256, 0.008)),
        ("auto", {"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, None, (256, 0.008)),
        ("float32", {"avx512_bf16"}, {}, None, (256, 0.008)),
        ("mixed_bfloat16", {"avx2"}, {}, None, (512, 0.007)),
    ],
)
def test_the_batch_a_new_run_chooses_follows_the_precision_it_will_train_in(
    monkeypatch, precision, flags, environ, speedup, pair
):
    """docs/configuration.md: 256 and 0.008 wherever a CPU trains in float32, 512 and 0.007 elsewhere."""
    for name in ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(devices, "cpu_flags", lambda: flags)

    def probe():
        assert speedup is not None, "the probe is asked only where it decides"
        return speedup, "a probe"

    assert devices.batch_choice(Settings(precision=precision), probe)[:2] == pair


def test_explicit_precision_is_applied():
    setup = devices.setup_devices(Settings(precision="mixed_float16"))
    assert keras.mixed_precision.global_policy().name == "mixed_float16"
    assert setup.precision_reason == "set by PRECISION"


def test_the_seed_makes_initial_weights_and_random_ops_repeat():
    def draw(seed):
        devices.setup_devices(Settings(precision="float32", seed=seed))
        layer = keras.layers.Dense(3)
        layer.build((None, 4))
        return np.asarray(layer.kernel), np.random.rand(2), float(tf.random.uniform(()))

    a, b, c = draw(7), draw(7), draw(8)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])


def test_gpu_memory_is_empty_on_a_cpu():
    assert devices.gpu_memory() == (None, None)


def test_gpu_memory_sums_tensorflows_counts_over_the_gpus_and_restarts_the_peak(monkeypatch):
    info = {
        "GPU:0": {"current": 100 * 2**20, "peak": 300 * 2**20},
        "GPU:1": {"current": 50 * 2**20, "peak": 60 * 2**20},
    }
    reset = []
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind: ["gpu0", "gpu1"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda name: info[name])
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", reset.append)
    assert devices.gpu_memory() == (150.0, 360.0)
    assert reset == ["GPU:0", "GPU:1"]  # each epoch's peak is its own


def test_gpu_memory_is_empty_when_tensorflow_cannot_say(monkeypatch):
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind: ["gpu0"])
    monkeypatch.setattr(tf.config.experimental, "get_memory_info", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert devices.gpu_memory() == (None, None)
