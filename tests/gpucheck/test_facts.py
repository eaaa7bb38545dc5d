"""train.gpucheck.facts: libraries found on disk, and the TensorFlow probe (with a TensorFlow stand-in,
a crashing and a hanging subprocess). No GPU, no TensorFlow import."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from check_fakes import CPU_BUILD, CUDA_BUILD, on

from train.gpucheck import check, gpuinfo
from train.gpucheck import facts as check_facts
from train.gpucheck.facts import Facts, TfFacts
from train.setup import hardware


def test_find_library_on_disk(tmp_path):
    (tmp_path / "libcudnn.so.8").write_bytes(b"")
    wrong = check_facts.find_library("cudnn", 9, [tmp_path])
    assert wrong.path is None and wrong.others == [str(tmp_path / "libcudnn.so.8")]
    (tmp_path / "libcudnn.so.9").write_bytes(b"not an ELF file")
    broken = check_facts.find_library("cudnn", 9, [tmp_path])
    assert broken.path == str(tmp_path / "libcudnn.so.9") and broken.version is None and broken.error


def test_libraries_not_looked_for_on_a_cpu_build():
    assert check_facts.collect_libraries(CPU_BUILD, {}) == []


class _FakeTF:
    """A TensorFlow stand-in for probe_main: one GPU whose memory growth comes too late."""

    __version__ = "2.21.0"

    def __init__(self):
        gpu = type("PhysicalDevice", (), {"name": "/physical_device:GPU:0"})()
        late = RuntimeError("Physical devices cannot be modified after being initialized")
        exp = type(
            "Exp",
            (),
            {
                "set_memory_growth": staticmethod(lambda g, on: (_ for _ in ()).throw(late)),
                "get_memory_growth": staticmethod(lambda g: False),
                "get_device_details": staticmethod(lambda g: {"device_name": "Tesla T4", "compute_capability": (7, 5)}),
            },
        )
        self.config = type(
            "Config", (), {"list_physical_devices": staticmethod(lambda kind: [gpu]), "experimental": exp}
        )
        self.sysconfig = type("Sysconfig", (), {"get_build_info": staticmethod(lambda: dict(CUDA_BUILD))})


def test_probe_records_the_late_memory_growth_call(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", _FakeTF())
    check_facts.probe_main(skip_matmul=True)
    out = json.loads(capsys.readouterr().out.split("@@train-check@@", 1)[1])
    assert (
        out["memory_growth"]["late_call"] == "tf.config.experimental.set_memory_growth('/physical_device:GPU:0', True)"
    )
    assert out["gpus"] == [{"name": "/physical_device:GPU:0", "device_name": "Tesla T4", "compute_capability": [7, 5]}]
    facts = on("525.60.13_t4", TfFacts(**out))
    assert check.build_report(facts)["diagnoses"][0]["code"] == "memory_growth_too_late"


def test_probe_that_crashes_or_hangs_is_a_finding(monkeypatch):
    monkeypatch.setattr(check_facts.sys, "executable", "/bin/false")
    crashed = check_facts.run_probe(skip_matmul=True)
    assert crashed.version is None and "exited with status 1" in crashed.error
    monkeypatch.setattr(check_facts.sys, "executable", "/bin/sleep")
    monkeypatch.setattr(
        check_facts.subprocess,
        "run",
        lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("probe", 0.1, stderr=b"still loading")),
    )
    hung = check_facts.run_probe(skip_matmul=True, timeout=0.1)
    assert "did not finish" in hung.error and hung.log == ["still loading"]
    assert check.build_report(Facts(tf=hung))["exit_code"] == 1


def test_a_cuda_build_looks_for_the_drivers_libcuda_first():
    """libcuda.so.1 comes with the driver (no wheel has it): looked for beside the CUDA wheels' libraries."""
    wanted = [lib.expected for lib in check_facts.collect_libraries(CUDA_BUILD, {})]
    assert wanted == ["libcuda.so.1", "libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"]


def test_the_file_a_soname_links_to_is_not_another_library(tmp_path):
    """The driver's libcuda.so.1 links to libcuda.so.<driver version>: not a second libcuda of another major."""
    (tmp_path / "libcuda.so.535.129.03").write_bytes(b"not an ELF file")
    (tmp_path / "libcuda.so.1").symlink_to("libcuda.so.535.129.03")
    assert check_facts.find_library("cuda", 1, [tmp_path]).others == []
    (tmp_path / "libcuda.so.1").unlink()  # ldconfig never run: the versioned file alone is worth naming
    assert check_facts.find_library("cuda", 1, [tmp_path]).others == [str(tmp_path / "libcuda.so.535.129.03")]


