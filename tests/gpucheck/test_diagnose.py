"""train.gpucheck.diagnose: every diagnosis from faked facts (recorded nvidia-smi, NVML stand-in, injected
build info, device lists, TensorFlow log lines and environment variables), read through the
report. No GPU, no TensorFlow import."""

from __future__ import annotations

import pytest
from check_fakes import CUDA_BUILD, CUINIT_NOISE, DLOPEN_ERRORS, LIBS_OK, codes, cpu_tf, cuda_tf, on, tf_gpus
from test_gpuinfo import FakeNVML, h100, recorded_smi

from train.gpucheck import check, diagnose, gpuinfo, tflog
from train.gpucheck.facts import Facts, LibFact, TfFacts


@pytest.mark.parametrize(
    "value,expect",
    [
        (None, "NVIDIA_VISIBLE_DEVICES is not set"),
        ("void", "'void'"),
        ("none", "'none'"),
        ("", "''"),
        ("all", "not started with the NVIDIA runtime"),
    ],
)
def test_no_driver_in_container(value, expect):
    facts = Facts(
        tf=cuda_tf(log=CUINIT_NOISE),
        driver_reason="NVML: Driver Not Loaded",
        in_container=True,
        nvidia_pci_devices=1,
        env={"NVIDIA_VISIBLE_DEVICES": value},
    )
    r = check.build_report(facts)
    d = codes(r)["no_driver"]
    assert expect in d["summary"] and d["severity"] == "error" and r["exit_code"] == 0
    assert ("--gpus all" in d["fix"]) and r["verdict"]["status"] == "gpu_not_used"
    assert r["verdict"]["line"].endswith(d["fix"])


def test_no_driver_on_a_host_with_a_gpu_and_nvidia_smi_failing():
    r = check.build_report(on("no-driver", cuda_tf(), nvidia_pci_devices=1))
    d = codes(r)["no_driver"]
    assert "couldn't communicate" in d["summary"] and d["fix"].startswith("install the NVIDIA driver")


def test_driver_too_old_names_both_versions():
    r = check.build_report(on("470.223.02_v100", cuda_tf()))
    d = codes(r)["driver_too_old"]
    assert "470.223.02" in d["summary"] and "11.4" in d["summary"] and "CUDA 12.5.1" in d["summary"]
    assert "525.60.13" in d["fix"] and r["verdict"]["status"] == "gpu_not_used"
    assert (
        "gpu_not_visible_to_tf" in codes(r) and codes(r)["gpu_not_visible_to_tf"]["fix"] == "fix the problem(s) above"
    )


def test_oldest_driver_for_cuda_12_is_accepted():
    r = check.build_report(on("525.60.13_t4", cuda_tf(gpus=tf_gpus(cc=(7, 5), name="Tesla T4"))))
    assert "driver_too_old" not in codes(r) and r["verdict"]["status"] == "gpu"
    assert r["precision"]["auto"] == "mixed_float16"
    assert not r["precision"]["options"]["mixed_bfloat16"]["sensible"]


@pytest.mark.parametrize(
    "others,code", [([], "library_missing"), (["/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7"], "library_wrong_major")]
)
def test_cudnn_missing_or_wrong_major(others, code):
    libs = LIBS_OK[:2] + [LibFact("cudnn", "libcudnn.so.9", None, None, others)]
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(log=DLOPEN_ERRORS), libraries=libs))
    d = codes(r)[code]
    assert "libcudnn.so.9 not found" in d["summary"] and "expects libcudnn.so.9" in d["summary"]
    assert all(o in d["summary"] for o in others)
    assert d["fix"] == 'pip install "tensorflow[and-cuda]==2.21.0" (brings the CUDA and cuDNN wheels the build expects)'


def test_cudnn_older_minor_than_the_build():
    build = {**CUDA_BUILD, "cudnn_version": "9.3.0"}
    libs = LIBS_OK[:2] + [LibFact("cudnn", "libcudnn.so.9", "/usr/lib/libcudnn.so.9", "9.1.0")]
    r = check.build_report(on("535.129.03_2xa100", TfFacts(version="2.21.0", build=build), libraries=libs))
    assert "9.1.0" in codes(r)["library_wrong_version"]["summary"]


