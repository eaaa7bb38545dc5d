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
