"""What the NVIDIA driver reports about the GPUs, without TensorFlow: names, memory, processes.

NVML (the `pynvml` module from nvidia-ml-py) when it is importable, otherwise `nvidia-smi`. Never
fatal: a machine without a driver gets `[]` and a reason, in milliseconds (the run manifest records
`query_gpus()` at every start). Both back ends are injectable (`probe(nvml=..., run=...)`) so tests
feed recorded nvidia-smi outputs or an NVML stand-in.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024
SMI_TIMEOUT_S = 5.0
SMI_GPU_FIELDS = "index,name,uuid,memory.total,memory.used,driver_version,compute_cap"
SMI_APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"

# run(args) -> (exit status, stdout+stderr): the nvidia-smi back end, replaced by recordings in tests.
Runner = Callable[[Sequence[str]], "tuple[int, str]"]


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_memory_mb: float | None  # None where the driver does not say (MIG, some containers)


@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_mb: float
    memory_used_mb: float
    driver_version: str
    compute_capability: tuple[int, int] | None  # None with nvidia-smi from drivers older than 510
    cuda_driver_version: str | None  # the newest CUDA the driver supports, e.g. "12.4"
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class Probe:
    gpus: list[GpuInfo]
    driver_present: bool
    reason: str  # one line: where the answer came from, or why there is no driver


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _from_nvml(nvml: Any) -> Probe:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound / _DriverNotLoaded / ...: no driver here
        return Probe([], False, f"NVML: {str(exc) or type(exc).__name__}")
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        try:
            version = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda: str | None = f"{version // 1000}.{version % 1000 // 10}"  # NVML: 12040 -> "12.4"
        except Exception:
            cuda = None
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                cc: tuple[int, int] | None = tuple(int(x) for x in nvml.nvmlDeviceGetCudaComputeCapability(h))  # type: ignore[assignment]
            except Exception:
                cc = None
            gpus.append(
                GpuInfo(
                    i,
                    _text(nvml.nvmlDeviceGetName(h)),
                    _text(nvml.nvmlDeviceGetUUID(h)),
                    mem.total / MIB,
                    mem.used / MIB,
                    driver,
                    cc,
                    cuda,
                    _nvml_processes(nvml, h),
                )
            )
        return Probe(gpus, True, f"NVML: driver {driver}, CUDA {cuda or '?'}, {len(gpus)} GPU(s)")
    except Exception as exc:
        return Probe([], True, f"NVML: driver loaded but the query failed: {exc}")
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvml_processes(nvml: Any, handle: Any) -> list[GpuProcess]:
    try:
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return []
    out = []
    for p in procs:
        try:
            name = _text(nvml.nvmlSystemGetProcessName(p.pid))
        except Exception:
            name = "?"  # another PID namespace (a process in another container)
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), name, None if used is None else used / MIB))
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_query_gpu(text: str) -> list[GpuInfo]:
    """Parse `nvidia-smi --query-gpu=SMI_GPU_FIELDS --format=csv,noheader,nounits` (compute_cap optional)."""
    gpus = []
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 6 or not cols[0].isdigit():
            continue
        cc = None
        if len(cols) > 6 and "." in cols[6]:
            major, minor = cols[6].split(".", 1)
            cc = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
        gpus.append(
            GpuInfo(
                int(cols[0]),
                cols[1],
                cols[2],
                _number(cols[3]) or 0.0,
                _number(cols[4]) or 0.0,
                cols[5],
                cc,
                None,  # from the header of plain nvidia-smi, set by _from_smi
            )
        )
    return gpus


def parse_compute_apps(text: str) -> dict[str, list[GpuProcess]]:
    """Parse `nvidia-smi --query-compute-apps=SMI_APP_FIELDS --format=csv,noheader,nounits` by GPU UUID."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    for line in text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 4 or not cols[1].isdigit():
            continue  # "No running processes found" and the like
        by_uuid.setdefault(cols[0], []).append(GpuProcess(int(cols[1]), cols[2], _number(cols[3])))
    return by_uuid


def parse_cuda_version(header: str) -> str | None:
    """The "CUDA Version: 12.2" in plain `nvidia-smi` output."""
    marker = "CUDA Version:"
    if marker not in header:
        return None
    words = header.split(marker, 1)[1].split()
    return words[0] if words and words[0][0].isdigit() else None


_cuda_cache: dict[str, str | None] = {}  # driver version -> CUDA version: fixed while the driver is loaded


def _from_smi(run: Runner) -> Probe:
    rc, out = run(["nvidia-smi", f"--query-gpu={SMI_GPU_FIELDS}", "--format=csv,noheader,nounits"])
    if rc != 0 and "compute_cap" in out:  # drivers before 510 do not know the field
        rc, out = run(
            ["nvidia-smi", f"--query-gpu={SMI_GPU_FIELDS.rsplit(',', 1)[0]}", "--format=csv,noheader,nounits"]
        )
    if rc != 0:
        first = next((line.strip() for line in out.splitlines() if line.strip()), f"exit status {rc}")
        return Probe([], False, f"nvidia-smi: {first}")
    gpus = parse_query_gpu(out)
    if gpus:
        driver = gpus[0].driver_version
        if driver not in _cuda_cache:
            rc_h, header = run(["nvidia-smi"])
            _cuda_cache[driver] = parse_cuda_version(header) if rc_h == 0 else None
        rc_a, apps = run(["nvidia-smi", f"--query-compute-apps={SMI_APP_FIELDS}", "--format=csv,noheader,nounits"])
        procs = parse_compute_apps(apps) if rc_a == 0 else {}
        for g in gpus:
            g.cuda_driver_version = _cuda_cache[driver]
            g.processes = procs.get(g.uuid, [])
        return Probe(gpus, True, f"nvidia-smi: driver {driver}, CUDA {_cuda_cache[driver] or '?'}, {len(gpus)} GPU(s)")
    return Probe([], True, "nvidia-smi: driver loaded, no GPU listed")


def run_smi(args: Sequence[str]) -> tuple[int, str]:
    """The real nvidia-smi; a missing binary or a hang is an answer, not an exception."""
    if shutil.which(args[0]) is None:
        return 127, f"{args[0]} not found on PATH"
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return 1, str(exc)
    return done.returncode, done.stdout + done.stderr


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def probe(nvml: Any = "import", run: Runner | None = None) -> Probe:
    """Ask NVML (pynvml importable), else nvidia-smi. `nvml=None` forces nvidia-smi."""
    module = _import_pynvml() if nvml == "import" else nvml
    try:
        if module is not None:
            return _from_nvml(module)
        return _from_smi(run or run_smi)
    except Exception as exc:  # a driver quirk must never stop a training run
        return Probe([], False, f"GPU query failed: {type(exc).__name__}: {exc}")


def query_gpus() -> list[GpuInfo]:
    """Every GPU the driver shows, with memory and processes; [] without a driver."""
    return probe().gpus