def test_cpu_only_build_on_a_gpu_machine():
    r = check.build_report(on("535.129.03_2xa100", cpu_tf()))
    d = codes(r)["cpu_only_build"]
    assert (
        d["severity"] == "error"
        and "tensorflow[and-cuda]==2.21.0" in d["fix"]
        and r["verdict"]["status"] == "gpu_not_used"
    )
    assert d["fix"].startswith("pip uninstall -y tensorflow-cpu && ")  # one tensorflow/ folder, never both wheels
    assert "gpu_not_visible_to_tf" not in codes(r)  # the build explains it


def test_gpu_visible_to_driver_not_to_tf_shows_the_logged_library_errors():
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(log=CUINIT_NOISE[2:] + DLOPEN_ERRORS)))
    d = codes(r)["gpu_not_visible_to_tf"]
    assert "the driver shows 2 GPU(s) but TensorFlow sees 0" in d["summary"]
    assert any(
        line.startswith("dso_loader.cc:64] Could not load dynamic library 'libcudnn.so.8'") for line in d["details"]
    )
    assert any("Cannot dlopen some GPU libraries" in line for line in d["details"])
    assert "oneDNN" not in " ".join(d["details"]) and "tensorflow[and-cuda]" in d["fix"]


def test_cuinit_lines_are_noise_without_a_driver_and_shown_with_one():
    shown, noise = tflog.classify_log(CUINIT_NOISE, driver_present=False)
    assert shown == [] and sum(noise.values()) == 3 and any(k.startswith("cuInit") for k in noise)
    shown, _ = tflog.classify_log(CUINIT_NOISE[:1], driver_present=True)
    assert shown and "cuInit" in shown[0]


def test_cuda_visible_devices_hiding_every_gpu():
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(), env={"CUDA_VISIBLE_DEVICES": "-1"}))
    assert codes(r)["gpu_hidden"]["fix"].startswith("unset CUDA_VISIBLE_DEVICES")


def test_memory_growth_set_too_late_names_the_call():
    call = "tf.config.experimental.set_memory_growth('/physical_device:GPU:0', True)"
    mg = {"in_effect": False, "error": "Physical devices cannot be modified after being initialized", "late_call": call}
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(gpus=tf_gpus(2, (8, 0)), memory_growth=mg)))
    d = codes(r)["memory_growth_too_late"]
    assert d["summary"].startswith(call + " came too late") and "before anything touches the GPU" in d["fix"]
    assert "NOT in effect" in check.format_report(r)


def test_memory_held_by_other_processes_is_listed():
    r = check.build_report(on("560.35.03_h100", cuda_tf(gpus=tf_gpus())), own_pids={51007})
    d = codes(r)["memory_held_by_others"]
    assert d["severity"] == "warning" and "60.0 of 79.6 GiB" in d["summary"]
    assert d["details"] == ["pid 48213 python3: 57.5 GiB"] and "kill 48213" in d["fix"]
    assert r["verdict"]["status"] == "gpu" and "1 warning(s)" in r["verdict"]["line"]


def test_memory_held_outside_this_container_via_nvml():
    p = gpuinfo.probe(nvml=FakeNVML([h100(procs=[])]))
    r = check.build_report(Facts(tf=cuda_tf(gpus=tf_gpus()), driver_present=True, gpus=p.gpus, libraries=LIBS_OK))
    assert "outside this container" in codes(r)["memory_held_by_others"]["details"][0]


PTX_ERROR = (
    "2024-07-02 10:11:12.000000: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed: "
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an unsupported toolchain."
)


