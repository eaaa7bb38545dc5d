"""Facts for `python -m train check`: what the machine and TensorFlow say, collected as data.

`collect()` reads the driver (gpuinfo.py), the CUDA/cuDNN libraries on disk and the environment,
and starts TensorFlow in a subprocess (`run_probe` -> `probe_main`) so its C++ log (stderr) is
captured. The parent process never imports TensorFlow; the probe is the only TensorFlow start
(~3 s on a CPU). diagnose.py reads the resulting `Facts`; check.py reports on them.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..setup import hardware
from . import gpuinfo
from .gpuinfo import GpuInfo

PROBE_TIMEOUT_S = 180  # the first start of a new GPU can JIT-compile PTX for minutes; a CPU takes ~3 s
MATMUL = {"GPU": (4096, 20), "CPU": (1024, 3)}  # (n, repetitions) of an n x n float32 matmul
ENV_VARS = (
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_VISIBLE_DEVICES",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "LD_LIBRARY_PATH",
)
_MARK = "@@train-check@@"


@dataclass
class LibFact:
    library: str  # "cudnn"
    expected: str  # soname the build needs, e.g. "libcudnn.so.9"
    path: str | None = None  # where the expected library was found (None: missing)
    version: str | None = None  # as the library reports it, e.g. "9.3.0"
    others: list[str] = field(default_factory=list)  # same library, other major versions
    error: str | None = None  # dlopen error when it could not be loaded


@dataclass
class TfFacts:
    version: str | None = None
    error: str | None = None  # import failed, probe crashed or timed out
    build: dict = field(default_factory=dict)  # tf.sysconfig.get_build_info()
    gpus: list[dict] = field(default_factory=list)  # {"name", "device_name", "compute_capability"}
    memory_growth: dict = field(default_factory=dict)  # {"in_effect", "error", "late_call"}
    matmul: list[dict] = field(default_factory=list)  # {"device", "n", "seconds", "gflops"} or {"device", "error"}
    bf16_speedup: float | None = None  # a CPU with native bfloat16: PRECISION=auto's probe (train.setup.hardware)
    bf16_probe_error: str | None = None  # that probe's error, when it could not run (auto then picks float32)
    onednn: str | None = None  # whether the CPU's kernels are oneDNN's, and why (the record a run writes)
    log: list[str] = field(default_factory=list)  # TensorFlow's C++ log lines (stderr of the probe)
    seconds: float = 0.0


@dataclass
class Facts:
    tf: TfFacts
    driver_present: bool = False
    driver_reason: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)
    libraries: list[LibFact] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    in_container: bool = False
    nvidia_pci_devices: int = 0  # NVIDIA display/3D controllers on the PCI bus, driver or not
    cpu_bf16: list[str] = field(default_factory=list)


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


def _major(text: Any) -> int | None:
    v = _version(str(text)) if text else ()
    return v[0] if v else None


# ---------------------------------------------------------------- collection (reads the machine)


def nvidia_pci_devices() -> int:
    """NVIDIA (vendor 0x10de) display or 3D controllers: a GPU is there even when no driver is."""
    count = 0
    for dev in Path("/sys/bus/pci/devices").glob("*"):
        try:
            if (dev / "vendor").read_text().strip() == "0x10de" and (dev / "class").read_text().startswith("0x03"):
                count += 1
        except OSError:
            continue
    return count


def library_dirs(environ: Mapping[str, str]) -> list[Path]:
    """pip's nvidia-* wheels (what tensorflow[and-cuda] uses), LD_LIBRARY_PATH, then the usual system places."""
    dirs = [
        d
        for p in sys.path
        if p.endswith(("site-packages", "dist-packages"))
        for d in sorted(Path(p).glob("nvidia/*/lib"))
    ]
    dirs += [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [
        Path(p)
        for p in (
            "/usr/local/cuda/lib64",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/local/lib",
        )
    ]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


def _library_version(lib: ctypes.CDLL, name: str) -> str | None:
    value = ctypes.c_int()
    if name == "cuda" and lib.cuDriverGetVersion(ctypes.byref(value)) == 0:
        return f"{value.value // 1000}.{value.value % 1000 // 10}"
    if name == "cudart" and lib.cudaRuntimeGetVersion(ctypes.byref(value)) == 0:
        return f"{value.value // 1000}.{value.value % 1000 // 10}"
    if name == "cudnn":
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        v = int(lib.cudnnGetVersion())
        major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    if name == "cublas":
        parts = []
        for prop in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            if lib.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            parts.append(str(value.value))
        return ".".join(parts)
    return None


def find_library(name: str, major: int, dirs: list[Path]) -> LibFact:
    soname = f"lib{name}.so.{major}"
    fact = LibFact(name, soname)
    for d in dirs:
        for f in sorted(d.glob(f"lib{name}.so.*")):
            if f.name == soname and fact.path is None:
                fact.path = str(f)
            elif _major(f.name.split(".so.", 1)[1]) != major and str(f) not in fact.others:
                fact.others.append(str(f))
    if fact.path:  # the file the soname links to is the same library (libcuda.so.1 -> libcuda.so.535.129.03)
        fact.others = [o for o in fact.others if Path(o).resolve() != Path(fact.path).resolve()]
    try:  # the loader's answer: the path found above, or the ldconfig cache
        fact.version = _library_version(ctypes.CDLL(fact.path or soname), name)
        fact.path = fact.path or f"{soname} (loader cache)"
    except (OSError, AttributeError) as exc:
        fact.error = str(exc) if fact.path else None
    return fact


def collect_libraries(build: Mapping[str, Any], environ: Mapping[str, str]) -> list[LibFact]:
    cuda, cudnn = _major(build.get("cuda_version")), _major(build.get("cudnn_version"))
    if not build.get("is_cuda_build") or cuda is None:
        return []
    dirs = library_dirs(environ)
    # libcuda.so.1 is the driver's own (never a pip wheel's): a container given only the `utility`
    # capability has nvidia-smi and NVML but not it, and TensorFlow then sees no GPU.
    wanted = [("cuda", 1), ("cudart", cuda), ("cublas", cuda)] + ([("cudnn", cudnn)] if cudnn else [])
    return [find_library(name, major, dirs) for name, major in wanted]


def _bench(device: str, n: int, reps: int) -> dict[str, Any]:
    """The float32 matmul probe every run also makes for its MFU (train.training.flops), on one device."""
    from ..setup.hardware import measure_peak_flops

    try:
        flops = measure_peak_flops("float32", device, n, reps)
        return {"device": device, "n": n, "seconds": round(2 * n**3 / flops, 6), "gflops": round(flops / 1e9, 1)}
    except Exception as exc:  # the failure is the finding
        return {"device": device, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def probe_main(skip_matmul: bool) -> None:
    """Run in the probe subprocess: start TensorFlow the way training does and print what happened."""
    out: dict[str, Any] = {}
    hardware.turn_on_onednn()  # as train() does before its import: the kernels a run gets, measured
    try:
        import tensorflow as tf
    except Exception as exc:
        print(_MARK + json.dumps({"error": f"import tensorflow failed: {type(exc).__name__}: {exc}"}), flush=True)
        return
    out["version"] = tf.__version__
    out["onednn"] = hardware.onednn_state()
    out["build"] = {
        k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in tf.sysconfig.get_build_info().items()
    }
    gpus = tf.config.list_physical_devices("GPU")
    mg: dict[str, Any] = {"in_effect": None, "error": None, "late_call": None}
    for g in gpus:  # before any op, as train.setup.devices does
        try:
            tf.config.experimental.set_memory_growth(g, True)
        except RuntimeError as exc:
            mg.update(error=str(exc), late_call=f"tf.config.experimental.set_memory_growth({g.name!r}, True)")
            break
    if gpus:
        mg["in_effect"] = all(tf.config.experimental.get_memory_growth(g) for g in gpus)
    out["memory_growth"] = mg
    out["gpus"] = []
    for g in gpus:
        try:
            details = tf.config.experimental.get_device_details(g)
        except Exception:  # not every platform reports details; the driver's compute capability still stands
            details = {}
        out["gpus"].append(
            {
                "name": g.name,
                "device_name": details.get("device_name"),
                "compute_capability": details.get("compute_capability"),
            }
        )
    out["matmul"] = (
        []
        if skip_matmul
        else [_bench(f"/GPU:{i}", *MATMUL["GPU"]) for i in range(len(gpus))] + [_bench("/CPU:0", *MATMUL["CPU"])]
    )
    if not skip_matmul and not gpus and hardware.cpu_bf16(hardware.cpu_flags()):
        try:  # what a training run measures once per machine to choose its precision
            out["bf16_speedup"] = round(hardware.measure_bf16_speedup(), 3)
        except Exception as exc:  # as a run's probe: float32, and the reason names the error
            out["bf16_probe_error"] = f"{type(exc).__name__}: {first_line(exc, None)}"
    print(_MARK + json.dumps(out), flush=True)


def run_probe(skip_matmul: bool, timeout: float = PROBE_TIMEOUT_S) -> TfFacts:
    """Start TensorFlow in a subprocess: its C++ log goes to a stderr we read, not to the user's terminal."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}  # every line, so library errors cannot be hidden
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
        f"from train.gpucheck.facts import probe_main; probe_main({skip_matmul!r}); "
        "import gc; gc.freeze()"  # the facts are printed: skip shutdown's collection of TensorFlow's objects
    )
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return TfFacts(
            error=f"the TensorFlow probe did not finish in {timeout:.0f} s",
            log=err.splitlines(),
            seconds=time.perf_counter() - start,
        )
    seconds = time.perf_counter() - start
    log = done.stderr.splitlines()
    payload = next((line[len(_MARK) :] for line in done.stdout.splitlines() if line.startswith(_MARK)), None)
    if payload is None:
        return TfFacts(
            error=f"the TensorFlow probe exited with status {done.returncode} before reporting",
            log=log,
            seconds=seconds,
        )
    data = json.loads(payload)
    return TfFacts(**{k: v for k, v in data.items() if k in TfFacts.__dataclass_fields__}, log=log, seconds=seconds)


def collect(skip_matmul: bool = False) -> Facts:
    g = gpuinfo.probe()  # before the probe starts, so every process listed is someone else's
    tf = run_probe(skip_matmul)
    return Facts(
        tf=tf,
        driver_present=g.driver_present,
        driver_reason=g.reason,
        gpus=g.gpus,
        libraries=collect_libraries(tf.build, os.environ),
        env={k: os.environ.get(k) for k in ENV_VARS},
        in_container=hardware.in_container(orchestrated=True),
        nvidia_pci_devices=nvidia_pci_devices(),
        cpu_bf16=hardware.cpu_bf16(hardware.cpu_flags()),
    )