def test_versions_and_majors_are_read_from_the_digits():
    assert check_facts._version("V12.5.1 (build 7)") == (12, 5, 1, 7)
    assert check_facts._version(None) == ()
    assert [check_facts._major(v) for v in ("12.5.1", 9, "", None, 0, "none")] == [12, 9, None, None, None, None]


def test_nvidia_display_and_3d_controllers_are_counted(monkeypatch, tmp_path):
    devices = {
        "0000:01:00.0": ("0x10de\n", "0x030000\n"),  # a display controller
        "0000:02:00.0": ("0x10de\n", "0x030200\n"),  # a 3D controller (a data-centre GPU)
        "0000:03:00.0": ("0x10de\n", "0x040300\n"),  # the same card's audio function
        "0000:04:00.0": ("0x8086\n", "0x030000\n"),  # another vendor's display controller
        "0000:05:00.0": None,  # no vendor file to read
    }
    for name, files in devices.items():
        (tmp_path / name).mkdir()
        if files:
            (tmp_path / name / "vendor").write_text(files[0])
            (tmp_path / name / "class").write_text(files[1])
    real = check_facts.Path
    monkeypatch.setattr(check_facts, "Path", lambda p: tmp_path if p == "/sys/bus/pci/devices" else real(p))
    assert check_facts.nvidia_pci_devices() == 2


def test_library_dirs_are_the_wheels_then_ld_library_path_then_the_system_ones(monkeypatch, tmp_path):
    system = (
        "/usr/local/cuda/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/local/lib",
    )
    real = check_facts.Path
    monkeypatch.setattr(check_facts, "Path", lambda p: real(f"{tmp_path}/root{p}") if p in system else real(p))
    site, dist, other = tmp_path / "a" / "site-packages", tmp_path / "b" / "dist-packages", tmp_path / "c"
    for d in (
        site / "nvidia/cudnn/lib",
        site / "nvidia/cublas/lib",
        site / "nvidia/nccl",
        dist / "nvidia/cuda_runtime/lib",
        other / "nvidia/cufft/lib",
        tmp_path / "ld",
    ):
        d.mkdir(parents=True)
    for p in system[1:]:
        real(f"{tmp_path}/root{p}").mkdir(parents=True)
    monkeypatch.setattr(check_facts.sys, "path", [str(site), str(dist), str(other)])
    ld = f"{tmp_path / 'ld'}::{tmp_path / 'missing'}:{tmp_path / 'ld'}:{site / 'nvidia/cublas/lib'}"
    assert check_facts.library_dirs({"LD_LIBRARY_PATH": ld}) == [
        site / "nvidia/cublas/lib",
        site / "nvidia/cudnn/lib",
        dist / "nvidia/cuda_runtime/lib",
        tmp_path / "ld",
    ] + [real(f"{tmp_path}/root{p}") for p in system[1:]]
    assert check_facts.library_dirs({}) == [
        site / "nvidia/cublas/lib",
        site / "nvidia/cudnn/lib",
        dist / "nvidia/cuda_runtime/lib",
    ] + [real(f"{tmp_path}/root{p}") for p in system[1:]]
    real(f"{tmp_path}/root{system[0]}").mkdir(parents=True)
    assert check_facts.library_dirs({})[3] == real(f"{tmp_path}/root{system[0]}")


class _FakeLib:
    """A loaded CUDA library: each call writes its answer through the pointer it is given."""

    def __init__(self, answer, status=0, fail_at=None):
        self.answer, self.status, self.fail_at, self.props = answer, status, fail_at, []
        self.cudnnGetVersion = lambda: answer

    def _write(self, ref, value):
        ref._obj.value = value
        return self.status

    def cuDriverGetVersion(self, ref):
        return self._write(ref, self.answer)

    def cudaRuntimeGetVersion(self, ref):
        return self._write(ref, self.answer)

    def cublasGetProperty(self, prop, ref):
        self.props.append(prop)
        ref._obj.value = self.answer[prop]
        return 1 if prop == self.fail_at else 0