@pytest.mark.parametrize(
    "cc, jit",
    [
        ((9, 0), True),
        ((10, 0), True),
        ((12, 0), True),
        ((8, 9), False),
        ((8, 6), False),
        ((8, 0), False),
        ((7, 5), False),
        ((6, 1), False),
        ((5, 2), False),
    ],
)
def test_which_gpus_run_tensorflow_21_only_through_ptx(cc, jit):
    # Machine code sm_XY runs on X.y for y >= Y; PTX compute_90 is compiled for 9.0 and newer.
    assert diagnose.needs_ptx(CUDA_BUILD, cc) is jit


def test_h100_on_a_driver_older_than_cuda_12_5_cannot_load_the_ptx():
    r = check.build_report(on("550.54.15_h100", cuda_tf(gpus=tf_gpus(), log=[PTX_ERROR])), require_gpu=True)
    d = codes(r)["driver_too_old_for_ptx"]
    assert d["summary"].startswith("driver too old for this GPU's PTX: NVIDIA H100 80GB HBM3 (compute capability 9.0)")
    assert "sm_60, sm_70, sm_80, sm_89" in d["summary"] and "CUDA 12.5.1" in d["summary"]
    assert "550.54.15 (CUDA up to 12.4)" in d["summary"]
    assert d["fix"].startswith("upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver)")
    assert any("UNSUPPORTED_PTX_VERSION" in line for line in d["details"])
    assert "driver_too_old" not in codes(r)  # 550 is new enough for CUDA 12.x machine code
    # TensorFlow lists the GPU, but no kernel runs on it: not usable, and --require-gpu fails.
    assert r["verdict"]["status"] == "gpu_not_used" and r["verdict"]["usable_gpus"] == 0 and r["exit_code"] == 1


def test_the_same_h100_on_a_cuda_12_6_driver_is_ready():
    r = check.build_report(on("560.35.03_h100", cuda_tf(gpus=tf_gpus())))
    assert "driver_too_old_for_ptx" not in codes(r) and r["verdict"]["status"] == "gpu"


def test_an_a100_on_an_older_driver_runs_the_machine_code():
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(gpus=tf_gpus(2, (8, 0), "NVIDIA A100-SXM4-40GB"))))
    assert "driver_too_old_for_ptx" not in codes(r) and r["verdict"]["status"] == "gpu"


def test_ptx_driver_floor_from_the_driver_version_when_the_cuda_version_is_unknown():
    # NVML without the CUDA version: the floor from train.gpucheck.stack decides.
    p = gpuinfo.probe(nvml=FakeNVML([h100()], driver="550.90.07", cuda=0))
    for g in p.gpus:
        g.cuda_driver_version = None
    r = check.build_report(Facts(tf=cuda_tf(gpus=tf_gpus()), driver_present=True, gpus=p.gpus, libraries=LIBS_OK))
    assert "555.42.06" in codes(r)["driver_too_old_for_ptx"]["fix"]
    p.gpus[0].driver_version = "555.42.06"
    r = check.build_report(Facts(tf=cuda_tf(gpus=tf_gpus()), driver_present=True, gpus=p.gpus, libraries=LIBS_OK))
    assert "driver_too_old_for_ptx" not in codes(r)


@pytest.mark.parametrize(
    "driver, cuda, too_old",
    [
        ("525.60.11", "12.0", True),  # the CUDA it reports is new enough; the driver version is not
        ("525.60.11", None, True),  # nvidia-smi gave no CUDA version: the driver version alone decides
        ("525.60.13", "12.0", False),  # exactly the minimum
        ("535.129.03", "11.8", True),  # a new enough driver that reports an older CUDA (a compat package)
    ],
)
def test_driver_too_old_from_the_driver_version_or_its_cuda(driver, cuda, too_old):
    gpu = gpuinfo.GpuInfo(0, "Tesla T4", "GPU-1", 15360.0, 0.0, driver, (7, 5), cuda)
    facts = Facts(
        tf=cuda_tf(gpus=tf_gpus(cc=(7, 5), name="Tesla T4")),
        driver_present=True,
        gpus=[gpu],
        libraries=LIBS_OK,
        nvidia_pci_devices=1,
    )
    found = codes(check.build_report(facts))
    assert ("driver_too_old" in found) == too_old
    if too_old:
        assert f"NVIDIA driver {driver} (supports CUDA up to {cuda or '?'})" in found["driver_too_old"]["summary"]


