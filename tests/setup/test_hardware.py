"""hardware: the precision `auto` picks, from faked GPU compute capabilities, CPU flags and probes."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers import benchmark_script

from train.errors import ConfigError
from train.setup.hardware import (
    check_precision_fits_isa,
    choose_batch,
    choose_precision,
    cpu_bf16,
    cpu_family,
    cpu_flags,
    measure_bf16_speedup,
    onednn_enabled,
    onednn_max_isa,
    onednn_state,
    turn_on_onednn,
)


@pytest.mark.parametrize(
    "ccs, policy, cc_text",
    [
        ([(6, 1)], "float32", "6.1"),
        ([(7, 0)], "mixed_float16", "7.0"),  # a V100: float16 tensor cores from 7.0 on
        ([(7, 5)], "mixed_float16", "7.5"),
        ([(8, 0)], "mixed_bfloat16", "8.0"),
        ([(9, 0)], "mixed_bfloat16", "9.0"),
        ([(9, 0), (7, 5)], "mixed_float16", "7.5"),  # mixed GPUs: the weakest decides
        ([(8, 6), (6, 1), (9, 0)], "float32", "6.1"),
    ],
)
def test_auto_on_gpus(ccs, policy, cc_text):
    got, reason = choose_precision("auto", ccs, {"amx_bf16"})  # GPU decides; CPU flags ignored
    assert got == policy
    assert cc_text in reason


@pytest.mark.parametrize(
    "flags, policy, named",
    [
        ({"fpu", "amx_bf16", "avx512f"}, "mixed_bfloat16", "amx_bf16"),
        ({"avx512_bf16"}, "mixed_bfloat16", "avx512_bf16"),
        ({"amx_bf16", "avx512_bf16"}, "mixed_bfloat16", "amx_bf16, avx512_bf16"),
        ({"avx2", "avx512f"}, "float32", "emulated"),
        (set(), "float32", "emulated"),
    ],
)
def test_auto_on_cpu(flags, policy, named):
    got, reason = choose_precision("auto", [], flags)
    assert got == policy
    assert named in reason


@pytest.mark.parametrize("flags", [{"avx512_bf16"}, {"amx_bf16", "avx512_bf16"}])
def test_auto_on_a_bf16_cpu_without_onednn_is_float32(flags):
    got, reason = choose_precision("auto", [], flags, onednn=False)
    assert got == "float32"
    assert "TF_ENABLE_ONEDNN_OPTS" in reason and "avx512_bf16" in reason


def test_onednn_off_changes_nothing_on_gpus_or_for_an_explicit_precision():
    assert choose_precision("auto", [(8, 0)], {"avx512_bf16"}, onednn=False)[0] == "mixed_bfloat16"
    assert choose_precision("mixed_bfloat16", [], {"avx512_bf16"}, onednn=False)[0] == "mixed_bfloat16"


@pytest.mark.parametrize("isa", ["AVX2", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI", "SSE41"])
def test_auto_on_a_bf16_cpu_with_onednn_capped_below_bf16_is_float32(isa):
    got, reason = choose_precision("auto", [], {"amx_bf16", "avx512_bf16"}, max_isa=isa)
    assert got == "float32"
    assert f"ONEDNN_MAX_CPU_ISA={isa}" in reason and "AVX512_CORE_BF16" in reason


@pytest.mark.parametrize("isa", [None, "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", "DEFAULT"])
def test_an_isa_cap_that_keeps_the_bf16_kernels_keeps_bf16(isa):
    assert choose_precision("auto", [], {"avx512_bf16"}, max_isa=isa)[0] == "mixed_bfloat16"


def test_an_isa_cap_changes_nothing_on_gpus_or_for_an_explicit_precision():
    assert choose_precision("auto", [(8, 0)], {"avx512_bf16"}, max_isa="AVX2")[0] == "mixed_bfloat16"
    assert choose_precision("mixed_bfloat16", [], {"avx512_bf16"}, max_isa="AVX2")[0] == "mixed_bfloat16"


@pytest.mark.parametrize(
    "environ, isa",
    [
        ({}, None),
        ({"ONEDNN_MAX_CPU_ISA": ""}, None),
        ({"ONEDNN_MAX_CPU_ISA": "avx2"}, "AVX2"),  # oneDNN reads the name in any case
        ({"DNNL_MAX_CPU_ISA": "AVX512_CORE"}, "AVX512_CORE"),  # the older name
        ({"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "ALL"}, "AVX2"),
    ],
)
def test_onednn_max_isa_reads_both_names(environ, isa):
    assert onednn_max_isa(environ) == isa


AVX2 = {"avx2", "fma"}  # an AVX2-only EPYC: TensorFlow leaves oneDNN off there
VNNI = {"avx2", "avx512f", "avx512_vnni"}  # a Cascade Lake Xeon: on by TensorFlow's default


@pytest.mark.parametrize(
    "environ, flags, on",
    [
        ({}, AVX2, False),
        ({}, VNNI, True),
        ({}, {"avx2", "avx_vnni"}, True),
        ({}, {"avx2", "avx512f"}, False),  # a Skylake Xeon: AVX-512 without VNNI
        ({"TF_ENABLE_ONEDNN_OPTS": "1"}, AVX2, True),
        ({"TF_ENABLE_ONEDNN_OPTS": "true"}, AVX2, True),
        ({"TF_ENABLE_ONEDNN_OPTS": ""}, VNNI, True),  # TensorFlow ignores a value it cannot read: its default
        ({"TF_ENABLE_ONEDNN_OPTS": "yes"}, AVX2, False),
        ({"TF_ENABLE_ONEDNN_OPTS": " 1"}, AVX2, False),  # TensorFlow does not strip it: ignored
        ({"TF_ENABLE_ONEDNN_OPTS": "TRUE"}, AVX2, True),
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, VNNI, False),
        ({"TF_ENABLE_ONEDNN_OPTS": "false"}, VNNI, False),
        ({"TF_ENABLE_ONEDNN_OPTS": "False"}, VNNI, False),
    ],
)
def test_onednn_enabled_reads_the_variable_and_the_cpu_as_tensorflow_does(environ, flags, on):
    assert onednn_enabled(environ, flags) is on


def test_onednn_is_turned_on_only_where_tensorflow_would_leave_it_off_and_nobody_chose(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)  # not imported yet, as at a run's start
    env: dict[str, str] = {}
    assert turn_on_onednn(env, AVX2, "x86_64") and env == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    assert onednn_state(env, AVX2) == "on (TF_ENABLE_ONEDNN_OPTS=1)"
    for env, flags, machine in [
        ({"TF_ENABLE_ONEDNN_OPTS": "0"}, AVX2, "x86_64"),  # the user's choice
        ({}, VNNI, "x86_64"),  # TensorFlow turns it on by itself
        ({}, {"asimd"}, "aarch64"),  # oneDNN's x86 kernels only
    ]:
        before = dict(env)
        assert not turn_on_onednn(env, flags, machine) and env == before
    monkeypatch.setitem(sys.modules, "tensorflow", object())  # imported: it has read the variable already
    env = {}
    assert not turn_on_onednn(env, AVX2, "x86_64") and env == {}
    assert onednn_state(env, AVX2).startswith("off (TensorFlow's default on a CPU without AVX512-VNNI")
    assert "TF_ENABLE_ONEDNN_OPTS=1 set before TensorFlow is imported turns it on" in onednn_state(env, AVX2)
    assert onednn_state({}, VNNI) == "on (TensorFlow's default on a CPU with AVX512-VNNI, AVX512-BF16 or AMX)"
    assert onednn_state({"TF_ENABLE_ONEDNN_OPTS": "0"}, VNNI) == "off (TF_ENABLE_ONEDNN_OPTS=0)"
    # A value TensorFlow cannot read keeps its default, is never replaced, and the record says it was ignored.
    env = {"TF_ENABLE_ONEDNN_OPTS": "yes"}
    monkeypatch.delitem(sys.modules, "tensorflow")
    assert not turn_on_onednn(env, AVX2, "x86_64") and env == {"TF_ENABLE_ONEDNN_OPTS": "yes"}
    assert onednn_state(env, AVX2) == (
        "off (TensorFlow's default on a CPU without AVX512-VNNI, AVX512-BF16 or AMX; TF_ENABLE_ONEDNN_OPTS='yes' "
        "is ignored: TensorFlow reads 0, 1, true or false; TF_ENABLE_ONEDNN_OPTS=1 set before TensorFlow is "
        "imported turns it on)"
    )
    assert onednn_state({"TF_ENABLE_ONEDNN_OPTS": ""}, VNNI) == (
        "on (TensorFlow's default on a CPU with AVX512-VNNI, AVX512-BF16 or AMX; TF_ENABLE_ONEDNN_OPTS='' "
        "is ignored: TensorFlow reads 0, 1, true or false)"
    )


@pytest.mark.parametrize("requested", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_explicit_precision_is_kept_whatever_the_hardware(requested):
    assert choose_precision(requested, [(6, 1)], set()) == (requested, "set by PRECISION")
    assert choose_precision(requested, [], {"amx_bf16"})[0] == requested


def test_cpu_bf16_keeps_the_documented_order():
    assert cpu_bf16(["avx512_bf16", "sse", "amx_bf16"]) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16([]) == []


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Fake CPU\nflags\t\t: fpu sse avx512_bf16 amx_bf16\nbugs\t\t: spectre\n\n"
        "processor\t: 1\nflags\t\t: fpu other\n"
    )
    assert cpu_flags(info) == {"fpu", "sse", "avx512_bf16", "amx_bf16"}


def test_cpuinfo_is_read_whole_lines_past_bytes_that_are_not_utf8_and_colons_in_the_value(tmp_path):
    from train.setup.hardware import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_bytes(b"model name\t: Caf\xe9 CPU: rev 2\nflags\t\t: fpu avx2\n")
    assert cpu_model(info) == "Caf\ufffd CPU: rev 2"
    assert cpu_flags(info) == {"fpu", "avx2"}


def test_cpu_flags_and_model_read_this_machines_cpuinfo_by_default():
    assert cpu_flags() == cpu_flags("/proc/cpuinfo")
    from train.setup.hardware import cpu_model

    assert cpu_model() == cpu_model("/proc/cpuinfo")


def test_cpu_flags_without_a_flags_line_or_file_is_empty(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nFeatures\t: neon\n")  # e.g. ARM: no `flags` line
    assert cpu_flags(info) == set()
    assert cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize("isa", ["AVX2", "AVX", "SSE41", "AVX2_VNNI", "AVX2_VNNI_2"])
def test_bfloat16_on_the_cpu_under_a_cap_where_tensorflow_crashes_is_refused(isa):
    with pytest.raises(ConfigError) as caught:
        check_precision_fits_isa("mixed_bfloat16", [], {"avx2", "avx512f", "avx512_bf16"}, isa)
    assert caught.value.name == "PRECISION" and f"ONEDNN_MAX_CPU_ISA={isa}" in str(caught.value)
    assert caught.value.value == "mixed_bfloat16" and "PRECISION=float32" in str(caught.value)


def test_bfloat16_on_a_cpu_with_avx_ne_convert_and_no_avx512_under_the_avx2_cap_is_refused():
    # TensorFlow hands bfloat16 to oneDNN on avx512f or avx_ne_convert (an AVX2 core of a newer Intel CPU).
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA=AVX2"):
        check_precision_fits_isa("mixed_bfloat16", [], {"avx2", "avx_ne_convert"}, "AVX2")


def test_the_refusal_names_onednn_max_cpu_isa_where_both_names_are_set(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # read first (onednn_max_isa)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    with pytest.raises(ConfigError) as caught:
        check_precision_fits_isa("mixed_bfloat16", [], {"avx512f", "avx512_bf16"}, "AVX2")
    assert str(caught.value).endswith("or unset ONEDNN_MAX_CPU_ISA")


def test_the_refusal_names_the_variable_that_sets_the_cap(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "avx2")  # oneDNN's older name, still read
    with pytest.raises(ConfigError) as caught:
        check_precision_fits_isa("mixed_bfloat16", [], {"avx512f", "avx512_bf16"}, "AVX2")
    assert str(caught.value).endswith(
        "crash under DNNL_MAX_CPU_ISA=AVX2: use PRECISION=float32 (or auto), or unset DNNL_MAX_CPU_ISA"
    )


def test_bfloat16_under_a_crashing_cap_is_refused_before_tensorflow_where_no_gpu_can_be_seen(tmp_path, monkeypatch):
    from train.setup.hardware import check_precision_fits_isa_now

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text("flags\t\t: avx2 avx512f avx512_bf16\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA=AVX2"):
        check_precision_fits_isa_now("mixed_bfloat16", tmp_path)
    check_precision_fits_isa_now("float32", tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kfd").touch()  # an AMD GPU may do the bfloat16 work: the device set-up decides
    check_precision_fits_isa_now("mixed_bfloat16", tmp_path)
    (tmp_path / "dev" / "kfd").unlink()
    (tmp_path / "dev" / "nvidiactl").touch()  # and an NVIDIA one
    check_precision_fits_isa_now("mixed_bfloat16", tmp_path)


@pytest.mark.parametrize(
    "policy, ccs, flags, isa",
    [
        ("float32", [], {"avx512f"}, "AVX2"),
        ("mixed_bfloat16", [(8, 0)], {"avx512f"}, "AVX2"),  # the GPU does the bfloat16 work
        ("mixed_bfloat16", [], {"avx512f"}, "AVX512_CORE"),  # emulated there, slow but correct
        ("mixed_bfloat16", [], {"avx512f"}, None),
        ("mixed_bfloat16", [], {"avx2", "fma"}, "AVX2"),  # no AVX-512: TensorFlow keeps bf16 off oneDNN
        ("mixed_bfloat16", [], {"avx512f", "avx_ne_convert"}, "AVX2_VNNI_2"),  # its bfloat16 kernels are there
    ],
)
def test_other_precisions_and_caps_pass_the_isa_check(policy, ccs, flags, isa):
    check_precision_fits_isa(policy, ccs, flags, isa)


def test_cpu_model_is_the_model_name_line(tmp_path):
    from train.setup.hardware import cpu_model

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9R14 96-Core Processor"
    assert isinstance(cpu_model(tmp_path / "missing"), str)  # platform's answer, maybe ""


def test_the_peak_probe_measures_a_matmul(monkeypatch):
    from train.setup import hardware

    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 3.0])  # three timed repetitions: 0.5 s, 0.25 s, 1.0 s
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: next(ticks))
    peak = hardware.measure_peak_flops(n=64, reps=3)
    assert peak == pytest.approx(2 * 64**3 / 0.25)  # the best repetition


def test_the_peak_probe_runs_on_the_device_and_in_the_type_asked(monkeypatch):
    import tensorflow as tf

    from train.setup import hardware

    devices, types, device = [], [], tf.device
    monkeypatch.setattr(tf, "device", lambda name: devices.append(name) or device(name))
    matmul = tf.matmul
    monkeypatch.setattr(tf, "matmul", lambda a, b: types.append(a.dtype.name) or matmul(a, b))
    hardware.measure_peak_flops("bfloat16", "/CPU:0", n=8, reps=1)
    hardware.measure_peak_flops("tfloat32", n=8, reps=1)  # TF32 is how float32 runs on a GPU
    assert devices == ["/CPU:0"]  # the default device: no device scope
    assert types == ["bfloat16", "bfloat16", "float32", "float32"]  # the warm-up and the timed one


def test_in_container_reads_the_engines_marker_files_and_on_request_the_runtime_in_the_cgroup(tmp_path):
    from train.setup.hardware import in_container

    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1234/abcd\n")
    assert not in_container(tmp_path)  # no marker: the run directory's hint about compose does not apply
    assert in_container(tmp_path, orchestrated=True)  # the GPU check: a pod is a container too
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/init.scope\n")
    assert not in_container(tmp_path, orchestrated=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").touch()  # Podman
    assert in_container(tmp_path)
    (tmp_path / "run" / ".containerenv").unlink()
    (tmp_path / ".dockerenv").touch()
    assert in_container(tmp_path) and in_container(tmp_path, orchestrated=True)


@pytest.mark.parametrize("runtime", ["docker", "kubepods", "containerd", "libpod"])
def test_in_an_orchestrated_container_each_runtime_in_the_cgroup_is_read(tmp_path, runtime):
    from train.setup.hardware import in_container

    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text(f"0::/system.slice/{runtime}-abcd.scope\n")
    assert in_container(tmp_path, orchestrated=True)


def test_without_a_cgroup_file_no_container_is_seen(tmp_path):
    from train.setup.hardware import in_container

    assert not in_container(tmp_path, orchestrated=True)  # e.g. macOS: no /proc


@pytest.mark.parametrize(
    "flags, cap, family",
    [
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, None, "AMX"),
        ({"avx2", "avx512f", "avx512_bf16"}, "ALL", "AVX512-BF16"),
        ({"avx2", "avx512f"}, None, "AVX-512"),
        ({"avx2"}, "avx512_core_amx", "AVX2"),  # a cap above the CPU caps nothing
        ({"sse4_2"}, None, "older (no AVX2)"),
        (
            {"avx2", "avx512f", "avx512_bf16", "amx_bf16"},
            "avx2",
            "AVX2 (stand-in: AMX CPU with ONEDNN_MAX_CPU_ISA=AVX2)",
        ),
        (
            {"avx2", "avx512f", "avx512_bf16"},
            "AVX512_CORE",
            "AVX-512 (stand-in: AVX512-BF16 CPU with ONEDNN_MAX_CPU_ISA=AVX512_CORE)",
        ),
        # The caps between the bfloat16 kernels and AMX (one level, two names) leave an AMX CPU without AMX.
        (
            {"avx2", "avx512f", "avx512_bf16", "amx_bf16"},
            "avx10_1_512",
            "AVX512-BF16 (stand-in: AMX CPU with ONEDNN_MAX_CPU_ISA=AVX10_1_512)",
        ),
        (
            {"avx2", "avx512f", "avx512_bf16", "amx_bf16"},
            "AVX512_CORE_FP16",
            "AVX512-BF16 (stand-in: AMX CPU with ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16)",
        ),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX10_1_512", "AVX512-BF16"),
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX10_1_512_AMX", "AMX"),
    ],
)
def test_the_cpu_family_is_the_strongest_kernels_oneDNN_may_use_and_a_capped_cpu_a_stand_in(flags, cap, family):
    assert cpu_family(flags, cap) == family
    assert benchmark_script("common").cpu_family(flags, cap) == family  # the benchmarks' goals follow it


def test_the_kernels_of_a_family_are_its_whole_name_and_those_of_a_stand_in_the_capped_ones():
    from train.setup.hardware import kernels

    older = cpu_family({"sse4_2"}, None)
    assert kernels(older) == older == "older (no AVX2)"
    assert kernels(cpu_family({"avx2", "avx512f"}, "AVX")) == "older (no AVX2)"
    assert kernels(cpu_family({"avx2", "avx512f", "amx_bf16"}, "AVX512_CORE")) == "AVX-512"


def test_the_benchmarks_family_reads_this_machines_flags_and_cap_unless_given(monkeypatch):
    common = benchmark_script("common")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "sse41")
    assert common.cpu_family() == cpu_family(cpu_flags(), "SSE41")
    assert common.cpu_family({"avx2"}) == "older (no AVX2) (stand-in: AVX2 CPU with ONEDNN_MAX_CPU_ISA=SSE41)"
    assert common.cpu_family({"avx2"}, None) == "AVX2"  # None: no cap, whatever the environment says


def _probe(speedup: float):
    calls = []

    def probe():
        calls.append(speedup)
        return speedup, "probe measured now"

    return probe, calls


@pytest.mark.parametrize(
    "speedup, policy",
    [(0.55, "float32"), (0.89, "float32"), (0.9, "mixed_bfloat16"), (0.97, "mixed_bfloat16"), (1.6, "mixed_bfloat16")],
)
def test_auto_on_a_bf16_cpu_follows_the_probe_and_says_what_it_measured(speedup, policy):
    """Native bfloat16 kernels slower than float32's (an Intel Xeon with avx512_bf16 and no AMX: 0.55x)
    make auto float32; a probe near 1 keeps bfloat16, which also halves the traffic around the convolutions."""
    probe, calls = _probe(speedup)
    got, reason = choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=probe)
    assert got == policy and calls == [speedup]
    assert reason.startswith("CPU has native bfloat16 (avx512_bf16)")
    assert f"its bfloat16 convolution ran {speedup:.2f}x float32's (probe measured now)" in reason


@pytest.mark.parametrize(
    "requested, ccs, flags, onednn, isa",
    [
        ("mixed_bfloat16", [], {"avx512_bf16"}, True, None),  # the user's setting wins
        ("auto", [(8, 0)], {"avx512_bf16"}, True, None),  # a GPU decides
        ("auto", [], {"avx2", "avx512f"}, True, None),  # no native bfloat16: float32 without measuring
        ("auto", [], {"avx512_bf16"}, False, None),  # oneDNN off
        ("auto", [], {"avx512_bf16"}, True, "AVX512_CORE"),  # oneDNN capped below its bfloat16 kernels
    ],
)
def test_the_probe_runs_only_where_the_cpu_could_run_bfloat16_natively(requested, ccs, flags, onednn, isa):
    probe, calls = _probe(0.5)
    without = choose_precision(requested, ccs, flags, onednn, isa)
    assert choose_precision(requested, ccs, flags, onednn, isa, bf16_speedup=probe) == without
    assert calls == []


def test_a_probe_that_fails_is_float32_and_says_why():
    # A bfloat16 convolution that cannot run (oneDNN capped under a name this module does not know):
    # the model's first convolution would fail the same way.
    def probe():
        raise RuntimeError("could not create a primitive descriptor\nmore lines")

    got, reason = choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=probe)
    assert got == "float32"
    assert reason == (
        "CPU has native bfloat16 (avx512_bf16), but the bfloat16 probe failed: "
        "RuntimeError: could not create a primitive descriptor"
    )


def test_a_probe_that_fails_is_quoted_whole_however_long_its_first_line():
    def probe():
        raise RuntimeError("x" * 300)

    assert choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=probe)[1].endswith("RuntimeError: " + "x" * 300)


BOTH = "amx_bf16, avx512_bf16"


@pytest.mark.parametrize(
    "onednn, isa, probe, reason",
    [
        (
            False,
            None,
            None,
            f"TF_ENABLE_ONEDNN_OPTS turns oneDNN off: without it bfloat16 is emulated even on this CPU ({BOTH})",
        ),
        (
            True,
            "AVX2",
            None,
            "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below its bfloat16 kernels (AVX512_CORE_BF16): "
            f"bfloat16 would be emulated even on this CPU ({BOTH})",
        ),
        (True, None, None, f"CPU has native bfloat16 ({BOTH})"),
        (True, None, 0.5, f"CPU has native bfloat16 ({BOTH}), but its bfloat16 convolution ran 0.50x float32's (p)"),
        (True, None, 1.5, f"CPU has native bfloat16 ({BOTH}); its bfloat16 convolution ran 1.50x float32's (p)"),
        (True, None, "fails", f"CPU has native bfloat16 ({BOTH}), but the bfloat16 probe failed: OSError: no"),
    ],
)
def test_each_reason_of_auto_on_a_cpu_with_native_bfloat16_is_exact(onednn, isa, probe, reason):
    def bf16_speedup():
        if probe == "fails":
            raise OSError("no")
        return probe, "p"

    speedup = None if probe is None else bf16_speedup
    assert choose_precision("auto", [], {"avx512_bf16", "amx_bf16"}, onednn, isa, speedup)[1] == reason


def test_a_probe_that_measured_no_figure_is_float32():
    got, reason = choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=lambda: (math.nan, "a probe"))
    assert got == "float32" and reason.endswith("the bfloat16 probe failed: ValueError: the probe measured nanx")


def test_a_figure_just_below_the_threshold_never_reads_as_it():
    got, reason = choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=lambda: (0.8996, "a probe"))
    assert got == "float32" and "ran 0.89x float32's" in reason
    got, reason = choose_precision("auto", [], {"avx512_bf16"}, bf16_speedup=lambda: (0.9, "a probe"))
    assert got == "mixed_bfloat16" and "ran 0.90x float32's" in reason


def test_the_bf16_probe_times_the_default_cnns_second_convolution_in_both_types_the_best_of_five(monkeypatch):
    import tensorflow as tf

    from train.setup import hardware

    traced = []

    def conv2d(x, k, strides, padding):  # traced once a type: the shapes the probe measures
        traced.append((x.dtype.name, x.shape.as_list(), k.shape.as_list(), strides, padding))
        return tf.reduce_sum(x) + tf.reduce_sum(k)

    monkeypatch.setattr(tf.nn, "conv2d", conv2d)
    calls, function = [], tf.function

    def counted(step):  # each timed call runs the compiled convolution
        compiled = function(step)
        return lambda *args: calls.append(len(args)) or compiled(*args)

    monkeypatch.setattr(tf, "function", counted)
    # Interleaved, float32 first: float32 takes 5, 5, 5, 5 then 2 s, bfloat16 4, 4, 4, 4 then 1 s.
    took = [d for pair in zip([5, 5, 5, 5, 2], [4, 4, 4, 4, 1]) for d in pair]
    ticks = iter(t for d, end in zip(took, itertools.accumulate(took)) for t in (end - d, end))
    monkeypatch.setattr(hardware.time, "perf_counter", lambda: next(ticks))
    assert hardware.measure_bf16_speedup() == 2.0  # float32's best over bfloat16's
    assert next(ticks, None) is None  # five repetitions each, no more
    layer = ([256, 26, 26, 32], [3, 3, 32, 64], 1, "VALID")
    assert traced == [("float32", *layer), ("bfloat16", *layer)]
    assert len(calls) == 2 * (1 + 5)  # a warm-up and five timed calls each


def test_the_real_probe_measures_both_precisions_on_this_cpu():
    speedup = measure_bf16_speedup(reps=2)
    assert 0.01 < speedup < 100  # a ratio of two timings of the same work, whatever this CPU is


@pytest.mark.parametrize(
    "kept, ccs, flags, isa, want",
    [
        ("float32", [], {"avx512_bf16"}, None, "float32"),  # kept, though the probe would pick bfloat16
        ("mixed_bfloat16", [], {"avx512_bf16"}, None, "mixed_bfloat16"),  # kept, though the probe says 0.5x
        ("mixed_bfloat16", [], {"avx2"}, None, "float32"),  # no native bfloat16 here: picked anew
        ("mixed_bfloat16", [], {"avx512_bf16"}, "AVX2", "float32"),  # oneDNN capped below it
        ("mixed_float16", [(8, 0)], set(), None, "mixed_float16"),  # an Ampere has float16 tensor cores too
        ("mixed_float16", [], {"avx512_bf16"}, None, "mixed_bfloat16"),  # a GPU run resumed on a CPU: picked anew
        ("mixed_bfloat16", [(7, 5)], set(), None, "mixed_float16"),  # a T4 has no bfloat16 tensor cores
        ("mixed_float16", [(7, 5)], set(), None, "mixed_float16"),  # a T4 keeps float16, though not bfloat16's 8.0
        ("mixed_float16", [(7, 0)], set(), None, "mixed_float16"),  # from 7.0 on, as auto picks it
        ("mixed_bfloat16", [(8, 0)], set(), None, "mixed_bfloat16"),  # from 8.0 on
    ],
)
def test_a_resume_keeps_the_runs_precision_where_the_devices_run_it_natively(kept, ccs, flags, isa, want):
    probe, calls = _probe(0.5 if kept == "mixed_bfloat16" else 1.5)
    got, reason = choose_precision("auto", ccs, flags, max_isa=isa, bf16_speedup=probe, kept=(kept, "why"))
    assert got == want
    assert reason.startswith("the precision this run trained in until now, kept on resume") == (got == kept)
    assert calls == [] or got != kept  # a kept precision needs no probe


def test_a_precision_kept_twice_names_its_first_reason_once():
    first = choose_precision("auto", [], {"avx2"}, kept=("float32", "CPU has no native bfloat16"))[1]
    assert choose_precision("auto", [], {"avx2"}, kept=("float32", first))[1] == first
    assert choose_precision("float32", [], {"avx2"}, kept=("mixed_bfloat16", "x")) == ("float32", "set by PRECISION")
    # The start's probe is in the past at a resume; a record from before the wording is not prefixed twice.
    measured = "float32 (its bfloat16 convolution ran 0.54x float32's (probe measured now, cached in c.json))"
    kept = choose_precision("auto", [], {"avx2"}, kept=("float32", measured))[1]
    assert kept.endswith("(probe measured then, cached in c.json))") and "measured now" not in kept
    older = "the precision this run trained in until now, kept on resume; chosen because: CPU has no native bfloat16"
    assert choose_precision("auto", [], {"avx2"}, kept=("float32", older))[1] == first


def test_a_run_that_sets_no_batch_trains_in_batches_of_256_on_a_cpu_in_float32_and_512_elsewhere():
    """In float32 on a CPU an example costs about the same at 256 as at 512 and the more steps learn more an
    epoch; in 16 bits, or on GPUs, the larger batch runs faster. The rate goes with the batch."""
    default = (512, 0.007)
    batch, rate, why = choose_batch("float32", False, default)
    assert (batch, rate) == (256, 0.008) and why == (
        "training in float32 on a CPU, where an example costs about the same at 256 as at 512 and the more steps "
        "an epoch reach the accuracy in fewer epochs; LEARNING_RATE 0.008, measured best at 256"
    )
    assert choose_batch("mixed_bfloat16", False, default)[:2] == default
    assert choose_batch("float32", True, default)[:2] == default  # a GPU without tensor cores: still 512
    assert choose_batch("mixed_float16", True, default)[2] == "the defaults, for training on GPUs"
    assert choose_batch("mixed_bfloat16", False, default)[2] == "the defaults, for training in mixed_bfloat16"


def test_in_the_compose_container_a_missing_file_is_told_where_it_goes_on_the_host(tmp_path, monkeypatch):
    from train.setup.hardware import compose_volume_hint

    compose = {"DATA_DIR": "/data", "RUNS_DIR": "/runs"}  # what docker-compose.yml sets
    assert compose_volume_hint("digit.png", compose, tmp_path) == ""  # no container: the host's own paths
    (tmp_path / ".dockerenv").touch()
    assert compose_volume_hint("digit.png", {"DATA_DIR": "./data"}, tmp_path) == ""  # a container of another kind
    monkeypatch.chdir(tmp_path)  # the image's /app: a file named from there is not on a volume
    outside = compose_volume_hint("digit.png", compose, tmp_path)
    assert "put the file in ./data beside docker-compose.yml" in outside and "give it as /data/<file>" in outside
    assert compose_volume_hint("/data/mnist.npz", compose, tmp_path) == (
        "/data is ./data beside docker-compose.yml on the host (DATA_HOST_DIR in .env moves it)"
    )
    assert compose_volume_hint("/runs/x/a.png", compose, tmp_path).startswith("/runs is ./runs beside")


def test_what_a_run_records_of_onednn_is_what_tensorflow_then_runs():
    """A fresh process as a run starts it (turn_on_onednn before the import, no TF_ENABLE_ONEDNN_OPTS of
    the user's): TensorFlow's own answer, and the record's, on any x86 CPU."""
    import os
    import platform
    import subprocess
    import sys

    from helpers import PROJECT_ROOT

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("oneDNN's x86 kernels: this is no x86 CPU")
    code = (
        "from train.setup.hardware import onednn_state, turn_on_onednn; turn_on_onednn(); "
        "from tensorflow.python.util import _pywrap_util_port as port; print(port.IsMklEnabled(), onednn_state())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    tensorflow_says, _, record = done.stdout.strip().rpartition("\n")[2].partition(" ")
    assert (tensorflow_says, record[:4]) == ("True", "on ("), done.stdout + done.stderr[-2000:]
    assert ("set by the template" in record) == (not onednn_enabled({})), record
