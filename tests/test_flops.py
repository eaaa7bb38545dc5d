"""flops: the FLOP count against a hand count, the peak probe, and MFU arithmetic."""

from __future__ import annotations

import pytest

from train import flops
from train.flops import FlopCount, count_flops, mfu


def test_the_default_cnn_matches_the_hand_count():
    from train.models import cnn

    # By hand, 28x28x1 input, 10 classes, 2 FLOPs per multiply-add:
    conv1 = 26 * 26 * 32 * (3 * 3 * 1) * 2  # 389,376
    conv2 = 11 * 11 * 64 * (3 * 3 * 32) * 2  # 4,460,544
    dense = 128 * (5 * 5 * 64) * 2  # 409,600
    logits = 10 * 128 * 2  # 2,560
    count = count_flops(cnn((28, 28, 1), 10))
    assert count.forward_per_example == conv1 + conv2 + dense + logits == 5_262_080
    assert count.train_per_example == 3 * 5_262_080  # about 15.8 MFLOP per training example
    assert count.counted_layers == ("conv1", "conv2", "dense", "logits")
    assert count.uncounted_layers == ()


def test_batch_norm_and_pooling_add_nothing_and_strided_convs_count_their_outputs():
    from train.models import resnet_small

    count = count_flops(resnet_small((32, 32, 3), 10))
    assert count.uncounted_layers == ()
    assert not any("bn" in name or "pool" in name for name in count.counted_layers)
    assert count.forward_per_example > 0


def test_depthwise_separable_and_nested_models_are_counted():
    import keras

    inner = keras.Sequential([keras.Input((8, 8, 4)), keras.layers.DepthwiseConv2D(3, name="dw")], name="inner")
    inputs = keras.Input((8, 8, 4))
    x = inner(inputs)
    x = keras.layers.SeparableConv2D(6, 3, name="sep")(x)
    model = keras.Model(inputs, x)
    count = count_flops(model)
    dw = 6 * 6 * 4 * 9 * 2
    sep = 4 * 4 * 4 * 9 * 2 + 4 * 4 * 6 * 4 * 2
    assert count.forward_per_example == dw + sep
    assert count.counted_layers == ("dw", "sep")


def test_an_unknown_layer_with_weights_is_listed_not_guessed():
    import keras

    inputs = keras.Input((5,))
    x = keras.layers.EinsumDense("ab,bc->ac", output_shape=3, name="einsum")(inputs)
    count = count_flops(keras.Model(inputs, keras.layers.Dense(2, name="head")(x)))
    assert count.uncounted_layers == ("einsum",)
    assert count.forward_per_example == 2 * 2 * 3


def test_mfu_is_achieved_over_peak_and_unknown_without_a_throughput_or_peak():
    count = FlopCount(forward_per_example=1_000_000)
    achieved, fraction = mfu(2_000.0, count, peak_flops=12e9)
    assert achieved == pytest.approx(6e9) and fraction == pytest.approx(0.5)
    assert mfu(None, count, 12e9) == (None, None)
    assert mfu(2_000.0, count, None) == (None, None)


def test_the_peak_probe_measures_a_matmul(monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # three timed repetitions: 0.5 s, 0.25 s, 1.0 s
    monkeypatch.setattr(flops.time, "perf_counter", lambda: next(ticks))
    peak = flops.measure_peak_flops(n=64, reps=3)
    assert peak == pytest.approx(2 * 64**3 / 0.25)  # the best repetition


def test_the_datasheet_peak_is_used_on_known_gpus_and_the_measured_one_elsewhere():
    from train.flops import choose_peak, compute_dtype, datasheet_peak

    assert compute_dtype("mixed_bfloat16") == "bfloat16" and compute_dtype("mixed_float16") == "float16"
    assert compute_dtype("float32") == "float32"
    h100 = datasheet_peak("NVIDIA H100 80GB HBM3", "bfloat16")
    assert h100 == pytest.approx(989e12)
    assert datasheet_peak("NVIDIA T4", "bfloat16") is None and datasheet_peak("Some GPU", "float32") is None
    gpu = choose_peak(measured=600e12, datasheet=h100, devices=2, where="NVIDIA H100 80GB HBM3", dtype="bfloat16")
    assert gpu.flops == pytest.approx(2 * 989e12) and gpu.source.startswith("datasheet: 989 TFLOP/s bfloat16")
    assert gpu.measured_per_device == 600e12  # recorded beside it
    cpu = choose_peak(measured=70e9, datasheet=None, devices=1, where="CPU", dtype="float32")
    assert cpu.flops == 70e9 and cpu.source == "measured: 1024x1024 float32 matmul on CPU, x1"
    assert choose_peak(None, None, 1, "CPU", "float32").flops is None