def test_each_library_reports_its_version_its_own_way():
    version = check_facts._library_version
    assert [version(_FakeLib(v), name) for v in (12005, 12090) for name in ("cuda", "cudart")] == [
        "12.0",
        "12.0",
        "12.9",
        "12.9",
    ]
    assert version(_FakeLib(12040, status=1), "cuda") is None and version(_FakeLib(12040, status=100), "cudart") is None
    cudnn = _FakeLib(90300)
    assert version(cudnn, "cudnn") == "9.3.0" and cudnn.cudnnGetVersion.restype is ctypes.c_size_t
    assert [version(_FakeLib(v), "cudnn") for v in (90000, 91201, 8907, 8000)] == ["9.0.0", "9.12.1", "8.9.7", "8.0.0"]
    cublas = _FakeLib([12, 5, 3])
    assert version(cublas, "cublas") == "12.5.3" and cublas.props == [0, 1, 2]
    assert (
        version(_FakeLib([12, 5, 3], fail_at=1), "cublas") is None
        and version(_FakeLib([12, 5, 3], fail_at=2), "cublas") is None
    )
    assert version(_FakeLib(12040), "nccl") is None


def test_find_library_records_path_version_other_majors_and_the_loaders_error(monkeypatch, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for d, names in (
        (first, ["libcudnn.so.8", "libcudnn.so.9.3.0", "libcudnn_ops.so.9"]),
        (second, ["libcudnn.so.9", "libcudnn.so.8.9.7"]),
    ):
        d.mkdir()
        for n in names:
            (d / n).write_bytes(b"")
    (tmp_path / "third").mkdir()
    (tmp_path / "third" / "libcudnn.so.9").write_bytes(b"")
    loaded = []

    def cdll(path):
        loaded.append(path)
        if "broken" in str(path):
            raise OSError(f"{path}: invalid ELF header")
        return _FakeLib(90300)

    monkeypatch.setattr(check_facts.ctypes, "CDLL", cdll)
    dirs = [first, second, first, tmp_path / "third"]
    assert check_facts.find_library("cudnn", 9, dirs) == check_facts.LibFact(
        "cudnn",
        "libcudnn.so.9",
        str(second / "libcudnn.so.9"),
        "9.3.0",
        [str(first / "libcudnn.so.8"), str(second / "libcudnn.so.8.9.7")],
    )
    assert loaded == [str(second / "libcudnn.so.9")]
    assert check_facts.find_library("cudnn", 7, [first]) == check_facts.LibFact(
        "cudnn",
        "libcudnn.so.7",
        "libcudnn.so.7 (loader cache)",
        "9.3.0",
        [str(first / "libcudnn.so.8"), str(first / "libcudnn.so.9.3.0")],
    )
    assert loaded[-1] == "libcudnn.so.7"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "libcudnn.so.9").write_bytes(b"")
    assert check_facts.find_library("cudnn", 9, [broken]) == check_facts.LibFact(
        "cudnn", "libcudnn.so.9", str(broken / "libcudnn.so.9"), error=f"{broken / 'libcudnn.so.9'}: invalid ELF header"
    )
    assert check_facts.find_library("brokencudnn", 9, []) == check_facts.LibFact("brokencudnn", "libbrokencudnn.so.9")
    monkeypatch.setattr(check_facts.ctypes, "CDLL", lambda path: object())  # no such function in it
    missing = check_facts.find_library("cudnn", 9, [second])
    assert missing.version is None and missing.error == "'object' object has no attribute 'cudnnGetVersion'"
    assert check_facts.find_library("cudnn", 8, []).error is None


def test_libraries_need_a_cuda_version_and_cudnn_only_when_the_build_names_one():
    assert check_facts.collect_libraries({"is_cuda_build": True}, {}) == []
    build = {"is_cuda_build": True, "cuda_version": "11.8", "cudnn_version": ""}
    assert [lib.expected for lib in check_facts.collect_libraries(build, {})] == [
        "libcuda.so.1",
        "libcudart.so.11",
        "libcublas.so.11",
    ]


