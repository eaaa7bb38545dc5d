"""train.check: every diagnosis from faked facts (recorded nvidia-smi, NVML stand-in, injected build
info, device lists, TensorFlow log lines and environment variables). No GPU, no TensorFlow import
except in the tests marked slow."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_gpuinfo import FakeNVML, h100, recorded_smi
from train import check, cli, gpuinfo
from train.check import Facts, LibFact, TfFacts

ROOT = Path(__file__).resolve().parent.parent
CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9",
              "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]}
CPU_BUILD = {"is_cuda_build": False, "is_rocm_build": False, "is_tensorrt_build": False}
LIBS_OK = [LibFact("cudart", "libcudart.so.12", "/venv/nvidia/cuda_runtime/lib/libcudart.so.12", "12.5"),
           LibFact("cublas", "libcublas.so.12", "/venv/nvidia/cublas/lib/libcublas.so.12", "12.5.3"),
           LibFact("cudnn", "libcudnn.so.9", "/venv/nvidia/cudnn/lib/libcudnn.so.9", "9.3.0")]
# What TensorFlow's CUDA build prints on a machine without a GPU (the "cuInit noise").
CUINIT_NOISE = [
    "2024-03-12 09:41:30.118211: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:282] failed call to "
    "cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected",
    "2024-03-12 09:41:30.118274: I external/local_xla/xla/stream_executor/cuda/cuda_diagnostics.cc:134] retrieving "
    "CUDA diagnostic information for host: 3f2a9c1b7d4e",
    "2024-03-12 09:41:29.905112: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different computation orders.",
]
DLOPEN_ERRORS = [
    "2023-11-29 14:02:15.441871: W tensorflow/compiler/xla/stream_executor/platform/default/dso_loader.cc:64] Could "
    "not load dynamic library 'libcudnn.so.8'; dlerror: libcudnn.so.8: cannot open shared object file: No such file "
    "or directory",
    "2023-11-29 14:02:15.442093: W tensorflow/core/common_runtime/gpu/gpu_device.cc:1960] Cannot dlopen some GPU "
    "libraries. Please make sure the missing libraries mentioned above are installed properly if you would like to "
    "use GPU. Follow the guide at https://www.tensorflow.org/install/gpu for how to download and setup the required "
    "libraries for your platform.",
]


def tf_gpus(n: int = 1, cc=(9, 0), name: str = "NVIDIA H100 80GB HBM3") -> list[dict]:
    return [{"name": f"/physical_device:GPU:{i}", "device_name": name, "compute_capability": list(cc)} for i in range(n)]


def cuda_tf(**kw) -> TfFacts:
    return TfFacts(version="2.21.0", build=dict(CUDA_BUILD), **kw)


def cpu_tf(**kw) -> TfFacts:
    return TfFacts(version="2.21.0", build=dict(CPU_BUILD), **kw)


def on(machine: str, tf: TfFacts, **kw) -> Facts:
    """Facts as collected on a machine whose nvidia-smi answers are recorded in tests/fixtures."""
    p = gpuinfo.probe(nvml=None, run=recorded_smi(machine))
    kw.setdefault("libraries", LIBS_OK if tf.build.get("is_cuda_build") else [])
    kw.setdefault("nvidia_pci_devices", len(p.gpus))
    return Facts(tf=tf, driver_present=p.driver_present, driver_reason=p.reason, gpus=p.gpus, **kw)


def codes(report: dict) -> dict[str, dict]:
    return {d["code"]: d for d in report["diagnoses"]}


def test_cpu_machine_gets_a_calm_report_exit_0():
    facts = Facts(tf=cpu_tf(log=CUINIT_NOISE, matmul=[{"device": "/CPU:0", "n": 1024, "seconds": 0.03, "gflops": 70.0}]),
                  driver_reason="NVML: NVML Shared Library Not Found", cpu_bf16=["avx512_bf16"])
    r = check.build_report(facts)
    assert r["exit_code"] == 0 and r["verdict"]["status"] == "cpu" and r["verdict"]["usable_gpus"] == 0
    assert {d["severity"] for d in r["diagnoses"]} == {"info"}
    text = check.format_report(r)
    assert "VERDICT: running on CPU" in text and "cuInit" in text and "CUDA_ERROR_NO_DEVICE" not in text
    assert r["precision"]["auto"] == "mixed_bfloat16" and r["tf_log"]["shown"] == []


def test_require_gpu_on_cpu_exits_1_through_the_cli(monkeypatch, capsys):
    monkeypatch.setattr(check, "collect", lambda skip_matmul=False: Facts(tf=cpu_tf()))
    assert check.build_report(Facts(tf=cpu_tf()), require_gpu=True)["exit_code"] == 1
    assert cli.main(["check", "--require-gpu", "--skip-matmul"]) == 1
    out, err = capsys.readouterr()
    assert "VERDICT: running on CPU" in out and err.startswith("NoGPUError: --require-gpu: no usable GPU")
    assert cli.main(["check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"]["status"] == "cpu"


@pytest.mark.parametrize("value,expect", [(None, "NVIDIA_VISIBLE_DEVICES is not set"), ("void", "'void'"),
                                          ("none", "'none'"), ("", "''"), ("all", "not started with the NVIDIA runtime")])
def test_no_driver_in_container(value, expect):
    facts = Facts(tf=cuda_tf(log=CUINIT_NOISE), driver_reason="NVML: Driver Not Loaded", in_container=True,
                  nvidia_pci_devices=1, env={"NVIDIA_VISIBLE_DEVICES": value})
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
    assert "gpu_not_visible_to_tf" in codes(r) and codes(r)["gpu_not_visible_to_tf"]["fix"] == "fix the problem(s) above"


def test_oldest_driver_for_cuda_12_is_accepted():
    r = check.build_report(on("525.60.13_t4", cuda_tf(gpus=tf_gpus(cc=(7, 5), name="Tesla T4"))))
    assert "driver_too_old" not in codes(r) and r["verdict"]["status"] == "gpu"
    assert r["precision"]["auto"] == "mixed_float16"
    assert not r["precision"]["options"]["mixed_bfloat16"]["sensible"]


@pytest.mark.parametrize("others,code", [([], "library_missing"),
                                         (["/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7"], "library_wrong_major")])
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


def test_find_library_on_disk(tmp_path):
    (tmp_path / "libcudnn.so.8").write_bytes(b"")
    wrong = check.find_library("cudnn", 9, [tmp_path])
    assert wrong.path is None and wrong.others == [str(tmp_path / "libcudnn.so.8")]
    (tmp_path / "libcudnn.so.9").write_bytes(b"not an ELF file")
    broken = check.find_library("cudnn", 9, [tmp_path])
    assert broken.path == str(tmp_path / "libcudnn.so.9") and broken.version is None and broken.error


def test_libraries_not_looked_for_on_a_cpu_build():
    assert check.collect_libraries(CPU_BUILD, {}) == []


def test_cpu_only_build_on_a_gpu_machine():
    r = check.build_report(on("535.129.03_2xa100", cpu_tf()))
    d = codes(r)["cpu_only_build"]
    assert d["severity"] == "error" and "tensorflow[and-cuda]==2.21.0" in d["fix"] and r["verdict"]["status"] == "gpu_not_used"
    assert "gpu_not_visible_to_tf" not in codes(r)  # the build explains it


def test_gpu_visible_to_driver_not_to_tf_shows_the_logged_library_errors():
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(log=CUINIT_NOISE[2:] + DLOPEN_ERRORS)))
    d = codes(r)["gpu_not_visible_to_tf"]
    assert "the driver shows 2 GPU(s) but TensorFlow sees 0" in d["summary"]
    assert any(line.startswith("dso_loader.cc:64] Could not load dynamic library 'libcudnn.so.8'") for line in d["details"])
    assert any("Cannot dlopen some GPU libraries" in line for line in d["details"])
    assert "oneDNN" not in " ".join(d["details"]) and "tensorflow[and-cuda]" in d["fix"]


def test_cuinit_lines_are_noise_without_a_driver_and_shown_with_one():
    shown, noise = check.classify_log(CUINIT_NOISE, driver_present=False)
    assert shown == [] and sum(noise.values()) == 3 and any(k.startswith("cuInit") for k in noise)
    shown, _ = check.classify_log(CUINIT_NOISE[:1], driver_present=True)
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
    r = check.build_report(on("550.54.15_h100", cuda_tf(gpus=tf_gpus())), own_pids={51007})
    d = codes(r)["memory_held_by_others"]
    assert d["severity"] == "warning" and "60.0 of 79.6 GiB" in d["summary"]
    assert d["details"] == ["pid 48213 python3: 57.5 GiB"] and "kill 48213" in d["fix"]
    assert r["verdict"]["status"] == "gpu" and "1 warning(s)" in r["verdict"]["line"]


def test_memory_held_outside_this_container_via_nvml():
    p = gpuinfo.probe(nvml=FakeNVML([h100(procs=[])]))
    r = check.build_report(Facts(tf=cuda_tf(gpus=tf_gpus()), driver_present=True, gpus=p.gpus, libraries=LIBS_OK))
    assert "outside this container" in codes(r)["memory_held_by_others"]["details"][0]


def test_healthy_gpus_report_speedup_and_precision():
    matmul = [{"device": "/GPU:0", "n": 4096, "seconds": 0.0075, "gflops": 18325.0},
              {"device": "/GPU:1", "n": 4096, "seconds": 0.0075, "gflops": 18300.0},
              {"device": "/CPU:0", "n": 1024, "seconds": 0.03, "gflops": 71.6}]
    mg = {"in_effect": True, "error": None, "late_call": None}
    r = check.build_report(on("535.129.03_2xa100", cuda_tf(gpus=tf_gpus(2, (8, 0), "NVIDIA A100-SXM4-40GB"),
                                                           matmul=matmul, memory_growth=mg)), require_gpu=True)
    assert r["diagnoses"] == [] and r["exit_code"] == 0 and r["gpu_speedup"] == 255.9
    assert r["verdict"]["line"].startswith("GPU ready: TensorFlow uses 2 GPU(s) (NVIDIA A100-SXM4-40GB); matmul 256x")
    assert r["precision"]["auto"] == "mixed_bfloat16" and "on for every GPU" in check.format_report(r)


def test_tensorflow_that_cannot_start_exits_1():
    r = check.build_report(Facts(tf=TfFacts(error="import tensorflow failed: ImportError: libcuda.so.1")))
    assert r["exit_code"] == 1 and r["verdict"]["status"] == "no_tensorflow"
    assert codes(r)["tensorflow_unavailable"]["fix"].startswith("install the locked requirements")


def test_json_has_exactly_the_documented_fields():
    r = check.build_report(on("550.54.15_h100", cuda_tf(gpus=tf_gpus())))
    assert set(r) == set(check.JSON_FIELDS)
    assert set(json.loads(json.dumps(r))["gpus"][0]) == {"index", "name", "uuid", "memory_total_mb", "memory_used_mb",
                                                         "driver_version", "compute_capability", "cuda_driver_version",
                                                         "processes"}
    doc = ROOT / "docs" / "readme-check.md"
    text = doc.read_text() if doc.exists() else (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    assert documented >= set(check.JSON_FIELDS)


@pytest.mark.slow
def test_real_check_on_this_machine_finishes_within_seconds():
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "train", "check", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    r = json.loads(done.stdout)
    assert done.returncode == 0 and r["verdict"]["status"] in ("cpu", "gpu") and time.perf_counter() - start < 60
    assert r["tensorflow"]["version"] and any("CPU" in m["device"] for m in r["matmul"])


@pytest.mark.gpu
@pytest.mark.slow
def test_real_gpu_passes_require_gpu():
    if not gpuinfo.driver_status()[0]:
        pytest.skip("needs an NVIDIA GPU and driver")
    done = subprocess.run([sys.executable, "-m", "train", "check", "--require-gpu"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


class _FakeTF:
    """A TensorFlow stand-in for probe_main: one GPU whose memory growth comes too late."""

    __version__ = "2.21.0"

    def __init__(self):
        gpu = type("PhysicalDevice", (), {"name": "/physical_device:GPU:0"})()
        late = RuntimeError("Physical devices cannot be modified after being initialized")
        exp = type("Exp", (), {"set_memory_growth": staticmethod(lambda g, on: (_ for _ in ()).throw(late)),
                               "get_memory_growth": staticmethod(lambda g: False),
                               "get_device_details": staticmethod(lambda g: {"device_name": "Tesla T4",
                                                                             "compute_capability": (7, 5)})})
        self.config = type("Config", (), {"list_physical_devices": staticmethod(lambda kind: [gpu]),
                                          "experimental": exp})
        self.sysconfig = type("Sysconfig", (), {"get_build_info": staticmethod(lambda: dict(CUDA_BUILD))})


def test_probe_records_the_late_memory_growth_call(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", _FakeTF())
    check.probe_main(skip_matmul=True)
    out = json.loads(capsys.readouterr().out.split("@@train-check@@", 1)[1])
    assert out["memory_growth"]["late_call"] == "tf.config.experimental.set_memory_growth('/physical_device:GPU:0', True)"
    assert out["gpus"] == [{"name": "/physical_device:GPU:0", "device_name": "Tesla T4", "compute_capability": [7, 5]}]
    facts = on("525.60.13_t4", TfFacts(**out))
    assert check.build_report(facts)["diagnoses"][0]["code"] == "memory_growth_too_late"


def test_probe_that_crashes_or_hangs_is_a_finding(monkeypatch):
    monkeypatch.setattr(check.sys, "executable", "/bin/false")
    crashed = check.run_probe(skip_matmul=True)
    assert crashed.version is None and "exited with status 1" in crashed.error
    monkeypatch.setattr(check.sys, "executable", "/bin/sleep")
    monkeypatch.setattr(check.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(
        subprocess.TimeoutExpired("probe", 0.1, stderr=b"still loading")))
    hung = check.run_probe(skip_matmul=True, timeout=0.1)
    assert "did not finish" in hung.error and hung.log == ["still loading"]
    assert check.build_report(Facts(tf=hung))["exit_code"] == 1
