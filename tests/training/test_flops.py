"""flops: the FLOP count against a hand count, the peak probe and its cache, and MFU arithmetic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from train.config import Settings
from train.training import flops
from train.training.flops import FlopCount, count_flops, mfu


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


def test_the_datasheet_peak_is_used_on_known_gpus_and_the_measured_one_elsewhere():
    from train.training.flops import choose_peak, compute_dtype, datasheet_peak

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


def test_float32_on_a_gpu_with_tf32_divides_by_the_tensor_core_peak_where_there_is_one():
    from train.training.flops import compute_dtype, datasheet_peak

    assert compute_dtype("float32", tf32=True) == "tfloat32" and compute_dtype("float32") == "float32"
    assert compute_dtype("mixed_bfloat16", tf32=True) == "bfloat16"  # TF32 only changes float32
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "tfloat32") == pytest.approx(156e12)
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "tfloat32") == pytest.approx(494.5e12)
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "float32") == pytest.approx(19.5e12)  # TF32 turned off
    assert datasheet_peak("Tesla T4", "tfloat32") == pytest.approx(8.1e12)  # no TF32 tensor cores: plain float32
    assert datasheet_peak("Tesla T4", "bfloat16") is None and datasheet_peak("Some GPU", "tfloat32") is None


def test_the_tf32_probe_runs_a_float32_matmul():
    assert flops.measure_peak_flops("tfloat32", n=64, reps=1) > 0


def test_the_measured_peak_is_multiplied_by_the_devices_in_sync():
    from train.training.flops import choose_peak

    two = choose_peak(measured=70e9, datasheet=None, devices=2, where="CPU", dtype="float32")
    assert two.flops == pytest.approx(140e9) and two.measured_per_device == 70e9
    assert two.source == "measured: 1024x1024 float32 matmul on CPU, x2"
    given = flops.peak_for("2.5e11", Path("unused"), "CPU", "float32", devices=4)
    assert given.flops == pytest.approx(1e12) and given.source == "PEAK_FLOPS: 250 GFLOP/s per CPU, x4"


# --- the peak, measured once per machine and cached ----------------------------------------------

KEY = {"device": "CPU", "cpu": "Fake CPU", "cpu_count": 2, "dtype": "float32", "tensorflow": "2.21.0"}


def probes(*values: float):
    """A probe answering `values` in turn (a noisy machine), and the list of calls made."""
    calls: list[float] = []
    answers = iter(values)

    def probe() -> float:
        calls.append(next(answers))
        return calls[-1]

    return probe, calls


@pytest.fixture
def warnings(monkeypatch, caplog):
    import logging

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="train")
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_peak_is_the_best_of_several_probes_and_the_next_run_reads_it_from_the_cache(tmp_path, warnings):
    probe, calls = probes(300e9, 659e9, 295e9, 500e9, 410e9)
    first, origin = flops.cached_peak(tmp_path, KEY, probe)
    assert first == 659e9 and len(calls) == 5
    path = flops.peak_cache_file(tmp_path, KEY)
    assert origin == f"measured now (best of 5 probes), cached in {path}"
    assert path.parent == tmp_path / "peak-flops"
    recorded = json.loads(path.read_text())
    assert recorded["key"] == KEY and recorded["probes"] == calls and recorded["flops_per_device"] == 659e9

    again, calls_again = probes(100e9)
    second, origin = flops.cached_peak(tmp_path, KEY, again)
    assert second == first and calls_again == []  # no probe: the cached figure
    assert origin == f"cached from {path} (measured {recorded['measured_at']})"
    assert warnings() == []


def test_another_precision_or_tensorflow_version_is_measured_on_its_own(tmp_path):
    flops.cached_peak(tmp_path, KEY, probes(*[100e9] * 5)[0])
    for other in ({**KEY, "dtype": "bfloat16"}, {**KEY, "tensorflow": "2.22.0"}):
        probe, calls = probes(*[200e9] * 5)
        assert flops.cached_peak(tmp_path, other, probe)[0] == 200e9 and len(calls) == 5
    assert len(list((tmp_path / "peak-flops").glob("*.json"))) == 3


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "Expecting property name"),
        ('{"key": {}, "flops_per_device": 1e9, "measured_at": "x"}', "another machine"),
        (json.dumps({"key": KEY, "flops_per_device": -5, "measured_at": "x"}), "not a positive number"),
        (json.dumps({"key": KEY, "flops_per_device": "fast", "measured_at": "x"}), "not a positive number"),
        (f'{{"key": {json.dumps(KEY)}, "flops_per_device": 1{"0" * 400}, "measured_at": "x"}}', "not a positive"),
        (json.dumps({"key": KEY, "flops_per_device": 1e9, "measured_at": None}), "measured_at is None, not a time"),
        (json.dumps({"key": KEY, "measured_at": "x"}), "flops_per_device"),
        ("[]", "list indices"),
    ],
)
def test_a_corrupt_cache_is_measured_again_with_a_warning_and_replaced(tmp_path, warnings, content, why):
    path = flops.peak_cache_file(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    probe, calls = probes(*[400e9] * 5)
    peak, origin = flops.cached_peak(tmp_path, KEY, probe)
    assert peak == 400e9 and len(calls) == 5 and origin.startswith("measured now")
    [warning] = warnings()
    assert warning.startswith(f"WARNING: the cached peak {path} cannot be used (") and why in warning
    assert warning.endswith("): measuring it again")
    assert json.loads(path.read_text())["flops_per_device"] == 400e9  # the next run reads a good one


def test_peak_flops_measure_measures_again_and_replaces_the_cached_figure(tmp_path):
    flops.cached_peak(tmp_path, KEY, probes(*[100e9] * 5)[0])
    probe, calls = probes(*[300e9] * 5)
    assert flops.cached_peak(tmp_path, KEY, probe, remeasure=True)[0] == 300e9 and len(calls) == 5
    assert flops.cached_peak(tmp_path, KEY, probes()[0])[0] == 300e9


def test_a_cache_that_cannot_be_written_leaves_the_measurement_in_use(tmp_path, warnings):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    peak, origin = flops.cached_peak(blocked, KEY, probes(*[100e9] * 5)[0])
    assert peak == 100e9 and origin == "measured now (best of 5 probes; not cached)"
    [warning] = warnings()
    assert (
        warning.startswith("WARNING: the measured peak cannot be cached in ")
        and "the next run measures again" in warning
    )


def test_two_runs_in_a_row_divide_by_the_same_peak(tmp_path, monkeypatch):
    """The real probe, then the real cache: the second start does not measure."""
    first = flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1)
    monkeypatch.setattr(flops, "measure_peak_flops", lambda *a, **k: pytest.fail("the cached peak was not used"))
    second = flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1)
    assert second.flops == first.flops > 0 and second.measured_per_device == first.measured_per_device
    assert first.origin.startswith("measured now") and second.origin.startswith("cached from ")
    assert second.to_dict()["origin"] == second.origin  # recorded in the manifest
    key = flops.machine_key("CPU", "float32")
    import tensorflow as tf

    assert key["tensorflow"] == tf.__version__ and key["dtype"] == "float32" and key["device"] == "CPU"


def test_a_peak_measured_on_fewer_cores_than_this_process_may_use_is_not_read_back(tmp_path, monkeypatch):
    """`taskset -c 1` (or a container's cpuset) leaves TensorFlow one core of two: a peak or a bfloat16
    probe measured there is another machine's for a run on both, and the reverse."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    one = flops.machine_key("CPU", "float32")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    both = flops.machine_key("CPU", "float32")
    assert (one["usable_cpus"], both["usable_cpus"]) == (1, 2)
    assert flops.peak_cache_file(tmp_path, one) != flops.peak_cache_file(tmp_path, both)


@pytest.mark.parametrize("value", ["fast", "0", "-1e9", "nan", "inf", ""])
def test_peak_flops_accepts_auto_measure_or_a_positive_number(value):
    from train.config import load_settings
    from train.errors import ConfigError

    assert load_settings(env_file=None, environ={"PEAK_FLOPS": "2.5e11"}).peak_flops == "2.5e11"
    assert load_settings(env_file=None, environ={"PEAK_FLOPS": "measure"}).peak_flops == "measure"
    with pytest.raises(ConfigError) as refused:
        load_settings(env_file=None, environ={"PEAK_FLOPS": value})
    assert refused.value.name == "PEAK_FLOPS" and "auto, measure or a positive number" in str(refused.value)


def test_peak_flops_is_not_a_difference_for_reproduce(tmp_path):
    """It changes what the MFU divides by, never what training computes; runs recorded before the
    setting existed have no such key."""
    from train.reproduce.rerun import side_by_side

    old = {"epochs": 1, "seed": 42}
    rows = side_by_side({}, old, {}, {**old, "peak_flops": "measure"}, tmp_path)
    assert next(r for r in rows if r["what"] == "settings")["same"] is True


def test_a_gpu_benchmark_row_carries_model_flops_and_mfu_against_the_datasheet_peak():
    from helpers import benchmark_script

    from train.models import cnn

    throughput_row = benchmark_script("common").throughput_row  # the GPU benchmark's
    count = count_flops(cnn((28, 28, 1), 10))  # 15,786,240 FLOPs per training example
    row = throughput_row(1_000.0, 128, count, "NVIDIA A100-SXM4-40GB", "bfloat16", measured_peak=1e12)
    assert row["model_flops_per_second"] == pytest.approx(1_000 * 128 * 15_786_240)  # 2.02 TFLOP/s
    assert (row["peak_flops"], row["peak_source"]) == (312e12, "datasheet")  # the measured one is not used
    assert row["mfu"] == pytest.approx(1_000 * 128 * 15_786_240 / 312e12)  # 0.65%
    assert row["dtype"] == "bfloat16" and row["steps_per_second"] == 1_000.0
    # A T4 has no bfloat16 tensor cores (no datasheet figure): the measured peak; an unknown GPU without one: no MFU.
    t4 = throughput_row(500.0, 128, count, "Tesla T4", "bfloat16", measured_peak=20e12)
    assert (t4["peak_source"], t4["mfu"]) == ("measured", pytest.approx(500 * 128 * 15_786_240 / 20e12))
    assert throughput_row(500.0, 128, count, "Tesla T4", "float16")["mfu"] == pytest.approx(
        500 * 128 * 15_786_240 / 65e12
    )
    unknown = throughput_row(500.0, 128, count, "Some GPU", "float16")
    assert (unknown["peak_flops"], unknown["peak_source"], unknown["mfu"]) == (None, None, None)
    assert unknown["model_flops_per_second"] == pytest.approx(500 * 128 * 15_786_240)


def test_the_benchmark_summary_prints_model_flops_and_mfu_beside_each_steps_per_second():
    from helpers import benchmark_script

    summarise, throughput_row = benchmark_script("summarise"), benchmark_script("common").throughput_row
    count = FlopCount(forward_per_example=5_000_000)  # 15 MFLOP per training example
    rows = {
        "template default": throughput_row(2_000.0, 128, count, "NVIDIA H100 80GB HBM3", "bfloat16"),
        "reference": throughput_row(1_000.0, 128, count, "Some GPU", "float32"),
    }
    info = {"comparison": "6. GPU", "goal": ">= 1.0x", "ratio": 2.0, "passed": True, "gpu_rows": rows}
    assert summarise._detail(info) == (
        "model FLOP/s and MFU: template default: 2,000 steps/s = 3,840 GFLOP/s, MFU 0.4% of 989 TFLOP/s "
        "bfloat16 (datasheet), reference: 1,000 steps/s = 1,920 GFLOP/s, MFU n/a (no peak)"
    )


@pytest.mark.parametrize(
    "machine, said",
    [
        ({"cpu": {"count": 2}, "usable_cores": 1}, "(2 cores, 1 of them usable here)"),  # under taskset -c 0
        ({"cpu": {"count": 2}, "usable_cores": 2}, "(2 cores)"),
        ({"cpu": {"count": 2}}, "(2 cores)"),  # a report written before the usable count was recorded
    ],
)
def test_the_benchmark_summary_says_how_many_cores_the_benchmarks_could_use(machine, said):
    from helpers import benchmark_script

    first = benchmark_script("summarise").table({"datetime": "2026-12-07T07:00:00", "machine_info": machine})
    assert first.splitlines()[0] == f"Measured 2026-12-07T07:00:00 on ? {said}, Python ?."


def _si(x: float) -> str:
    """3 significant figures with k / M."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def test_the_gpu_ceilings_in_the_docs_follow_from_the_datasheet_and_the_flop_count():
    """docs/performance.md's T4/A100/H100 table: 100% MFU at the default batch size, each GPU in the precision
    PRECISION=auto picks there (float16 on a T4, bfloat16 from compute capability 8.0)."""
    from helpers import PROJECT_ROOT

    from train.models import cnn, resnet_small

    gpus = (("Tesla T4", "float16"), ("NVIDIA A100-SXM4-80GB", "bfloat16"), ("NVIDIA H100 80GB HBM3", "bfloat16"))
    header = "| model | FLOP/example | T4 (65 TFLOP/s fp16) | A100 (312 bf16) | H100 SXM (989 bf16) |"
    rows = [header, "|---|---|---|---|---|"]
    for label, model in (
        ("`cnn`, 28x28x1", cnn((28, 28, 1), 10)),
        ("`resnet_small`, 32x32x3", resnet_small((32, 32, 3), 10)),
    ):
        per_example = count_flops(model).train_per_example
        cells = []
        for name, dtype in gpus:
            samples = flops.datasheet_peak(name, dtype) / per_example
            cells.append(f"{_si(samples)} samples/s, {_si(samples / Settings().batch_size)} steps/s")
        rows.append(f"| {label} | {_si(per_example)} | " + " | ".join(cells) + " |")
    expected = "\n".join(rows)
    docs = (PROJECT_ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert expected in docs, "docs/performance.md's GPU ceilings, as they follow now:\n" + expected


def test_a_run_that_beats_a_measured_peak_replaces_it_so_mfu_never_passes_one(tmp_path, monkeypatch):
    """A probe taken while the machine was busy must not stay the reference: the run's rate (a floor of
    the true peak) or new probes, whichever is larger, replace it in the run and in the cache."""
    key = flops.machine_key("CPU", "float32")
    flops.cached_peak(tmp_path, key, lambda: 10e9)  # the busy first measurement
    peak = flops.peak_for("auto", tmp_path, "CPU", "float32", devices=2)
    assert peak.flops == 20e9 and mfu(10.0, FlopCount(1_000_000_000), peak.flops)[1] == 1.5  # 30 GFLOP/s
    assert flops.beaten_peak(peak, 15e9, 2, tmp_path, "CPU", "float32") is None  # not beaten: kept

    monkeypatch.setattr(flops, "measure_peak_flops", lambda dtype, device: 12e9)  # still busy now
    raised = flops.beaten_peak(peak, 30e9, 2, tmp_path, "CPU", "float32")
    assert raised.flops == 30e9 and raised.measured_per_device == 15e9 and "raised at" in raised.origin
    assert mfu(10.0, FlopCount(1_000_000_000), raised.flops)[1] == 1.0
    assert flops.cached_peak(tmp_path, key, lambda: pytest.fail("the raised peak was not cached"))[0] == 15e9

    monkeypatch.setattr(flops, "measure_peak_flops", lambda dtype, device: 40e9)  # quiet again: the probe wins
    assert flops.beaten_peak(raised, 32e9, 2, tmp_path, "CPU", "float32").measured_per_device == 40e9
    assert flops.beaten_peak(raised, 32e9, 2, tmp_path, "CPU", "float32", probe=False).measured_per_device == 16e9


def test_a_peak_an_older_version_raised_is_measured_again_once(tmp_path, warnings):
    """Such a version counted an epoch's short last batch as a full one: a small data set at a large batch
    raised the cached peak past the machine's. A record it wrote is measured again; a raised one written
    now is kept."""
    import json

    key = flops.machine_key("CPU", "float32")
    path = flops.peak_cache_file(tmp_path, key)
    path.parent.mkdir(parents=True)
    old = {"key": key, "flops_per_device": 99e9, "probes": [10e9], "measured_at": "2026-12-05", "beaten_by_a_run": True}
    path.write_text(json.dumps(old))
    assert flops.cached_peak(tmp_path, key, lambda: 12e9)[0] == 12e9
    assert warnings() == [
        f"WARNING: the cached peak {path} cannot be used (it was raised by a run of an older version, which could "
        "overstate a run's speed): measuring it again"
    ]
    peak = flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1)
    flops.beaten_peak(peak, 20e9, 1, tmp_path, "CPU", "float32", probe=False)
    assert flops.cached_peak(tmp_path, key, lambda: pytest.fail("measured again"))[0] == 20e9


def test_a_datasheet_or_given_peak_is_never_raised(tmp_path):
    given = flops.peak_for("2.5e11", tmp_path, "CPU", "float32", devices=1)
    sheet = flops.choose_peak(1e12, 312e12, 1, "NVIDIA A100-SXM4-80GB", "bfloat16")
    assert flops.beaten_peak(given, 3e11, 1, tmp_path, "CPU", "float32") is None
    assert flops.beaten_peak(sheet, 400e12, 1, tmp_path, "A100", "bfloat16") is None


def test_the_bf16_probe_is_measured_once_per_machine_and_the_next_run_reads_it(tmp_path, warnings):
    """PRECISION=auto's choice on a CPU with native bfloat16 is the same for every run on the machine."""
    probe, calls = probes(0.55)
    speedup, origin = flops.cached_bf16_speedup(tmp_path, probe)
    [path] = (tmp_path / "bf16-speedup").glob("*.json")
    assert speedup == 0.55 and calls == [0.55] and origin == f"probe measured now, cached in {path}"
    recorded = json.loads(path.read_text())
    assert recorded["speedup"] == 0.55 and recorded["key"]["dtype"] == "bfloat16 over float32"

    again, calls_again = probes(1.7)
    assert flops.cached_bf16_speedup(tmp_path, again) == (
        0.55,
        f"probe cached from {path}, measured {recorded['measured_at']}",
    )
    assert calls_again == [] and warnings() == []