def test_the_matmul_probe_reports_its_time_and_speed_or_its_error(monkeypatch):
    calls = []

    def measure(dtype, device, n, reps):
        calls.append((dtype, device, n, reps))
        if device == "/GPU:0":
            raise RuntimeError("CUDA_ERROR_OUT_OF_MEMORY\nsecond line")
        if device == "/GPU:1":
            raise RuntimeError()
        return 123_456_789_012.0

    monkeypatch.setattr(hardware, "measure_peak_flops", measure)
    assert check_facts._bench("/CPU:0", 1000, 3) == {"device": "/CPU:0", "n": 1000, "seconds": 0.0162, "gflops": 123.5}
    assert check_facts._bench("/CPU:0", 777, 3) == {"device": "/CPU:0", "n": 777, "seconds": 0.007599, "gflops": 123.5}
    assert check_facts._bench("/GPU:0", 4096, 20) == {
        "device": "/GPU:0",
        "error": "RuntimeError: CUDA_ERROR_OUT_OF_MEMORY",
    }
    assert check_facts._bench("/GPU:1", 4096, 20) == {"device": "/GPU:1", "error": "RuntimeError: "}
    assert calls == [
        ("float32", "/CPU:0", 1000, 3),
        ("float32", "/CPU:0", 777, 3),
        ("float32", "/GPU:0", 4096, 20),
        ("float32", "/GPU:1", 4096, 20),
    ]


class _TwoGpuTF(_FakeTF):
    """Two GPUs whose memory growth is set in time; the second reports no details."""

    def __init__(self, gpus=2):
        super().__init__()
        devices = [type("PhysicalDevice", (), {"name": f"/physical_device:GPU:{i}"})() for i in range(gpus)]
        self.grown = []

        def details(g):
            if g is devices[1]:
                raise ValueError("no details on this platform")
            return {"device_name": "NVIDIA L4", "compute_capability": (8, 9)}

        exp = type(
            "Exp",
            (),
            {
                "set_memory_growth": staticmethod(lambda g, on: self.grown.append((g.name, on))),
                "get_memory_growth": staticmethod(lambda g: (g.name, True) in self.grown),
                "get_device_details": staticmethod(details),
            },
        )
        self.config = type(
            "Config",
            (),
            {"list_physical_devices": staticmethod(lambda kind: devices if kind == "GPU" else []), "experimental": exp},
        )
        self.sysconfig = type(
            "Sysconfig",
            (),
            {
                "get_build_info": staticmethod(
                    lambda: {"is_cuda_build": True, "cuda_version": "12.5.1", "msvcp_dll_names": ("a", "b"), "n": 3}
                )
            },
        )


def _probe_output(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.startswith("@@train-check@@") and out.endswith("\n") and out.count("\n") == 1
    return json.loads(out[len("@@train-check@@") :])


def test_the_probe_reports_every_gpu_its_memory_growth_and_the_matmuls(monkeypatch, capsys):
    tf = _TwoGpuTF()
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setattr(check_facts, "_bench", lambda device, n, reps: {"device": device, "n": n, "reps": reps})
    monkeypatch.setattr(hardware, "cpu_bf16", lambda flags: ["avx512_bf16"])
    monkeypatch.setattr(hardware, "onednn_state", lambda: "on (the record a run writes)")
    check_facts.probe_main(skip_matmul=False)
    assert _probe_output(capsys) == {
        "version": "2.21.0",
        "onednn": "on (the record a run writes)",
        "build": {"is_cuda_build": True, "cuda_version": "12.5.1", "msvcp_dll_names": "('a', 'b')", "n": 3},
        "memory_growth": {"in_effect": True, "error": None, "late_call": None},
        "gpus": [
            {"name": "/physical_device:GPU:0", "device_name": "NVIDIA L4", "compute_capability": [8, 9]},
            {"name": "/physical_device:GPU:1", "device_name": None, "compute_capability": None},
        ],
        "matmul": [
            {"device": "/GPU:0", "n": 4096, "reps": 20},
            {"device": "/GPU:1", "n": 4096, "reps": 20},
            {"device": "/CPU:0", "n": 1024, "reps": 3},
        ],
    }
    assert tf.grown == [("/physical_device:GPU:0", True), ("/physical_device:GPU:1", True)]
    check_facts.probe_main(skip_matmul=True)
    assert _probe_output(capsys)["matmul"] == []


def test_a_probe_without_a_gpu_measures_bfloat16_where_the_cpu_has_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", _TwoGpuTF(gpus=0))
    monkeypatch.setattr(check_facts, "_bench", lambda device, n, reps: {"device": device})
    flags = []
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512_bf16", "avx512f"})
    monkeypatch.setattr(hardware, "cpu_bf16", lambda f: flags.append(f) or sorted(f & {"avx512_bf16", "amx_bf16"}))
    monkeypatch.setattr(hardware, "measure_bf16_speedup", lambda: 1.23456)
    check_facts.probe_main(skip_matmul=False)
    out = _probe_output(capsys)
    assert out["memory_growth"] == {"in_effect": None, "error": None, "late_call": None} and out["gpus"] == []
    assert out["matmul"] == [{"device": "/CPU:0"}] and out["bf16_speedup"] == 1.235 and "bf16_probe_error" not in out
    assert flags == [{"avx512_bf16", "avx512f"}]
    long = "bfloat16 matmul failed: " + "x" * 250  # the whole first line, however long
    monkeypatch.setattr(
        hardware, "measure_bf16_speedup", lambda: (_ for _ in ()).throw(ValueError(f"{long}\nat line 2"))
    )
    check_facts.probe_main(skip_matmul=False)
    out = _probe_output(capsys)
    assert out["bf16_probe_error"] == f"ValueError: {long}" and "bf16_speedup" not in out
    check_facts.probe_main(skip_matmul=True)
    out = _probe_output(capsys)
    assert "bf16_speedup" not in out and "bf16_probe_error" not in out
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"avx512f"})
    check_facts.probe_main(skip_matmul=False)
    out = _probe_output(capsys)
    assert "bf16_speedup" not in out and "bf16_probe_error" not in out


