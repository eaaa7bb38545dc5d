"""train.gpucheck.gpuinfo against recorded nvidia-smi outputs and an NVML stand-in: no GPU needed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from train.gpucheck import gpuinfo
from train.gpucheck.gpuinfo import GpuProcess

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


def recording(name: str) -> str:
    """A fixture file without its leading '# reconstructed ...' comment lines."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("#"))


def recorded_smi(machine: str):
    """A `run(args)` that answers like nvidia-smi on the recorded machine ('no-driver' fails)."""
    calls: list[list[str]] = []

    def run(args):
        calls.append(list(args))
        if machine == "no-driver":
            return 9, recording("no-driver.txt")
        if len(args) == 1:
            return 0, recording(f"{machine}.header.txt")
        if args[1].startswith("--query-compute-apps"):
            return 0, recording(f"{machine}.compute-apps.txt")
        if "compute_cap" in args[1] and (FIXTURES / f"{machine}.query-gpu-compute_cap.txt").exists():
            return 2, recording(f"{machine}.query-gpu-compute_cap.txt")
        return 0, recording(f"{machine}.query-gpu.txt")

    run.calls = calls
    return run


class FakeNVML:
    """Just enough of pynvml: memory in bytes, CUDA as 12040, processes with usedGpuMemory."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus=(), driver="550.54.15", cuda=12040, init_error=None):
        self.gpus, self.driver, self.cuda, self.init_error = list(gpus), driver, cuda, init_error
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetName(self, h):
        return h["name"].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=h["total_mb"] * gpuinfo.MIB, used=h["used_mb"] * gpuinfo.MIB)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return h["cc"]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * gpuinfo.MIB)
            for pid, _, mb in h.get("procs", [])
        ]

    def nvmlSystemGetProcessName(self, pid):
        for g in self.gpus:
            for p, name, _ in g.get("procs", []):
                if p == pid and name:
                    return name
        raise self.NVMLError("Not Found")


def h100(**kw):
    gpu = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-7c1f",
        "total_mb": 81559,
        "used_mb": 61447,
        "cc": (9, 0),
        "procs": [(48213, "python3", 58880), (51007, None, None)],
    }
    return {**gpu, **kw}


def test_smi_parses_h100_with_processes():
    p = gpuinfo.probe(nvml=None, run=recorded_smi("550.54.15_h100"))
    assert p.driver_present and "550.54.15" in p.reason
    (g,) = p.gpus
    assert (g.name, g.memory_total_mb, g.memory_used_mb) == ("NVIDIA H100 80GB HBM3", 81559, 61447)
    assert g.compute_capability == (9, 0) and g.cuda_driver_version == "12.4"
    assert g.processes == [GpuProcess(48213, "python3", 58880.0), GpuProcess(51007, "/opt/conda/bin/python", 2048.0)]


def test_smi_two_idle_gpus_and_cuda_header_read_once():
    run = recorded_smi("535.129.03_2xa100")
    gpuinfo.probe(nvml=None, run=run)
    gpus = gpuinfo.probe(nvml=None, run=run).gpus
    assert [g.index for g in gpus] == [0, 1] and all(g.processes == [] for g in gpus)
    assert all(g.cuda_driver_version == "12.2" and g.compute_capability == (8, 0) for g in gpus)
    assert sum(1 for c in run.calls if c == ["nvidia-smi"]) <= 1  # cached per driver version


def test_smi_old_driver_without_compute_cap_field():
    p = gpuinfo.probe(nvml=None, run=recorded_smi("470.223.02_v100"))
    (g,) = p.gpus
    assert g.driver_version == "470.223.02" and g.compute_capability is None and g.cuda_driver_version == "11.4"


def test_smi_driver_not_reachable():
    p = gpuinfo.probe(nvml=None, run=recorded_smi("no-driver"))
    assert p.gpus == [] and not p.driver_present and "couldn't communicate" in p.reason


def test_smi_missing_binary_is_an_answer():
    p = gpuinfo.probe(nvml=None, run=lambda args: gpuinfo.run_smi(["nvidia-smi-does-not-exist"]))
    assert p.gpus == [] and not p.driver_present and "not found on PATH" in p.reason


def test_nvml_stand_in():
    nvml = FakeNVML([h100()])
    p = gpuinfo.probe(nvml=nvml)
    (g,) = p.gpus
    assert g.name == "NVIDIA H100 80GB HBM3" and g.cuda_driver_version == "12.4" and g.compute_capability == (9, 0)
    assert g.processes == [GpuProcess(48213, "python3", 58880.0), GpuProcess(51007, "?", None)]
    assert nvml.shutdowns == 1 and p.reason.startswith("NVML: driver 550.54.15")


def test_nvml_without_driver_is_not_fatal():
    p = gpuinfo.probe(nvml=FakeNVML(init_error="NVML Shared Library Not Found"))
    assert p == gpuinfo.Probe([], False, "NVML: NVML Shared Library Not Found")


def test_nvml_query_failure_after_init_is_not_fatal():
    nvml = FakeNVML([h100()])
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("GPU is lost"))
    p = gpuinfo.probe(nvml=nvml)
    assert p.gpus == [] and p.driver_present and "GPU is lost" in p.reason


def test_real_machine_never_raises():
    # How fast it answers is benchmarks/test_startup.py's job, not a timed test's.
    import ctypes.util
    import shutil

    gpus = gpuinfo.query_gpus()
    found = gpuinfo.probe()
    present, reason = found.driver_present, found.reason
    assert reason.startswith(("NVML: ", "nvidia-smi: ", "GPU query failed: "))
    if ctypes.util.find_library("nvidia-ml") is None and shutil.which("nvidia-smi") is None:  # no driver installed
        assert not present and gpus == []
        assert reason in ("NVML: NVML Shared Library Not Found", "nvidia-smi: nvidia-smi not found on PATH")
    if not present:
        assert gpus == []
    for g in gpus:
        assert g.memory_total_mb > 0 and g.driver_version in reason and f"{len(gpus)} GPU(s)" in reason


@pytest.mark.gpu
def test_real_gpu_is_listed():
    found = gpuinfo.probe()
    present, reason = found.driver_present, found.reason
    if not present:
        pytest.skip(f"needs an NVIDIA GPU and driver ({reason})")
    gpus = gpuinfo.query_gpus()
    assert gpus, f"the driver is loaded but lists no GPU ({reason})"
    assert all(g.memory_total_mb > 0 and g.driver_version for g in gpus)


def test_an_nvml_error_without_a_message_is_named_by_its_type():
    nvml = FakeNVML()
    nvml.nvmlInit = lambda: (_ for _ in ()).throw(FakeNVML.NVMLError())
    assert gpuinfo.probe(nvml=nvml) == gpuinfo.Probe([], False, "NVML: NVMLError")


H100_UUID = "GPU-7c1f3a9e-52d4-8b6a-0f3e-91d2c4a6b8e0"
QUERY_GPU = ["nvidia-smi", f"--query-gpu={gpuinfo.SMI_GPU_FIELDS}", "--format=csv,noheader,nounits"]
QUERY_APPS = [
    "nvidia-smi",
    "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
    "--format=csv,noheader,nounits",
]


def test_smi_whole_answer_and_the_commands_asked(monkeypatch):
    run = recorded_smi("550.54.15_h100")
    assert gpuinfo.probe(nvml=None, run=run) == gpuinfo.Probe(
        [
            gpuinfo.GpuInfo(
                0,
                "NVIDIA H100 80GB HBM3",
                H100_UUID,
                81559.0,
                61447.0,
                "550.54.15",
                (9, 0),
                "12.4",
                [GpuProcess(48213, "python3", 58880.0), GpuProcess(51007, "/opt/conda/bin/python", 2048.0)],
            )
        ],
        True,
        "nvidia-smi: driver 550.54.15, CUDA 12.4, 1 GPU(s)",
    )
    assert run.calls == [QUERY_GPU, ["nvidia-smi"], QUERY_APPS]


def test_smi_of_an_old_driver_is_asked_again_without_compute_cap(monkeypatch):
    recorded = recorded_smi("470.223.02_v100")

    def run(args):  # any failing status, not only nvidia-smi's 2
        rc, out = recorded(args)
        return (1 if rc else 0), out

    p = gpuinfo.probe(nvml=None, run=run)
    assert [g.compute_capability for g in p.gpus] == [
        None
    ] and p.reason == "nvidia-smi: driver 470.223.02, CUDA 11.4, 1 GPU(s)"
    assert recorded.calls[:2] == [
        QUERY_GPU,
        [
            "nvidia-smi",
            "--query-gpu=index,name,uuid,memory.total,memory.used,driver_version",
            "--format=csv,noheader,nounits",
        ],
    ]


def test_smi_whose_header_and_process_list_fail_still_lists_the_gpus(monkeypatch):
    calls = []

    def run(args):
        calls.append(list(args))
        if args == QUERY_GPU:
            return 0, "0, NVIDIA L4, GPU-1, [N/A], [N/A], 550.54.15, 8.9\n"
        return 6, "CUDA Version: 12.4\nGPU-1, 4242, python, 100\n"  # an error status: what it printed is not read

    p = gpuinfo.probe(nvml=None, run=run)
    assert p == gpuinfo.Probe(
        [gpuinfo.GpuInfo(0, "NVIDIA L4", "GPU-1", 0.0, 0.0, "550.54.15", (8, 9), None)],
        True,
        "nvidia-smi: driver 550.54.15, CUDA ?, 1 GPU(s)",
    )
    assert gpuinfo._cuda_cache == {"550.54.15": None} and calls == [QUERY_GPU, ["nvidia-smi"], QUERY_APPS]


def test_smi_without_gpus_or_without_output():
    assert gpuinfo.probe(nvml=None, run=lambda args: (0, "\n")) == gpuinfo.Probe(
        [], True, "nvidia-smi: driver loaded, no GPU listed"
    )
    assert gpuinfo.probe(nvml=None, run=lambda args: (9, " \n\n")) == gpuinfo.Probe(
        [], False, "nvidia-smi: exit status 9"
    )
    assert gpuinfo.probe(nvml=None, run=lambda args: (9, "\n  NVIDIA-SMI has failed  \nmore")) == gpuinfo.Probe(
        [], False, "nvidia-smi: NVIDIA-SMI has failed"
    )


def test_a_failing_back_end_is_a_reason_not_an_exception():
    def run(args):
        raise ValueError("bad answer")

    assert gpuinfo.probe(nvml=None, run=run) == gpuinfo.Probe([], False, "GPU query failed: ValueError: bad answer")


def test_the_cuda_version_is_read_from_the_header():
    version = gpuinfo.parse_cuda_version
    assert version("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4     |") == "12.4"
    assert version("| Driver Version: 396.26   CUDA Version: 9.2 |") == "9.2"
    assert version("CUDA Version: 12.2 | CUDA Version: 11.0 |") == "12.2"
    assert [
        version(h) for h in ("Driver Version: 550.54.15", "CUDA Version: N/A |", "CUDA Version:", "cuda version: 12.4")
    ] == [None] * 4


def test_query_gpu_lines_that_are_not_a_gpu_are_skipped():
    text = "Failed to read one field\n0, Tesla\n0, NVIDIA T4, GPU-t4, 15360, [Not Supported], 525.60.13, 7.x\n1, NVIDIA T4, GPU-t4b, 15360, 5, 525.60.13, 7.5.1\n"
    assert gpuinfo.parse_query_gpu(text) == [
        gpuinfo.GpuInfo(0, "NVIDIA T4", "GPU-t4", 15360.0, 0.0, "525.60.13", None, None),
        gpuinfo.GpuInfo(1, "NVIDIA T4", "GPU-t4b", 15360.0, 5.0, "525.60.13", None, None),
    ]


def test_compute_apps_lines_that_are_not_a_process_are_skipped():
    text = "No running processes found\nGPU-1, 12, python\nGPU-1, 13, python, [N/A]\nGPU-2, 14, trainer, 512\n"
    assert gpuinfo.parse_compute_apps(text) == {
        "GPU-1": [GpuProcess(13, "python", None)],
        "GPU-2": [GpuProcess(14, "trainer", 512.0)],
    }


def test_nvml_whole_answer(monkeypatch):
    nvml = FakeNVML([h100(name="NVIDIA H100\xff"), h100(uuid="GPU-2", used_mb=0, procs=[])], cuda=12005)
    nvml.nvmlDeviceGetName = lambda h: h["name"].encode("latin-1")  # not UTF-8
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=7)] if h["uuid"] == "GPU-2" else []
    nvml.nvmlShutdown = lambda: (_ for _ in ()).throw(FakeNVML.NVMLError("Uninitialized"))
    assert gpuinfo.probe(nvml=nvml) == gpuinfo.Probe(
        [
            gpuinfo.GpuInfo(0, "NVIDIA H100\ufffd", "GPU-7c1f", 81559.0, 61447.0, "550.54.15", (9, 0), "12.0"),
            gpuinfo.GpuInfo(
                1,
                "NVIDIA H100 80GB HBM3",
                "GPU-2",
                81559.0,
                0.0,
                "550.54.15",
                (9, 0),
                "12.0",
                [GpuProcess(7, "?", None)],
            ),
        ],
        True,
        "NVML: driver 550.54.15, CUDA 12.0, 2 GPU(s)",
    )


def test_nvml_without_cuda_version_or_compute_capability():
    nvml = FakeNVML([h100(procs=[])])
    nvml.nvmlSystemGetCudaDriverVersion = lambda: (_ for _ in ()).throw(FakeNVML.NVMLError("Not Supported"))
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (_ for _ in ()).throw(FakeNVML.NVMLError("Not Supported"))
    assert gpuinfo.probe(nvml=nvml) == gpuinfo.Probe(
        [gpuinfo.GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-7c1f", 81559.0, 61447.0, "550.54.15", None, None)],
        True,
        "NVML: driver 550.54.15, CUDA ?, 1 GPU(s)",
    )


def test_run_smi_returns_status_and_both_outputs(monkeypatch, tmp_path):
    assert gpuinfo.run_smi(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\nerr\n")
    assert gpuinfo.run_smi(["nvidia-smi-does-not-exist", "-L"]) == (127, "nvidia-smi-does-not-exist not found on PATH")
    broken = tmp_path / "nvidia-smi"
    broken.write_bytes(b"\x7fELF not really")
    broken.chmod(0o755)
    assert gpuinfo.run_smi([str(broken)]) == (1, f"[Errno 8] Exec format error: '{broken}'")
    monkeypatch.setattr(gpuinfo, "SMI_TIMEOUT_S", 0.3)
    assert gpuinfo.run_smi(["sleep", "5"]) == (1, "Command '['sleep', '5']' timed out after 0.3 seconds")