def test_a_corrupt_bf16_probe_cache_is_measured_again_with_a_warning(tmp_path, warnings):
    flops.cached_bf16_speedup(tmp_path, probes(0.55)[0])
    [path] = (tmp_path / "bf16-speedup").glob("*.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "speedup": 0}))
    probe, calls = probes(1.4)
    assert flops.cached_bf16_speedup(tmp_path, probe)[0] == 1.4 and calls == [1.4]
    [warning] = warnings()
    assert warning == (
        f"WARNING: the cached bfloat16 probe {path} cannot be used (speedup is 0, not a positive number): "
        "measuring it again"
    )
    assert json.loads(path.read_text())["speedup"] == 1.4


def test_the_bf16_probe_without_a_cache_folder_is_measured_and_not_cached(tmp_path):
    probe, calls = probes(0.55)
    assert flops.cached_bf16_speedup(None, probe) == (0.55, "probe measured now, not cached") and calls == [0.55]


# --- each layer kind, each peak and each message, whole ----------------------------------------


def _one_layer(shape, layer, dtype="float32"):
    import keras

    inputs = keras.Input(shape, dtype=dtype)
    return keras.Model(inputs, layer(inputs))


def _layer_cases():
    import keras

    L = keras.layers
    return [
        # (input shape, layer, forward FLOPs per example by hand, counted)
        ((10, 3), L.Conv1D(4, 3, name="k"), 2 * (8 * 4) * (3 * 3), ("k",)),
        ((4, 4, 4, 2), L.Conv3D(3, 2, name="k"), 2 * (3 * 3 * 3 * 3) * (2 * 2 * 2 * 2), ("k",)),
        # groups=2: each output channel sees half the input channels
        ((6, 6, 4), L.Conv2D(4, 3, groups=2, name="k"), 2 * (4 * 4 * 4) * (3 * 3 * 2), ("k",)),
        ((8, 4), L.DepthwiseConv1D(3, name="k"), 2 * (6 * 4) * 3, ("k",)),
        ((8, 4), L.SeparableConv1D(5, 3, name="k"), 2 * 6 * 4 * 3 + 2 * (6 * 5) * 4, ("k",)),
        # depth_multiplier=2: 3 input channels make 6 depthwise ones, each fed to the pointwise step
        ((6, 6, 3), L.SeparableConv2D(4, 3, depth_multiplier=2, name="k"), 2 * 16 * 6 * 9 + 2 * (16 * 4) * 6, ("k",)),
        ((4, 5), L.Dense(3, name="k"), 2 * (4 * 3) * 5, ("k",)),
        ((4, 5), L.LayerNormalization(name="k"), 0, ()),
        ((4, 5), L.BatchNormalization(name="k"), 0, ()),
        ((4, 5), L.Normalization(mean=0.0, variance=1.0, name="k"), 0, ()),
        ((4, 5), L.Normalization(axis=-1, name="k"), 0, ()),
        ((4, 5), L.Flatten(name="k"), 0, ()),
    ]


@pytest.mark.parametrize("case", range(12))
def test_each_layer_kind_is_counted_as_by_hand(case):
    shape, layer, forward, counted = _layer_cases()[case]
    if type(layer).__name__ == "Normalization" and layer.axis == (-1,) and layer.input_mean is None:
        layer.build((None, *shape))  # adapt()'s mean and variance: weights, and still no matmul
        assert layer.weights
    count = count_flops(_one_layer(shape, layer))
    assert (count.forward_per_example, count.counted_layers, count.uncounted_layers) == (forward, counted, ())


def test_an_embedding_is_a_lookup_not_a_matmul():
    import keras

    count = count_flops(_one_layer((5,), keras.layers.Embedding(10, 4, name="emb"), dtype="int32"))
    assert (count.forward_per_example, count.counted_layers, count.uncounted_layers) == (0, (), ())


def test_the_flop_count_recorded_in_the_manifest_is_whole():
    count = FlopCount(1_000, ("conv1", "logits"), ("einsum",))
    assert count.to_dict() == {
        "train_per_example": 3_000,
        "forward_per_example": 1_000,
        "convention": "matmul and convolution multiply-adds x2, training = 3x forward",
        "counted_layers": ["conv1", "logits"],
        "uncounted_layers": ["einsum"],
    }
    assert FlopCount(7).to_dict()["counted_layers"] == [] and FlopCount(7).uncounted_layers == ()


def test_each_peak_chosen_is_recorded_whole():
    from train.training.flops import Peak, choose_peak

    sheet = choose_peak(600e12, 989e12, 2, "NVIDIA H100 80GB HBM3", "bfloat16", "cached from x")
    assert sheet == Peak(
        2 * 989e12, "datasheet: 989 TFLOP/s bfloat16 per NVIDIA H100 80GB HBM3, x2", 600e12, 989e12, "cached from x"
    )
    assert choose_peak(70e9, None, 3, "CPU", "float32", "measured now") == Peak(
        210e9, "measured: 1024x1024 float32 matmul on CPU, x3", 70e9, None, "measured now"
    )
    assert choose_peak(None, None, 1, "CPU", "float32", "the probe failed") == Peak(
        None, "unknown: the probe failed", None, None, "the probe failed"
    )
    assert choose_peak(70e9, None, 1, "CPU", "float32").to_dict() == {
        "flops": 70e9,
        "source": "measured: 1024x1024 float32 matmul on CPU, x1",
        "measured_per_device": 70e9,
        "datasheet_per_device": None,
        "origin": "",
    }


def test_a_device_without_a_name_has_no_datasheet_peak():
    assert flops.datasheet_peak(None, "float32") is None and flops.datasheet_peak("", "bfloat16") is None


def test_the_machine_key_holds_everything_the_peak_depends_on(monkeypatch):
    import tensorflow as tf

    from train.setup.hardware import cpu_model

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    environ = {"TF_ENABLE_ONEDNN_OPTS": "0", "ONEDNN_MAX_CPU_ISA": "avx2"}
    assert flops.machine_key("CPU", "float32", environ) == {
        "device": "CPU",
        "cpu": cpu_model(),
        "usable_cpus": 3,
        "dtype": "float32",
        "tensorflow": tf.__version__,
        "onednn_on": False,
        "onednn_max_isa": "AVX2",
    }


def test_the_cache_file_is_named_by_a_short_digest_of_the_key_in_any_order(tmp_path):
    import hashlib

    digest = hashlib.sha256(json.dumps(KEY, sort_keys=True).encode()).hexdigest()[:16]
    assert flops.peak_cache_file(tmp_path, KEY) == tmp_path / "peak-flops" / f"{digest}.json"
    assert (
        flops.peak_cache_file(tmp_path, dict(reversed(KEY.items())), "other") == tmp_path / "other" / f"{digest}.json"
    )


@pytest.mark.parametrize(
    "record, why",
    [
        ({"flops_per_device": True}, "flops_per_device is True, not a positive number"),
        ({"flops_per_device": 0}, "flops_per_device is 0, not a positive number"),
        ({"flops_per_device": float("inf")}, "flops_per_device is inf, not a positive number"),
        ({"flops_per_device": 10**400}, f"flops_per_device is {'1' + '0' * 39}, not a positive number"),
        ({"flops_per_device": 1e9, "measured_at": 5}, "measured_at is 5, not a time"),
        ({"measured_at": None, "flops_per_device": 1e9}, "measured_at is None, not a time"),
        ({"key": {**KEY, "dtype": "bfloat16"}}, "it was measured for another machine, precision or TensorFlow version"),
        (
            {"beaten_by_a_run": True, "short_batches_counted": False},
            "it was raised by a run of an older version, which could overstate a run's speed",
        ),
    ],
)
def test_each_unusable_cached_peak_says_why_whole(tmp_path, warnings, record, why):
    path = flops.peak_cache_file(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    good = {"key": KEY, "flops_per_device": 2e9, "probes": [2e9], "measured_at": "2026-01-01T00:00:00+00:00"}
    path.write_text(json.dumps({**good, **record}))
    assert flops.cached_peak(tmp_path, KEY, lambda: 3e9) == (
        3e9,
        f"measured now (best of 5 probes), cached in {path}",
    )
    assert warnings() == [f"WARNING: the cached peak {path} cannot be used ({why}): measuring it again"]


def test_a_cached_peak_raised_by_a_run_of_this_version_is_read_back(tmp_path, warnings):
    path = flops.peak_cache_file(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    when = "2026-01-01T00:00:00+00:00"
    record = {"key": KEY, "flops_per_device": 20e9, "measured_at": when, "beaten_by_a_run": True}
    path.write_text(json.dumps({**record, "short_batches_counted": True}))
    assert flops.cached_peak(tmp_path, KEY, lambda: pytest.fail("measured again")) == (
        20e9,
        f"cached from {path} (measured {when})",
    )
    assert warnings() == []


def test_a_cache_file_that_is_a_dangling_link_is_measured_again_with_a_warning(tmp_path, warnings):
    path = flops.peak_cache_file(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    path.symlink_to(tmp_path / "gone.json")
    assert flops.cached_peak(tmp_path, KEY, lambda: 3e9)[0] == 3e9
    assert warnings() == [
        f"WARNING: the cached peak {path} cannot be used ([Errno 2] No such file or directory: '{path}'): "
        "measuring it again"
    ]


def test_an_unwritable_cache_is_one_whole_warning(tmp_path, warnings):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    path = flops.peak_cache_file(blocked, KEY)
    assert flops.cached_peak(blocked, KEY, lambda: 1e9) == (
        1e9,
        "measured now (best of 5 probes; not cached)",
    )
    assert warnings() == [
        f"WARNING: the measured peak cannot be cached in {path} (cannot write {path.parent}: Not a directory): "
        "the next run measures again"
    ]


class _Probe:
    """measure_peak_flops as a run calls it: each call's dtype and device, answering `flops`."""

    def __init__(self, flops: float | Exception):
        self.flops, self.calls = flops, []

    def __call__(self, dtype, device):
        self.calls.append((dtype, device))
        if isinstance(self.flops, Exception):
            raise self.flops
        return self.flops


def test_peak_for_measures_five_probes_on_the_device_it_names_and_caches_them(tmp_path, monkeypatch):
    probe = _Probe(5e9)
    monkeypatch.setattr(flops, "measure_peak_flops", probe)
    peak = flops.peak_for("auto", tmp_path, "Some GPU", "bfloat16", devices=2)
    path = flops.peak_cache_file(tmp_path, flops.machine_key("Some GPU", "bfloat16"))
    assert probe.calls == [("bfloat16", "/GPU:0")] * 5
    assert peak == flops.Peak(
        10e9,
        "measured: 1024x1024 bfloat16 matmul on Some GPU, x2",
        5e9,
        None,
        f"measured now (best of 5 probes), cached in {path}",
    )
    probe.calls.clear()
    assert flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1).flops == 5e9
    assert probe.calls == [("float32", "/CPU:0")] * 5


def test_peak_flops_measure_probes_again_though_a_peak_is_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(flops, "measure_peak_flops", _Probe(5e9))
    flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1)
    probe = _Probe(6e9)
    monkeypatch.setattr(flops, "measure_peak_flops", probe)
    assert flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1).flops == 5e9 and probe.calls == []
    assert flops.peak_for("measure", tmp_path, "CPU", "float32", devices=1).flops == 6e9 and len(probe.calls) == 5


def test_a_given_peak_is_recorded_as_given(tmp_path):
    assert flops.peak_for("2.5e11", tmp_path, "NVIDIA A100-SXM4-80GB", "bfloat16", devices=2) == flops.Peak(
        5e11, "PEAK_FLOPS: 250 GFLOP/s per NVIDIA A100-SXM4-80GB, x2", None, None, "PEAK_FLOPS"
    )


def test_a_probe_that_fails_leaves_the_peak_unknown_with_one_warning(tmp_path, monkeypatch, warnings):
    monkeypatch.setattr(flops, "measure_peak_flops", _Probe(RuntimeError("no device")))
    peak = flops.peak_for("auto", tmp_path, "CPU", "float32", devices=1)
    assert peak == flops.Peak(None, "unknown: the probe failed", None, None, "the probe failed")
    assert warnings() == ["WARNING: the peak FLOP/s probe failed (RuntimeError: no device): no MFU for this run"]


def test_a_beaten_peak_is_raised_to_the_best_of_five_probes_on_its_device_and_recorded_whole(tmp_path, monkeypatch):
    peak = flops.choose_peak(10e9, None, 2, "Some GPU", "float16", "measured now")
    probe = _Probe(12e9)
    monkeypatch.setattr(flops, "measure_peak_flops", probe)
    assert flops.beaten_peak(peak, 20e9, 2, tmp_path, "Some GPU", "float16") is None  # equal: not beaten
    raised = flops.beaten_peak(peak, 30e9, 2, tmp_path, "Some GPU", "float16")
    assert probe.calls == [("float16", "/GPU:0")] * 5
    key = flops.machine_key("Some GPU", "float16")
    path = flops.peak_cache_file(tmp_path, key)
    record = json.loads(path.read_text())
    when = record["measured_at"]
    assert record == {
        "key": key,
        "flops_per_device": 15e9,
        "probes": [12e9] * 5,
        "measured_at": when,
        "beaten_by_a_run": True,
        "short_batches_counted": True,
    }
    assert raised == flops.Peak(
        30e9, peak.source, 15e9, None, f"raised at {when}: a run reached 15.0 GFLOP/s per device, cached in {path}"
    )
    probe.calls.clear()
    flops.beaten_peak(raised, 40e9, 2, tmp_path, "CPU", "float16", probe=False)
    assert probe.calls == []


def test_a_beaten_peak_whose_probe_fails_or_cache_is_unwritable_is_still_raised_to_the_run_s_rate(
    tmp_path, monkeypatch, warnings
):
    peak = flops.choose_peak(10e9, None, 1, "CPU", "float32")
    monkeypatch.setattr(flops, "measure_peak_flops", _Probe(RuntimeError("busy")))
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    raised = flops.beaten_peak(peak, 11e9, 1, blocked, "CPU", "float32")
    assert flops.measure_peak_flops.calls == [("float32", "/CPU:0")]  # the first probe failed: no more
    assert (raised.flops, raised.measured_per_device, raised.source) == (11e9, 11e9, peak.source)
    assert raised.origin.endswith(": a run reached 11.0 GFLOP/s per device")
    path = flops.peak_cache_file(blocked, flops.machine_key("CPU", "float32"))
    assert warnings() == [
        f"WARNING: the raised peak cannot be cached in {path} (cannot write {path.parent}: Not a directory): "
        "this run still divides by the new figure"
    ]


def test_a_peak_with_no_figure_or_none_measured_is_never_raised(tmp_path):
    unknown = flops.Peak(None, "unknown: the probe failed")
    given = flops.Peak(1e9, "PEAK_FLOPS: 1 GFLOP/s per CPU, x1", origin="PEAK_FLOPS")
    assert flops.beaten_peak(unknown, 1e9, 1, tmp_path, "CPU", "float32") is None
    assert flops.beaten_peak(given, 2e9, 1, tmp_path, "CPU", "float32") is None
    assert not (tmp_path / "peak-flops").exists()


def test_a_beaten_peak_on_the_cpu_is_probed_on_the_cpu(tmp_path, monkeypatch):
    probe = _Probe(4e9)
    monkeypatch.setattr(flops, "measure_peak_flops", probe)
    peak = flops.choose_peak(1e9, None, 1, "CPU", "bfloat16")
    assert flops.beaten_peak(peak, 2e9, 1, tmp_path, "CPU", "bfloat16").flops == 4e9
    assert probe.calls == [("bfloat16", "/CPU:0")] * 5


def test_on_a_gpu_with_a_datasheet_peak_the_mfu_divides_by_it_and_the_measured_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(flops, "measure_peak_flops", _Probe(100e12))
    where = "NVIDIA A100-SXM4-80GB"
    peak = flops.peak_for("auto", tmp_path, where, "bfloat16", devices=4)
    path = flops.peak_cache_file(tmp_path, flops.machine_key(where, "bfloat16"))
    assert peak == flops.Peak(
        4 * 312e12,
        f"datasheet: 312 TFLOP/s bfloat16 per {where}, x4",
        100e12,
        312e12,
        f"measured now (best of 5 probes), cached in {path}",
    )


def test_the_machine_cache_is_under_a_local_runs_dir(tmp_path):
    assert flops.machine_cache(str(tmp_path / "runs")) == tmp_path / "runs" / ".cache"


def test_the_bf16_probe_is_cached_under_this_cpu_s_key_whole(tmp_path):
    flops.cached_bf16_speedup(tmp_path, probes(0.55)[0])
    key = flops.machine_key("CPU", "bfloat16 over float32")
    path = flops.peak_cache_file(tmp_path, key, "bf16-speedup")
    record = json.loads(path.read_text())
    assert record == {"key": key, "speedup": 0.55, "measured_at": record["measured_at"]}


def test_a_bf16_probe_that_cannot_be_cached_is_one_whole_warning(tmp_path, warnings):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    path = flops.peak_cache_file(blocked, flops.machine_key("CPU", "bfloat16 over float32"), "bf16-speedup")
    assert flops.cached_bf16_speedup(blocked, probes(0.55)[0]) == (0.55, "probe measured now, not cached")
    assert warnings() == [
        f"WARNING: the bfloat16 probe's figure cannot be cached in {path} (cannot write {path.parent}: Not a "
        "directory): the next run measures again"
    ]


def test_an_open_dimension_counts_once():
    """A model built for any length (Input((None, 3))) is counted per position: each open dimension is 1."""
    import keras

    inputs = keras.Input((None, 3))
    count = count_flops(keras.Model(inputs, keras.layers.Conv1D(4, 1, name="k")(inputs)))
    assert count.forward_per_example == 2 * 4 * 3