def test_a_probe_that_cannot_import_tensorflow_says_why(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    check_facts.probe_main(skip_matmul=False)
    assert _probe_output(capsys) == {
        "error": "import tensorflow failed: ModuleNotFoundError: import of tensorflow halted; None in sys.modules"
    }


def test_run_probe_starts_the_probe_with_every_log_line_and_reads_its_report(monkeypatch):
    calls = []

    def run(args, **kwargs):
        calls.append((args, kwargs))
        payload = json.dumps({"version": "2.21.0", "gpus": [], "unknown": 1})
        return SimpleNamespace(
            returncode=0, stdout=f"noise\n@@train-check@@{payload}\n@@train-check@@{{}}\n", stderr="line 1\nline 2\n"
        )

    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(check_facts.subprocess, "run", run)
    monkeypatch.setattr(check_facts.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    assert check_facts.run_probe(skip_matmul=False) == TfFacts(version="2.21.0", log=["line 1", "line 2"], seconds=2.5)
    ((args, kwargs),) = calls
    root = str(Path(check_facts.__file__).resolve().parents[2])
    assert args == [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {root!r}); from train.gpucheck.facts import probe_main; probe_main(False); import gc; gc.freeze()",
    ]
    env = kwargs.pop("env")
    assert kwargs == {"capture_output": True, "text": True, "timeout": 180}
    assert (
        env["TF_CPP_MIN_LOG_LEVEL"] == "0"
        and env["CUDA_VISIBLE_DEVICES"] == "1"
        and env == {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    )


def test_a_probe_that_exits_or_hangs_before_reporting_is_named_with_its_log(monkeypatch):
    ticks = iter([1.0, 4.0, 5.0, 185.5, 7.0, 8.0, 20.0, 21.0])
    monkeypatch.setattr(check_facts.time, "perf_counter", lambda: next(ticks))
    monkeypatch.setattr(
        check_facts.subprocess,
        "run",
        lambda *a, **k: SimpleNamespace(returncode=-9, stdout="@@train-check\n", stderr="Killed\n"),
    )
    assert check_facts.run_probe(skip_matmul=True) == TfFacts(
        error="the TensorFlow probe exited with status -9 before reporting", log=["Killed"], seconds=3.0
    )
    for stderr, log in ((b"loading\xff\ncuda", ["loading\ufffd", "cuda"]), (None, [])):
        monkeypatch.setattr(
            check_facts.subprocess,
            "run",
            lambda *a, stderr=stderr, **k: (_ for _ in ()).throw(
                subprocess.TimeoutExpired("probe", 180, stderr=stderr)
            ),
        )
        assert check_facts.run_probe(skip_matmul=True, timeout=180.4) == TfFacts(
            error="the TensorFlow probe did not finish in 180 s", log=log, seconds=180.5 if stderr else 1.0
        )
    monkeypatch.setattr(
        check_facts.subprocess,
        "run",
        lambda *a, **k: (_ for _ in ()).throw(subprocess.TimeoutExpired("probe", 180, stderr="text\nlog")),
    )
    assert check_facts.run_probe(skip_matmul=True, timeout=9.6).log == ["text", "log"]


def test_collect_gathers_driver_probe_libraries_environment_and_cpu(monkeypatch):
    gpus = [gpuinfo.GpuInfo(0, "NVIDIA L4", "GPU-1", 23034.0, 0.0, "550.54.15", (8, 9), "12.4")]
    order = []
    monkeypatch.setattr(
        gpuinfo,
        "probe",
        lambda: order.append("driver") or gpuinfo.Probe(gpus, True, "NVML: driver 550.54.15, CUDA 12.4, 1 GPU(s)"),
    )
    tf = TfFacts(version="2.21.0", build=dict(CUDA_BUILD))
    monkeypatch.setattr(check_facts, "run_probe", lambda skip: order.append(("probe", skip)) or tf)
    libs = [check_facts.LibFact("cuda", "libcuda.so.1")]
    monkeypatch.setattr(check_facts, "collect_libraries", lambda build, environ: order.append((build, environ)) or libs)
    monkeypatch.setattr(check_facts, "nvidia_pci_devices", lambda: 3)
    monkeypatch.setattr(hardware, "in_container", lambda orchestrated=False: orchestrated)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"amx_bf16"})
    monkeypatch.setattr(hardware, "cpu_bf16", lambda flags: sorted(flags))
    for name in check_facts.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    assert check_facts.collect(skip_matmul=True) == Facts(
        tf=tf,
        driver_present=True,
        driver_reason="NVML: driver 550.54.15, CUDA 12.4, 1 GPU(s)",
        gpus=gpus,
        libraries=libs,
        env={
            "NVIDIA_VISIBLE_DEVICES": None,
            "NVIDIA_DRIVER_CAPABILITIES": None,
            "CUDA_VISIBLE_DEVICES": "0",
            "TF_FORCE_GPU_ALLOW_GROWTH": None,
            "LD_LIBRARY_PATH": "/opt/lib",
        },
        in_container=True,
        nvidia_pci_devices=3,
        cpu_bf16=["amx_bf16"],
    )
    assert order == ["driver", ("probe", True), (CUDA_BUILD, os.environ)]
    check_facts.collect()
    assert order[-2] == ("probe", False)