@pytest.mark.parametrize("cvd", ["garbage", "2", "-1,0", " -1", "GPU-nosuch"])
def test_cuda_visible_devices_that_names_no_gpu_first_hides_every_gpu(cvd):
    # CUDA reads CUDA_VISIBLE_DEVICES up to the first entry that is no GPU index or UUID: not a library problem.
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(), env={"CUDA_VISIBLE_DEVICES": cvd}))
    d = codes(r)["gpu_hidden"]
    assert "gpu_not_visible_to_tf" not in codes(r) and "0-1 here" in d["fix"] and "pip install" not in d["fix"]
    assert r["verdict"]["status"] == "gpu_not_used" and r["verdict"]["line"].endswith(d["fix"])


def test_cuda_visible_devices_by_index_or_uuid_prefix_counts_the_gpus_before_a_bad_entry():
    gpus = gpuinfo.probe(nvml=None, run=recorded_smi("535.129.03_2xa100")).gpus
    uuid = gpus[1].uuid[:12]
    assert [diagnose.cuda_visible(v, gpus) for v in ("0,1", f"{uuid}", "1,x,0", "", "MIG-1/0/0")] == [2, 1, 1, 0, None]


@pytest.mark.parametrize(
    "value, says", [("false", "overrides set_memory_growth"), ("maybe", "'maybe' is ignored"), ("True", "ignored")]
)
def test_tf_force_gpu_allow_growth_that_is_not_true_is_a_warning(value, says):
    mg = {"in_effect": True, "error": None, "late_call": None}
    facts = on("535.129.03_2xa100", cuda_tf(gpus=tf_gpus(2, (8, 0)), memory_growth=mg))
    facts.env = {"TF_FORCE_GPU_ALLOW_GROWTH": value}
    r = check.build_report(facts)
    d = codes(r)["allow_growth_env"]
    assert d["severity"] == "warning" and says in d["summary"] and r["verdict"]["status"] == "gpu"
    assert r["memory_growth"]["in_effect"] is (value != "false")
    assert ("Memory growth  NOT in effect\n" in check.format_report(r)) is (value == "false")
    facts.env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert "allow_growth_env" not in codes(check.build_report(facts))


NO_LIBCUDA = LibFact("cuda", "libcuda.so.1")  # not on disk, not in the loader's cache
CUINIT_WITH_DRIVER = [
    "E0000 00:00:1733400000.118211 2450 cuda_executor.cc:1228] INTERNAL: CUDA error: Failed call to cuInit: "
    "UNKNOWN ERROR (303)",
    "I0000 00:00:1733400000.118300 2450 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
]


@pytest.mark.parametrize("caps", [None, "utility", ""])
def test_a_container_with_the_driver_but_not_its_compute_capability_is_told_to_ask_for_compute(caps):
    """nvidia-smi answers (the `utility` capability) but libcuda.so.1 is not mounted: no pip install brings it."""
    env = {} if caps is None else {"NVIDIA_DRIVER_CAPABILITIES": caps}
    facts = on("535.129.03_2xa100", cuda_tf(log=CUINIT_WITH_DRIVER), libraries=[NO_LIBCUDA, *LIBS_OK])
    facts.in_container, facts.env = True, {"NVIDIA_VISIBLE_DEVICES": "all", **env}
    r = check.build_report(facts)
    d = codes(r)["libcuda_missing"]
    given = "NVIDIA_DRIVER_CAPABILITIES unset" if caps is None else f"NVIDIA_DRIVER_CAPABILITIES={caps!r}"
    assert d["summary"].startswith("the NVIDIA driver answers (2 GPU(s) listed) but its CUDA library libcuda.so.1")
    assert given in d["summary"] and d["fix"].startswith("start the container with NVIDIA_DRIVER_CAPABILITIES=compute")
    assert codes(r)["gpu_not_visible_to_tf"]["fix"] == "fix the problem(s) above"  # not a pip install
    assert "pip install" not in r["verdict"]["line"] and r["verdict"]["line"].endswith(d["fix"])
    # With a driver, "Could not find cuda drivers" is shown, not counted as start-up noise.
    assert any(line.startswith("cudart_stub.cc:31] Could not find cuda drivers") for line in r["tf_log"]["shown"])
    assert "libcuda.so.1 (the driver's): NOT FOUND" in check.format_report(r)


