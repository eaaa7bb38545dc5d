"""train.gpucheck.diagnose: every diagnosis from faked facts (recorded nvidia-smi, NVML stand-in, injected
build info, device lists, TensorFlow log lines and environment variables), read through the
report. No GPU, no TensorFlow import."""

from __future__ import annotations

import pytest
from check_fakes import CUDA_BUILD, CUINIT_NOISE, DLOPEN_ERRORS, LIBS_OK, codes, cpu_tf, cuda_tf, on, tf_gpus
from test_gpuinfo import FakeNVML, h100, recorded_smi

from train.gpucheck import check, diagnose, gpuinfo, tflog
from train.gpucheck.facts import Facts, LibFact, TfFacts
from train.gpucheck.gpuinfo import GpuInfo, GpuProcess


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


@pytest.mark.parametrize("cvd", ["garbage", "2", "-1,0", " -1", "GPU-nosuch", "\u00b2"])  # ² is a digit to str.isdigit
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


# -- every diagnosis whole: code, severity, summary, fix and details, as `check` shows them -------------------
IGNORED_CC = (
    "2024-03-12 09:41:31.000000: I tensorflow/core/common_runtime/gpu/gpu_device.cc:2153] Ignoring visible gpu "
    "device (device: 0, name: Tesla K80, compute capability: 3.7) with Cuda compute capability 3.7. The minimum "
    "required Cuda capability is 6.0."
)


def _gpu(index=0, name="Tesla T4", driver="535.129.03", cc=(7, 5), cuda="12.2", used=0.0, total=15360.0, procs=()):
    gpu = GpuInfo(index, name, f"GPU-{index}abc", total, used, driver, cc, cuda)
    gpu.processes = [GpuProcess(pid, pname, mb) for pid, pname, mb in procs]
    return gpu


def _facts(tf=None, gpus=(), **kw):
    kw.setdefault("driver_present", bool(gpus))
    kw.setdefault("nvidia_pci_devices", len(gpus))
    kw.setdefault("libraries", list(LIBS_OK))
    return Facts(tf=tf or cuda_tf(gpus=tf_gpus(len(gpus), (7, 5), "Tesla T4")), gpus=list(gpus), **kw)