FAKE_TENSORFLOW = """
__version__ = "2.21.0"
class sysconfig:
    get_build_info = staticmethod(lambda: {})
class config:
    list_physical_devices = staticmethod(lambda kind: [])
"""


@pytest.mark.parametrize(
    "module, report",
    [
        (
            "raise ImportError('no TensorFlow here')",
            {"error": "import tensorflow failed: ImportError: no TensorFlow here"},
        ),
        (
            FAKE_TENSORFLOW,
            {
                "version": "2.21.0",
                "build": {},
                "memory_growth": {"in_effect": None, "error": None, "late_call": None},
                "gpus": [],
                "matmul": [],
            },
        ),
    ],
)
def test_the_probes_report_is_out_before_a_crash_at_exit(tmp_path, module, report):
    """TensorFlow can crash at shutdown: the report is flushed when it is printed, not at exit. The
    probe starts TensorFlow with the CPU kernels a run gets: oneDNN turned on before the import where
    TensorFlow would leave it off (an AVX2-only CPU), and says which."""
    (tmp_path / "tensorflow.py").write_text(module)
    root = str(Path(check_facts.__file__).resolve().parents[2])
    code = f"import os, sys; sys.path[:0] = [{str(tmp_path)!r}, {root!r}]; from train.gpucheck.facts import probe_main; probe_main(True); os._exit(1)"
    # a pipe: block-buffered; and no TF_ENABLE_ONEDNN_OPTS, as in a user's shell
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "TF_ENABLE_ONEDNN_OPTS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    if "version" in report:
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        off_by_default = x86 and not hardware.onednn_enabled({})
        report = {**report, "onednn": f"on ({hardware._TURNED_ON})" if off_by_default else hardware.onednn_state({})}
    assert done.stdout.startswith("@@train-check@@") and done.stdout.count("\n") == 1, done.stdout
    assert json.loads(done.stdout.removeprefix("@@train-check@@")) == report