def test_a_host_whose_driver_lacks_libcuda_is_told_it_comes_with_the_driver():
    facts = on("535.129.03_2xa100", cuda_tf(log=CUINIT_WITH_DRIVER), libraries=[NO_LIBCUDA, *LIBS_OK])
    d = codes(check.build_report(facts))["libcuda_missing"]
    assert "NVIDIA_DRIVER_CAPABILITIES" not in d["summary"]
    assert d["fix"].startswith("libcuda.so.1 comes with the NVIDIA driver, not from pip") and "ldconfig" in d["fix"]


def test_without_a_driver_a_missing_libcuda_is_no_diagnosis_and_its_log_line_is_noise():
    facts = Facts(tf=cuda_tf(log=CUINIT_WITH_DRIVER), driver_reason="NVML: Driver Not Loaded", libraries=[NO_LIBCUDA])
    r = check.build_report(facts)
    assert "libcuda_missing" not in codes(r) and r["tf_log"]["shown"] == []


@pytest.mark.parametrize("pci,severity", [(1, "error"), (0, "info")])
def test_nvidia_visible_devices_none_mounts_the_driver_with_no_gpu_and_says_so(pci, severity):
    facts = Facts(
        tf=cuda_tf(),
        driver_present=True,
        driver_reason="nvidia-smi",
        libraries=LIBS_OK,
        in_container=True,
        nvidia_pci_devices=pci,
        env={"NVIDIA_VISIBLE_DEVICES": "none"},
    )
    r = check.build_report(facts)
    d = codes(r)["no_driver"]
    assert d["summary"].startswith("no GPU in this container: NVIDIA_VISIBLE_DEVICES='none'")
    assert d["severity"] == severity and d["fix"].endswith("or start with `docker run --gpus all`")
    assert r["verdict"]["status"] == ("gpu_not_used" if pci else "cpu")


@pytest.mark.parametrize("cvd, warned", [("0,garbage,1", "'garbage'"), ("1,5", "'5'"), ("0,1", None), ("1", None)])
def test_cuda_visible_devices_cut_short_by_a_bad_entry_is_a_warning_naming_it(cvd, warned):
    """GPU 0 in use and GPU 1 dropped silently by CUDA: said, while a deliberate subset says nothing."""
    seen = tf_gpus(len(cvd.split(",")) if warned is None else 1, (8, 0))
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(gpus=seen), env={"CUDA_VISIBLE_DEVICES": cvd}))
    d = codes(r).get("gpu_hidden")
    if warned is None:
        assert d is None
    else:
        assert d["severity"] == "warning" and warned in d["summary"] and "uses the first 1 only" in d["summary"]
        assert r["verdict"]["status"] == "gpu" and "1 warning(s) below" in r["verdict"]["line"]


def test_a_cuda_build_on_a_machine_without_a_driver_reports_no_libcuda_calmly():
    """The GPU image on a CPU machine: no driver, so no libcuda.so.1, and nothing is wrong."""
    facts = Facts(tf=cuda_tf(log=CUINIT_WITH_DRIVER), driver_reason="nvidia-smi not found", libraries=[NO_LIBCUDA])
    text = check.format_report(check.build_report(facts))
    assert "libcuda.so.1 (the driver's): none (it comes with the driver, and there is none here)" in text
    assert "NOT FOUND" not in text