SCENARIOS = {
    "container-unset-gpu-on-bus": lambda: _facts(
        cuda_tf(), driver_present=False, in_container=True, nvidia_pci_devices=1
    ),
    "container-unset-cpu-host": lambda: _facts(cuda_tf(), driver_present=False, in_container=True),
    "container-void": lambda: _facts(
        cuda_tf(),
        driver_present=False,
        in_container=True,
        nvidia_pci_devices=1,
        env={"NVIDIA_VISIBLE_DEVICES": " Void "},
    ),
    "container-all-cpu-host": lambda: _facts(
        cuda_tf(), driver_present=False, in_container=True, env={"NVIDIA_VISIBLE_DEVICES": "all"}
    ),
    "host-gpu-no-driver": lambda: _facts(
        cuda_tf(), driver_present=False, nvidia_pci_devices=1, driver_reason="NVML: Driver Not Loaded"
    ),
    "host-cpu": lambda: _facts(cpu_tf(), driver_present=False, libraries=[]),
    "none-given-gpu-on-bus": lambda: _facts(
        cuda_tf(), driver_present=True, in_container=True, nvidia_pci_devices=1, env={"NVIDIA_VISIBLE_DEVICES": "NONE"}
    ),
    "none-given-cpu-host": lambda: _facts(
        cuda_tf(), driver_present=True, in_container=True, env={"NVIDIA_VISIBLE_DEVICES": ""}
    ),
    "cpu-build-gpu-host": lambda: _facts(cpu_tf(), [_gpu()], libraries=[]),
    "driver-too-old": lambda: _facts(gpus=[_gpu(driver="470.223.02", cuda="11.4")]),
    "driver-cuda-older": lambda: _facts(gpus=[_gpu(driver="535.129.03", cuda="11.8")]),
    "ptx-h100": lambda: _facts(
        cuda_tf(gpus=tf_gpus(), log=[PTX_ERROR]),
        [
            _gpu(0, "NVIDIA H100 80GB HBM3", "550.54.15", (9, 0), "12.4"),
            _gpu(1, "NVIDIA H100 80GB HBM3", "550.54.15", None, "12.4"),
        ],
    ),
    "ptx-no-cuda-version": lambda: _facts(
        cuda_tf(gpus=tf_gpus()), [_gpu(0, "NVIDIA H100 80GB HBM3", "550.90.07", (9, 0), None)]
    ),
    "ptx-unknown-tf": lambda: _facts(
        TfFacts(version="9.9.0", build=dict(CUDA_BUILD), gpus=tf_gpus()),
        [_gpu(0, "NVIDIA H100 80GB HBM3", "550.54.15", None, "12.4")],
    ),
    "ptx-evidence-only": lambda: _facts(
        cuda_tf(gpus=tf_gpus(1, (8, 0)), matmul=[{"device": "GPU:0", "error": "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}]),
        [_gpu(0, "NVIDIA A100", "560.35.03", (8, 0), "12.6")],
    ),
    "ptx-second-gpu": lambda: _facts(
        cuda_tf(gpus=tf_gpus(2, (8, 0))),
        [
            _gpu(0, "NVIDIA A100", "550.54.15", (8, 0), "12.4"),
            _gpu(1, "NVIDIA H100 80GB HBM3", "550.54.15", (9, 0), "12.4"),
        ],
    ),
    "ptx-driver-of-the-same-cuda-minor": lambda: _facts(
        cuda_tf(gpus=tf_gpus()), [_gpu(0, "NVIDIA H100 80GB HBM3", "555.42.06", (9, 0), "12.5")]
    ),
    "ptx-evidence-cc-unknown": lambda: _facts(
        cuda_tf(log=[PTX_ERROR]), [_gpu(0, "NVIDIA A100", "560.35.03", None, "12.6")], nvidia_pci_devices=0
    ),
    "ptx-evidence-cc-from-tensorflow": lambda: _facts(
        cuda_tf(gpus=[*tf_gpus(1, (8, 0)), *tf_gpus(1, (8, 6))], log=[PTX_ERROR]),
        [_gpu(0, "NVIDIA A100", "560.35.03", None, "12.6"), _gpu(1, "NVIDIA A10", "560.35.03", None, "12.6")],
    ),
    "driver-cuda-not-a-number": lambda: _facts(gpus=[_gpu(cuda="N/A")]),
    "driver-without-gpus": lambda: _facts(cuda_tf(), driver_present=True, env={"NVIDIA_VISIBLE_DEVICES": "all"}),
    "driver-without-gpus-unset": lambda: _facts(cuda_tf(), driver_present=True),
    "gpus-given-with-none": lambda: _facts(gpus=[_gpu()], env={"NVIDIA_VISIBLE_DEVICES": "none"}),
    "cudnn-version-unknown": lambda: _facts(
        TfFacts(version="2.21.0", build={**CUDA_BUILD, "cudnn_version": "9.3.0"}, gpus=tf_gpus(1, (7, 5))),
        [_gpu()],
        libraries=[LibFact("cudnn", "libcudnn.so.9", "/usr/lib/libcudnn.so.9", None)],
    ),
    "cudnn-built-major-minor": lambda: _facts(
        TfFacts(version="2.21.0", build={**CUDA_BUILD, "cudnn_version": "9.3"}, gpus=tf_gpus(1, (7, 5))),
        [_gpu()],
        libraries=[LibFact("cudnn", "libcudnn.so.9", "/usr/lib/libcudnn.so.9", "9.1.0")],
    ),
    "hidden-empty": lambda: _facts(cuda_tf(), [_gpu(), _gpu(1)], env={"CUDA_VISIBLE_DEVICES": ""}),
    "visible-but-not-seen": lambda: _facts(cuda_tf(), [_gpu(), _gpu(1)], env={"CUDA_VISIBLE_DEVICES": "0"}),
    "not-visible-cuinit-with-driver": lambda: _facts(cuda_tf(log=CUINIT_WITH_DRIVER), [_gpu()]),
    "tensorflow-unavailable-with-driver": lambda: Facts(
        tf=TfFacts(error="ImportError: libcudart.so.12", log=["a", "b", "c", "d", "e", CUINIT_WITH_DRIVER[1]]),
        driver_present=True,
    ),
    "libraries": lambda: _facts(
        TfFacts(version="2.21.0", build={**CUDA_BUILD, "cudnn_version": "9.3.0"}, gpus=tf_gpus(1, (7, 5))),
        [_gpu()],
        libraries=[
            LibFact("cudart", "libcudart.so.12", None, None, [], "libcudart.so.12: cannot open shared object file"),
            LibFact("cublas", "libcublas.so.12", None, None, ["/usr/lib/libcublas.so.11", "/usr/lib/libcublas.so.13"]),
            LibFact("cudnn", "libcudnn.so.9", "/usr/lib/libcudnn.so.9", "9.1.0"),
        ],
    ),
    "cudnn-new-enough": lambda: _facts(
        TfFacts(version="2.21.0", build={**CUDA_BUILD, "cudnn_version": "9.3.0"}, gpus=tf_gpus(1, (7, 5))),
        [_gpu()],
        libraries=[LibFact("cudnn", "libcudnn.so.9", "/usr/lib/libcudnn.so.9", "9.3.0")],
    ),
    "libcuda-container": lambda: _facts(
        gpus=[_gpu(), _gpu(1)],
        libraries=[NO_LIBCUDA, *LIBS_OK],
        in_container=True,
        env={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
    ),
    "libcuda-container-unset": lambda: _facts(
        cuda_tf(gpus=tf_gpus(1, (7, 5))), [_gpu()], libraries=[NO_LIBCUDA], in_container=True
    ),
    "libcuda-host": lambda: _facts(cuda_tf(gpus=tf_gpus(1, (7, 5))), [_gpu()], libraries=[NO_LIBCUDA]),
    "hidden-minus-one": lambda: _facts(cuda_tf(), [_gpu(), _gpu(1)], env={"CUDA_VISIBLE_DEVICES": "-1"}),
    "hidden-garbage": lambda: _facts(cuda_tf(), [_gpu(), _gpu(1)], env={"CUDA_VISIBLE_DEVICES": "garbage"}),
    "cut-short": lambda: _facts(
        cuda_tf(gpus=tf_gpus(1, (7, 5))), [_gpu(), _gpu(1)], env={"CUDA_VISIBLE_DEVICES": "0,GPU-9,1"}
    ),
    "not-visible-logged": lambda: _facts(cuda_tf(log=DLOPEN_ERRORS), [_gpu()]),
    "not-visible-silent": lambda: _facts(cuda_tf(gpus=tf_gpus(1, (7, 5))), [_gpu(), _gpu(1)]),
    "not-visible-ignored-cc": lambda: _facts(cuda_tf(log=[IGNORED_CC]), [_gpu()]),
    "memory-growth-late": lambda: _facts(
        cuda_tf(
            gpus=tf_gpus(1, (7, 5)),
            memory_growth={"error": "Physical devices cannot be modified after being initialized"},
        ),
        [_gpu()],
    ),
    "allow-growth-false": lambda: _facts(gpus=[_gpu()], env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"}),
    "allow-growth-True": lambda: _facts(gpus=[_gpu()], env={"TF_FORCE_GPU_ALLOW_GROWTH": "True"}),
    "memory-held": lambda: _facts(
        cuda_tf(gpus=tf_gpus(6, (7, 5))),
        [
            _gpu(0, used=6144.0, procs=[(7, "python3", 2048.0), (8, "java", None), (99, "mine", 1024.0)]),
            _gpu(1, used=2048.0, total=81920.0),  # under 5% of the memory, nobody listed: nothing to say
            _gpu(2, used=4095.0, total=81920.0),
            _gpu(3, used=1024.0),  # 1 GiB unlisted on a small GPU: said
            _gpu(4, used=1023.0),
            _gpu(5, used=4096.0, total=81920.0),  # 5% of a large GPU: said
        ],
    ),
    "tensorflow-unavailable": lambda: Facts(
        tf=TfFacts(error="ImportError: libcudart.so.12", log=["a", "b", "c", "d", "e", "f", "g"])
    ),
}

EXPECTED = {
    "container-unset-gpu-on-bus": [
        (
            "no_driver",
            "error",
            "no NVIDIA driver visible: this container was started without GPUs "
            "(NVIDIA_VISIBLE_DEVICES is not set, so the NVIDIA runtime added none)",
            "start the container with `docker run --gpus all` (compose: a "
            "`deploy.resources.reservations.devices` entry with `capabilities: [gpu]`), the "
            "NVIDIA Container Toolkit installed on the host",
            [],
        )
    ],
    "container-unset-cpu-host": [
        (
            "no_driver",
            "info",
            "no NVIDIA driver visible: this container was started without GPUs "
            "(NVIDIA_VISIBLE_DEVICES is not set, so the NVIDIA runtime added none); no NVIDIA GPU "
            "is on the PCI bus either",
            "none needed to train on the CPU; if the host has a GPU, start the container with "
            "`docker run --gpus all` (compose: a `deploy.resources.reservations.devices` entry "
            "with `capabilities: [gpu]`), the NVIDIA Container Toolkit installed on the host",
            [],
        )
    ],
    "container-void": [
        (
            "no_driver",
            "error",
            "no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES=' Void ' tells the NVIDIA runtime to give "
            "this container no GPU",
            "set NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), or start with `docker run --gpus all`",
            [],
        )
    ],
    "container-all-cpu-host": [
        (
            "no_driver",
            "info",
            "no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES='all' asks for GPUs, but the "
            "container was not started with the NVIDIA runtime",
            "none needed to train on the CPU; if the host has a GPU, start the container with "
            "`docker run --gpus all` (compose: a `deploy.resources.reservations.devices` entry with "
            "`capabilities: [gpu]`), the NVIDIA Container Toolkit installed on the host",
            [],
        )
    ],
    "host-gpu-no-driver": [
        (
            "no_driver",
            "error",
            "an NVIDIA GPU is on the PCI bus but no driver is loaded (NVML: Driver Not Loaded)",
            "install the NVIDIA driver (then `nvidia-smi` must list the GPU)",
            [],
        )
    ],
    "host-cpu": [
        (
            "no_driver",
            "info",
            "no NVIDIA GPU or driver on this machine: TensorFlow runs on the CPU",
            "none needed to train on the CPU; for a GPU, run on a machine (or cloud instance) that has one",
            [],
        ),
        (
            "cpu_only_build",
            "info",
            "TensorFlow 2.21.0 is a CPU-only build (right for this machine)",
            "none needed on a CPU machine",
            [],
        ),
    ],
    "none-given-gpu-on-bus": [
        (
            "no_driver",
            "error",
            "no GPU in this container: NVIDIA_VISIBLE_DEVICES='NONE' tells the NVIDIA runtime to "
            "mount the driver but give it no GPU",
            "set NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), or start with `docker run --gpus all`",
            [],
        )
    ],
    "none-given-cpu-host": [
        (
            "no_driver",
            "info",
            "no GPU in this container: NVIDIA_VISIBLE_DEVICES='' tells the NVIDIA runtime to mount the "
            "driver but give it no GPU",
            "none needed to train on the CPU; set NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), "
            "or start with `docker run --gpus all`",
            [],
        )
    ],
    "cpu-build-gpu-host": [
        (
            "cpu_only_build",
            "error",
            "TensorFlow 2.21.0 is a CPU-only build but this machine has a GPU",
            'pip uninstall -y tensorflow-cpu && pip install "tensorflow[and-cuda]==2.21.0" (in this '
            "template: requirements/gpu.lock, which the GPU image installs)",
            [],
        )
    ],
    "driver-too-old": [
        (
            "driver_too_old",
            "error",
            "NVIDIA driver 470.223.02 (supports CUDA up to 11.4) is too old for this TensorFlow build, "
            "which needs CUDA 12.5.1: CUDA 12.x needs driver >= 525.60.13",
            "upgrade the host's NVIDIA driver to 525.60.13 or newer (a container uses the host's driver)",
            [],
        )
    ],
    "driver-cuda-older": [
        (
            "driver_too_old",
            "error",
            "NVIDIA driver 535.129.03 (supports CUDA up to 11.8) is too old for this TensorFlow build, "
            "which needs CUDA 12.5.1: CUDA 12.x needs driver >= 525.60.13",
            "upgrade the host's NVIDIA driver to 525.60.13 or newer (a container uses the host's driver)",
            [],
        )
    ],
    "ptx-h100": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA H100 80GB HBM3 (compute capability 9.0) has no machine "
            "code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must compile its kernels "
            "from PTX made by CUDA 12.5.1, which NVIDIA driver 550.54.15 (CUDA up to 12.4) cannot load "
            "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); a container uses the "
            "host's driver",
            [
                "GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0",
                "2024-07-02 10:11:12.000000: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed: "
                "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an unsupported toolchain.",
            ],
        ),
        (
            "gpu_not_visible_to_tf",
            "warning",
            "the driver shows 2 GPU(s) but TensorFlow sees 1",
            "fix the problem(s) above",
            [
                "op_kernel.cc:1840] OP_REQUIRES failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was "
                "compiled with an unsupported toolchain."
            ],
        ),
    ],
    "ptx-no-cuda-version": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA H100 80GB HBM3 (compute capability 9.0) has no "
            "machine code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must "
            "compile its kernels from PTX made by CUDA 12.5.1, which NVIDIA driver 550.90.07 (CUDA up "
            "to ?) cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); a container "
            "uses the host's driver",
            ["GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0"],
        )
    ],
    "ptx-unknown-tf": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA H100 80GB HBM3 (compute capability 9.0) has no "
            "machine code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must compile "
            "its kernels from PTX made by CUDA 12.5.1, which NVIDIA driver 550.54.15 (CUDA up to 12.4) "
            "cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to one that supports CUDA 12.5.1; a container uses the host's driver",
            ["GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0"],
        )
    ],
    "ptx-evidence-only": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA A100 (compute capability 8.0) has no machine code "
            "in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must compile its "
            "kernels from PTX made by CUDA 12.5.1, which NVIDIA driver 560.35.03 (CUDA up to 12.6) "
            "cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); a container "
            "uses the host's driver",
            ["CUDA_ERROR_UNSUPPORTED_PTX_VERSION"],
        )
    ],
    "ptx-second-gpu": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA H100 80GB HBM3 (compute capability 9.0) has no "
            "machine code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must compile "
            "its kernels from PTX made by CUDA 12.5.1, which NVIDIA driver 550.54.15 (CUDA up to 12.4) "
            "cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); a container uses "
            "the host's driver",
            ["GPU 1: NVIDIA H100 80GB HBM3, compute capability 9.0"],
        )
    ],
    "ptx-driver-of-the-same-cuda-minor": [],
    "ptx-evidence-cc-unknown": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA A100 (compute capability ?) has no machine "
            "code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the driver must "
            "compile its kernels from PTX made by CUDA 12.5.1, which NVIDIA driver 560.35.03 (CUDA "
            "up to 12.6) cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); a "
            "container uses the host's driver",
            [
                "2024-07-02 10:11:12.000000: W tensorflow/core/framework/op_kernel.cc:1840] "
                "OP_REQUIRES failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was "
                "compiled with an unsupported toolchain."
            ],
        ),
        (
            "gpu_not_visible_to_tf",
            "error",
            "the driver shows 1 GPU(s) but TensorFlow sees 0",
            "fix the problem(s) above",
            [
                "op_kernel.cc:1840] OP_REQUIRES failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the "
                "provided PTX was compiled with an unsupported toolchain."
            ],
        ),
    ],
    "ptx-evidence-cc-from-tensorflow": [
        (
            "driver_too_old_for_ptx",
            "error",
            "driver too old for this GPU's PTX: NVIDIA A100 (compute capability 8.0) has "
            "no machine code in this TensorFlow build (sm_60, sm_70, sm_80, sm_89), so the "
            "driver must compile its kernels from PTX made by CUDA 12.5.1, which NVIDIA "
            "driver 560.35.03 (CUDA up to 12.6) cannot load "
            "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
            "upgrade the host's NVIDIA driver to 555.42.06 or newer (CUDA 12.5's driver); "
            "a container uses the host's driver",
            [
                "2024-07-02 10:11:12.000000: W tensorflow/core/framework/op_kernel.cc:1840] "
                "OP_REQUIRES failed: CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was "
                "compiled with an unsupported toolchain."
            ],
        )
    ],
    "driver-cuda-not-a-number": [],
    "driver-without-gpus": [],
    "driver-without-gpus-unset": [],
    "gpus-given-with-none": [],
    "cudnn-version-unknown": [],
    "cudnn-built-major-minor": [
        (
            "library_wrong_version",
            "error",
            "cudnn: /usr/lib/libcudnn.so.9 is version 9.1.0; this build was compiled with cuDNN "
            "9.3 and needs that minor or newer",
            'pip install "tensorflow[and-cuda]==2.21.0" (brings the CUDA and cuDNN wheels the build expects)',
            [],
        )
    ],
    "hidden-empty": [
        (
            "gpu_hidden",
            "error",
            "CUDA_VISIBLE_DEVICES='' hides every GPU from TensorFlow",
            "unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices to use, 0-1 here, or their UUIDs from "
            "`nvidia-smi -L`)",
            [],
        )
    ],
    "visible-but-not-seen": [
        (
            "gpu_not_visible_to_tf",
            "error",
            "the driver shows 2 GPU(s) but TensorFlow sees 0",
            'pip install "tensorflow[and-cuda]==2.21.0" and check the library errors listed',
            ["TensorFlow logged no library-loading error"],
        )
    ],
    "not-visible-cuinit-with-driver": [
        (
            "gpu_not_visible_to_tf",
            "error",
            "the driver shows 1 GPU(s) but TensorFlow sees 0",
            'pip install "tensorflow[and-cuda]==2.21.0" and check the library errors listed',
            [
                "cuda_executor.cc:1228] INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
                "cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
            ],
        )
    ],
    "tensorflow-unavailable-with-driver": [
        (
            "tensorflow_unavailable",
            "error",
            "TensorFlow could not be started: ImportError: libcudart.so.12",
            "install the locked requirements (`pip install -r requirements/cpu.lock`) and rerun",
            ["cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used."],
        )
    ],
    "libraries": [
        (
            "library_missing",
            "error",
            "cudart: libcudart.so.12 not found (found: nothing); this TensorFlow build expects libcudart.so.12",
            'pip install "tensorflow[and-cuda]==2.21.0" (brings the CUDA and cuDNN wheels the build expects)',
            ["libcudart.so.12: cannot open shared object file"],
        ),
        (
            "library_wrong_major",
            "error",
            "cublas: libcublas.so.12 not found (found: /usr/lib/libcublas.so.11, /usr/lib/libcublas.so.13); this "
            "TensorFlow build expects libcublas.so.12",
            'pip install "tensorflow[and-cuda]==2.21.0" (brings the CUDA and cuDNN wheels the build expects)',
            [],
        ),
        (
            "library_wrong_version",
            "error",
            "cudnn: /usr/lib/libcudnn.so.9 is version 9.1.0; this build was compiled with cuDNN 9.3.0 and needs "
            "that minor or newer",
            'pip install "tensorflow[and-cuda]==2.21.0" (brings the CUDA and cuDNN wheels the build expects)',
            [],
        ),
    ],
    "cudnn-new-enough": [],
    "libcuda-container": [
        (
            "libcuda_missing",
            "error",
            "the NVIDIA driver answers (2 GPU(s) listed) but its CUDA library libcuda.so.1 cannot be "
            "loaded (NVIDIA_DRIVER_CAPABILITIES='utility': the NVIDIA runtime mounts libcuda only with "
            "the `compute` capability): TensorFlow uses no GPU without it",
            "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility (or all) in its "
            "environment (this template's image sets it; an image or compose file that sets `utility` "
            "alone keeps libcuda out)",
            [],
        )
    ],
    "libcuda-container-unset": [
        (
            "libcuda_missing",
            "error",
            "the NVIDIA driver answers (1 GPU(s) listed) but its CUDA library libcuda.so.1 cannot "
            "be loaded (NVIDIA_DRIVER_CAPABILITIES unset: the NVIDIA runtime mounts libcuda only "
            "with the `compute` capability): TensorFlow uses no GPU without it",
            "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility (or all) in its "
            "environment (this template's image sets it; an image or compose file that sets "
            "`utility` alone keeps libcuda out)",
            [],
        )
    ],
    "libcuda-host": [
        (
            "libcuda_missing",
            "error",
            "the NVIDIA driver answers (1 GPU(s) listed) but its CUDA library libcuda.so.1 cannot be loaded: "
            "TensorFlow uses no GPU without it",
            "libcuda.so.1 comes with the NVIDIA driver, not from pip: reinstall the driver's user-space "
            "libraries (its .run installer, or the distribution's libcuda1 / libnvidia-compute package), then "
            "`ldconfig`; under WSL add /usr/lib/wsl/lib to LD_LIBRARY_PATH",
            [],
        )
    ],
    "hidden-minus-one": [
        (
            "gpu_hidden",
            "error",
            "CUDA_VISIBLE_DEVICES='-1' hides every GPU from TensorFlow",
            "unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices to use, 0-1 here, or their UUIDs "
            "from `nvidia-smi -L`)",
            [],
        )
    ],
    "hidden-garbage": [
        (
            "gpu_hidden",
            "error",
            "CUDA_VISIBLE_DEVICES='garbage' hides every GPU from TensorFlow: CUDA stops at the first entry "
            "that is no GPU index or UUID",
            "unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices to use, 0-1 here, or their UUIDs from "
            "`nvidia-smi -L`)",
            [],
        )
    ],
    "cut-short": [
        (
            "gpu_hidden",
            "warning",
            "CUDA_VISIBLE_DEVICES='0,GPU-9,1': 'GPU-9' names no GPU, so CUDA ignores it and every entry after "
            "it; TensorFlow uses the first 1 only",
            "list only GPU indices (0-1 here) or UUIDs from `nvidia-smi -L`",
            [],
        )
    ],
    "not-visible-logged": [
        (
            "gpu_not_visible_to_tf",
            "error",
            "the driver shows 1 GPU(s) but TensorFlow sees 0",
            'pip install "tensorflow[and-cuda]==2.21.0" and check the library errors listed',
            [
                "dso_loader.cc:64] Could not load dynamic library 'libcudnn.so.8'; dlerror: libcudnn.so.8: "
                "cannot open shared object file: No such file or directory",
                "gpu_device.cc:1960] Cannot dlopen some GPU libraries. Please make sure the missing "
                "libraries mentioned above are installed properly if you would like to use GPU. Follow the "
                "guide at https://www.tensorflow.org/install/gpu for how to download and setup the "
                "required libraries for your platform.",
            ],
        )
    ],
    "not-visible-silent": [
        (
            "gpu_not_visible_to_tf",
            "warning",
            "the driver shows 2 GPU(s) but TensorFlow sees 1",
            'pip install "tensorflow[and-cuda]==2.21.0" and check the library errors listed',
            ["TensorFlow logged no library-loading error"],
        )
    ],
    "not-visible-ignored-cc": [
        (
            "gpu_not_visible_to_tf",
            "error",
            "the driver shows 1 GPU(s) but TensorFlow sees 0",
            "use a GPU with the compute capability the build supports (see the line above), or a "
            "build that supports it",
            [
                "gpu_device.cc:2153] Ignoring visible gpu device (device: 0, name: Tesla K80, compute "
                "capability: 3.7) with Cuda compute capability 3.7. The minimum required Cuda "
                "capability is 6.0."
            ],
        )
    ],
    "memory-growth-late": [
        (
            "memory_growth_too_late",
            "error",
            'set_memory_growth came too late: the GPU had already been initialised ("Physical devices '
            'cannot be modified after being initialized")',
            "call tf.config.experimental.set_memory_growth before anything touches the GPU (the first "
            "tensor, model or tf.config.list_logical_devices()); here train.setup.devices does it "
            "before building the model",
            [],
        )
    ],
    "allow-growth-false": [
        (
            "allow_growth_env",
            "warning",
            "TF_FORCE_GPU_ALLOW_GROWTH=false overrides set_memory_growth: TensorFlow takes nearly all "
            "of each GPU's memory at start",
            "unset TF_FORCE_GPU_ALLOW_GROWTH (training sets memory growth itself, MEMORY_GROWTH) or set it to true",
            [],
        )
    ],
    "allow-growth-True": [
        (
            "allow_growth_env",
            "warning",
            "TF_FORCE_GPU_ALLOW_GROWTH='True' is ignored by TensorFlow (it reads only 'true' or 'false', "
            "lower case, and logs an error for anything else)",
            "unset TF_FORCE_GPU_ALLOW_GROWTH (training sets memory growth itself, MEMORY_GROWTH) or set it to true",
            [],
        )
    ],
    "memory-held": [
        (
            "memory_held_by_others",
            "warning",
            "GPU 0 (Tesla T4): 6.0 of 15.0 GiB already held by other processes",
            "stop them (kill 7 8) or pick a free GPU with CUDA_VISIBLE_DEVICES=<index>",
            ["pid 7 python3: 2.0 GiB", "pid 8 java: amount not reported"],
        ),
        (
            "memory_held_by_others",
            "warning",
            "GPU 3 (Tesla T4): 1.0 of 15.0 GiB already held by other processes",
            "free it on the host or pick a free GPU with CUDA_VISIBLE_DEVICES=<index>",
            ["no process listed: held by processes outside this container or PID namespace"],
        ),
        (
            "memory_held_by_others",
            "warning",
            "GPU 5 (Tesla T4): 4.0 of 80.0 GiB already held by other processes",
            "free it on the host or pick a free GPU with CUDA_VISIBLE_DEVICES=<index>",
            ["no process listed: held by processes outside this container or PID namespace"],
        ),
    ],
    "tensorflow-unavailable": [
        (
            "tensorflow_unavailable",
            "error",
            "TensorFlow could not be started: ImportError: libcudart.so.12",
            "install the locked requirements (`pip install -r requirements/cpu.lock`) and rerun",
            ["c", "d", "e", "f", "g"],
        )
    ],
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_diagnosis_whole(scenario):
    """Each branch's summary, fix and details compared whole (a word dropped from a fix is a fix that misleads)."""
    found = diagnose.diagnose(SCENARIOS[scenario](), own_pids={99})
    assert [(d.code, d.severity, d.summary, d.fix, d.details) for d in found] == EXPECTED[scenario]


@pytest.mark.parametrize("sass", ["sm_90", "sm_90a"])
def test_machine_code_for_the_gpus_own_capability_needs_no_ptx(sass):
    # sm_90a is sm_90's arch-specific machine code: it runs on 9.0 as well.
    assert not diagnose.needs_ptx({"cuda_compute_capabilities": ["sm_80", sass, "compute_90"]}, (9, 0))
