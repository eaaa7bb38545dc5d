"""`python -m train check`: is the GPU used, and if not, why not and what is the one fix.

Three steps, kept apart so the diagnosis is tested on any machine with faked inputs:
  collect()  -> Facts      the driver (train.gpuinfo), the CUDA/cuDNN libraries on disk, and a
                           TensorFlow probe run in a subprocess so its C++ log (stderr) is captured;
  diagnose(facts)          pure functions: a list of Diagnosis (code, severity, summary, fix);
  build_report(facts)      the report as a dict: printed as text, or as JSON with `--json`.
The parent process never imports TensorFlow; the probe is the only TensorFlow start (~3 s on a CPU).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from . import gpuinfo, hardware
from .errors import NoGPUError
from .gpuinfo import GpuInfo

# Minimum Linux driver per CUDA major (CUDA Toolkit release notes, table 3, "minor version
# compatibility"): any 12.x build runs on >= 525.60.13.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
PROBE_TIMEOUT_S = 180  # the first start of a new GPU can JIT-compile PTX for minutes; a CPU takes ~3 s
MATMUL = {"GPU": (4096, 20), "CPU": (1024, 3)}  # (n, repetitions) of an n x n float32 matmul
ENV_VARS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "LD_LIBRARY_PATH")
HIDE_VALUES = ("", "void", "none")  # NVIDIA_VISIBLE_DEVICES values that give a container no GPU
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


@dataclass
class Diagnosis:
    code: str
    severity: str  # info (nothing wrong for a CPU machine) | warning | error (a GPU is there but not used)
    summary: str
    fix: str
    details: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- TensorFlow's log, sorted

# Lines that explain why a GPU is not used; shown as they are.
_RELEVANT = re.compile(
    r"Could not load dynamic library|Cannot dlopen|dlerror|Loaded runtime CuDNN|CUDA driver version is insufficient"
    r"|Ignoring visible gpu device|cudaGetDevice\(\) failed|DNN library|no kernel image|failed to create cublas"
    r"|cannot be modified after being initialized|Could not load library|CUDA_ERROR_(?!NO_DEVICE)")
# Start-up noise, each kind explained in one line instead of shown raw.
_NOISE = (
    (re.compile(r"cuInit|CUDA_ERROR_NO_DEVICE|Could not find cuda drivers|kernel driver does not appear|"
                r"CUDA diagnostic information|hostname: |libcuda reported version|kernel reported version"),
     "cuInit: a CUDA build of TensorFlow looked for a GPU and found none (harmless on a machine without one)"),
    (re.compile(r"oneDNN custom operations|cpu_feature_guard|appropriate compiler flags|following instructions|"
                r"optimized to use available CPU"), "start-up notices about oneDNN and CPU instructions (informational)"),
    (re.compile(r"register cu\w+ factory|already been registered|computation placer|TensorRT|TF-TRT|absl::InitializeLog"),
     "plugin registration and optional TensorRT notices (harmless)"),
    (re.compile(r"NUMA node"), "NUMA information not readable in a VM or container (harmless)"),
)
_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] (?:\S+/)?)")


def classify_log(lines: list[str], driver_present: bool) -> tuple[list[str], dict[str, int]]:
    """(lines worth showing, {explanation: count} for the noise). cuInit lines matter when a driver is there."""
    shown, noise = [], {}
    for raw in lines:
        line = _PREFIX.sub("", raw.strip())
        if not line:
            continue
        if _RELEVANT.search(line) or (driver_present and "cuInit" in line):
            shown.append(line)
            continue
        why = next((text for pattern, text in _NOISE if pattern.search(line)), "other start-up messages")
        noise[why] = noise.get(why, 0) + 1
    return shown, noise


# ---------------------------------------------------------------- diagnoses (pure)

def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


def _major(text: Any) -> int | None:
    v = _version(str(text)) if text else ()
    return v[0] if v else None


def cuda_build(facts: Facts) -> bool:
    return bool(facts.tf.build.get("is_cuda_build"))


def _no_driver(facts: Facts) -> Diagnosis:
    nvd = facts.env.get("NVIDIA_VISIBLE_DEVICES")
    severity = "error" if facts.nvidia_pci_devices else "info"
    runtime_fix = ("start the container with `docker run --gpus all` (compose: a `deploy.resources.reservations."
                   "devices` entry with `capabilities: [gpu]`), the NVIDIA Container Toolkit installed on the host")
    if not facts.nvidia_pci_devices and facts.in_container:  # likely a CPU host: say so calmly
        runtime_fix = "none needed to train on the CPU; if the host has a GPU, " + runtime_fix
    if facts.in_container and nvd is None:
        return Diagnosis("no_driver", severity, "no NVIDIA driver visible: this container was started without GPUs "
                         "(NVIDIA_VISIBLE_DEVICES is not set, so the NVIDIA runtime added none)"
                         + ("" if facts.nvidia_pci_devices else "; no NVIDIA GPU is on the PCI bus either"), runtime_fix)
    if nvd is not None and nvd.strip().lower() in HIDE_VALUES:
        return Diagnosis("no_driver", severity, f"no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES={nvd!r} tells the "
                         "NVIDIA runtime to give this container no GPU",
                         "set NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), or start with `docker run --gpus all`")
    if facts.in_container:
        return Diagnosis("no_driver", severity, f"no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES={nvd!r} asks for "
                         "GPUs, but the container was not started with the NVIDIA runtime", runtime_fix)
    if facts.nvidia_pci_devices:
        return Diagnosis("no_driver", "error", f"an NVIDIA GPU is on the PCI bus but no driver is loaded "
                         f"({facts.driver_reason})", "install the NVIDIA driver (then `nvidia-smi` must list the GPU)")
    return Diagnosis("no_driver", "info", "no NVIDIA GPU or driver on this machine: TensorFlow runs on the CPU",
                     "none needed to train on the CPU; for a GPU, run on a machine (or cloud instance) that has one")


def _driver_too_old(facts: Facts) -> Diagnosis | None:
    need_cuda = facts.tf.build.get("cuda_version")
    major = _major(need_cuda)
    if not (facts.gpus and major in MIN_DRIVER):
        return None
    g = facts.gpus[0]
    old = _version(g.driver_version) < _version(MIN_DRIVER[major])
    if g.cuda_driver_version and _major(g.cuda_driver_version) is not None:
        old = old or _major(g.cuda_driver_version) < major
    if not old:
        return None
    return Diagnosis("driver_too_old", "error",
                     f"NVIDIA driver {g.driver_version} (supports CUDA up to {g.cuda_driver_version or '?'}) is too old "
                     f"for this TensorFlow build, which needs CUDA {need_cuda}: CUDA {major}.x needs driver >= "
                     f"{MIN_DRIVER[major]}",
                     f"upgrade the host's NVIDIA driver to {MIN_DRIVER[major]} or newer (a container uses the host's driver)")


def _libraries(facts: Facts) -> list[Diagnosis]:
    out = []
    fix = f'pip install "tensorflow[and-cuda]=={facts.tf.version}" (brings the CUDA and cuDNN wheels the build expects)'
    for lib in facts.libraries:
        if lib.path is None:
            code = "library_wrong_major" if lib.others else "library_missing"
            found = ", ".join(lib.others) if lib.others else "nothing"
            out.append(Diagnosis(code, "error", f"{lib.library}: {lib.expected} not found (found: {found}); this "
                                 f"TensorFlow build expects {lib.expected}", fix, [lib.error] if lib.error else []))
        elif lib.library == "cudnn" and lib.version:
            built = str(facts.tf.build.get("cudnn_version", ""))
            if len(_version(built)) >= 2 and _version(lib.version)[:2] < _version(built)[:2]:
                out.append(Diagnosis("library_wrong_version", "error", f"cudnn: {lib.path} is version {lib.version}; "
                                     f"this build was compiled with cuDNN {built} and needs that minor or newer", fix))
    return out


def _not_visible_to_tf(facts: Facts, shown: list[str], explained: bool) -> Diagnosis | None:
    seen, present = len(facts.tf.gpus), len(facts.gpus)
    if not present or seen >= present or not cuda_build(facts):
        return None
    cvd = facts.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        if seen == 0 and cvd.strip() in ("", "-1"):
            return Diagnosis("gpu_hidden", "error", f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU from TensorFlow",
                             "unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices to use, e.g. 0)")
        if seen:
            return None  # a deliberate subset
    fix = "fix the problem(s) above" if explained else (
        f'pip install "tensorflow[and-cuda]=={facts.tf.version}" and check the library errors listed')
    if any("Ignoring visible gpu device" in line for line in shown):
        fix = "use a GPU with the compute capability the build supports (see the line above), or a build that supports it"
    severity = "error" if seen == 0 else "warning"
    return Diagnosis("gpu_not_visible_to_tf", severity, f"the driver shows {present} GPU(s) but TensorFlow sees {seen}",
                     fix, shown or ["TensorFlow logged no library-loading error"])


def _memory_growth(facts: Facts) -> Diagnosis | None:
    mg = facts.tf.memory_growth
    if not (mg.get("error") and "after being initialized" in mg["error"]):
        return None
    return Diagnosis("memory_growth_too_late", "error",
                     f"{mg.get('late_call') or 'set_memory_growth'} came too late: the GPU had already been initialised "
                     f"(\"{mg['error']}\")",
                     "call tf.config.experimental.set_memory_growth before anything touches the GPU (the first tensor, "
                     "model or tf.config.list_logical_devices()); here train.devices does it before building the model")


def _memory_held(facts: Facts, own_pids: set[int]) -> list[Diagnosis]:
    out = []
    for g in facts.gpus:
        others = [p for p in g.processes if p.pid not in own_pids]
        unlisted = g.memory_used_mb - sum(p.used_memory_mb or 0 for p in others)
        if not others and unlisted < max(1024.0, 0.05 * g.memory_total_mb):
            continue
        held = f"{g.memory_used_mb / 1024:.1f} of {g.memory_total_mb / 1024:.1f} GiB"
        details = [f"pid {p.pid} {p.name}: " + (f"{p.used_memory_mb / 1024:.1f} GiB" if p.used_memory_mb is not None
                                                 else "amount not reported") for p in others]
        if not others:
            details = ["no process listed: held by processes outside this container or PID namespace"]
        fix = (f"stop them (kill {' '.join(str(p.pid) for p in others)})" if others else "free it on the host") + (
            " or pick a free GPU with CUDA_VISIBLE_DEVICES=<index>")
        out.append(Diagnosis("memory_held_by_others", "warning",
                             f"GPU {g.index} ({g.name}): {held} already held by other processes", fix, details))
    return out


def diagnose(facts: Facts, own_pids: set[int] | None = None) -> list[Diagnosis]:
    """Every problem found, root causes first. Pure: reads only `facts`."""
    tf, diags = facts.tf, []
    if tf.version is None:
        return [Diagnosis("tensorflow_unavailable", "error", f"TensorFlow could not be started: {tf.error}",
                          "install the locked requirements (`pip install -r requirements.lock`) and rerun",
                          classify_log(tf.log, facts.driver_present)[0] or tf.log[-5:])]
    if not facts.driver_present:
        diags.append(_no_driver(facts))
    if not cuda_build(facts):
        gpu_here = bool(facts.gpus)
        diags.append(Diagnosis("cpu_only_build", "error" if gpu_here else "info",
                               f"TensorFlow {tf.version} is a CPU-only build"
                               + (" but this machine has a GPU" if gpu_here else " (right for this machine)"),
                               f'pip install "tensorflow[and-cuda]=={tf.version}" (instead of tensorflow-cpu)'
                               if gpu_here else "none needed on a CPU machine"))
    else:
        too_old = _driver_too_old(facts)
        diags += [too_old] if too_old else []
        diags += _libraries(facts)
    shown, _ = classify_log(tf.log, facts.driver_present)
    explained = any(d.severity == "error" for d in diags)
    diags += [d for d in (_not_visible_to_tf(facts, shown, explained), _memory_growth(facts)) if d]
    diags += _memory_held(facts, own_pids or set())
    return diags


def precisions(facts: Facts) -> dict[str, Any]:
    """Which precisions make sense on the devices TensorFlow will use, and what `auto` picks (train.hardware)."""
    ccs = [tuple(g["compute_capability"]) for g in facts.tf.gpus if g.get("compute_capability")]
    if facts.tf.gpus:
        cc = min(ccs) if ccs else None
        ok16 = bool(cc and cc >= hardware.FP16_MIN_CC)
        okbf = bool(cc and cc >= hardware.BF16_MIN_CC)
        where = f"GPU compute capability {cc[0]}.{cc[1]}" if cc else "GPU compute capability unknown"
        options = {"float32": (True, "always correct"),
                   "mixed_float16": (ok16, f"{where} {'>=' if ok16 else '<'} 7.0 (float16 tensor cores)"),
                   "mixed_bfloat16": (okbf, f"{where} {'>=' if okbf else '<'} 8.0 (bfloat16 tensor cores)")}
    else:
        native = ", ".join(facts.cpu_bf16)
        options = {"float32": (True, "always correct"),
                   "mixed_float16": (False, "CPUs have no fast float16 matmuls: slower than float32"),
                   "mixed_bfloat16": (bool(native), f"CPU has native bfloat16 ({native})" if native
                                      else "CPU has no amx_bf16/avx512_bf16: bfloat16 would be emulated, slower")}
    auto, reason = hardware.choose_precision("auto", ccs, facts.cpu_bf16)
    return {"options": {k: {"sensible": ok, "why": why} for k, (ok, why) in options.items()},
            "auto": auto, "auto_reason": reason}


# ---------------------------------------------------------------- report

JSON_FIELDS = {
    "verdict": "{status: gpu | cpu | gpu_not_used | no_tensorflow, line, usable_gpus}",
    "exit_code": "0, or 1 with --require-gpu and no usable GPU (or when TensorFlow cannot start)",
    "tensorflow": "{version, error, build: tf.sysconfig.get_build_info(), gpus: [{name, device_name, compute_capability}]}",
    "libraries": "[{library, expected, path, version, others, error}]: CUDA/cuDNN the build needs, as found on disk",
    "driver": "{present, reason, version, cuda_version}",
    "gpus": "[{index, name, uuid, memory_total_mb, memory_used_mb, driver_version, compute_capability, "
            "cuda_driver_version, processes: [{pid, name, used_memory_mb}]}] as the driver reports them",
    "memory_growth": "{in_effect, error, late_call}",
    "matmul": "[{device, n, seconds, gflops} or {device, error}]",
    "gpu_speedup": "best GPU GFLOP/s divided by CPU GFLOP/s, or null",
    "precision": "{options: {float32|mixed_float16|mixed_bfloat16: {sensible, why}}, auto, auto_reason}",
    "diagnoses": "[{code, severity: info | warning | error, summary, fix, details}]",
    "tf_log": "{shown: lines that explain a failure, noise: {explanation: count}}",
    "environment": "{in_container, nvidia_pci_devices, cpu_bf16, NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, ...}",
    "seconds": "how long the TensorFlow probe took",
}


def verdict(facts: Facts, diags: list[Diagnosis], speedup: float | None, auto: str) -> dict[str, Any]:
    usable = len(facts.tf.gpus) if cuda_build(facts) else 0
    errors = [d for d in diags if d.severity == "error"]
    warnings = sum(d.severity == "warning" for d in diags)
    tail = f"; {warnings} warning(s) below" if warnings else ""
    if facts.tf.version is None:
        status, line = "no_tensorflow", f"TensorFlow cannot start: {errors[0].summary}. Fix: {errors[0].fix}"
    elif usable:
        names = ", ".join(sorted({g.get("device_name") or g["name"] for g in facts.tf.gpus}))
        fast = f"; matmul {speedup:.0f}x the CPU" if speedup else ""
        status, line = "gpu", f"GPU ready: TensorFlow uses {usable} GPU(s) ({names}){fast}; precision auto -> {auto}{tail}"
    elif errors:
        status, line = "gpu_not_used", (f"GPU NOT USED, training would run on the CPU: {errors[0].summary}. "
                                        f"Fix: {errors[0].fix}")
    else:
        status, line = "cpu", f"running on CPU: no GPU here, and nothing is wrong; precision auto -> {auto}{tail}"
    return {"status": status, "line": line, "usable_gpus": usable}


def build_report(facts: Facts, require_gpu: bool = False, own_pids: set[int] | None = None) -> dict[str, Any]:
    diags = diagnose(facts, own_pids)
    prec = precisions(facts)
    cpu = [m["gflops"] for m in facts.tf.matmul if "CPU" in m["device"] and m.get("gflops")]
    gpu = [m["gflops"] for m in facts.tf.matmul if "GPU" in m["device"] and m.get("gflops")]
    speedup = max(gpu) / cpu[0] if cpu and gpu else None
    v = verdict(facts, diags, speedup, prec["auto"])
    shown, noise = classify_log(facts.tf.log, facts.driver_present)
    exit_code = 1 if v["status"] == "no_tensorflow" or (require_gpu and not v["usable_gpus"]) else 0
    g0 = facts.gpus[0] if facts.gpus else None
    return {
        "verdict": v, "exit_code": exit_code,
        "tensorflow": {"version": facts.tf.version, "error": facts.tf.error, "build": facts.tf.build, "gpus": facts.tf.gpus},
        "libraries": [asdict(lib) for lib in facts.libraries],
        "driver": {"present": facts.driver_present, "reason": facts.driver_reason,
                   "version": g0.driver_version if g0 else None, "cuda_version": g0.cuda_driver_version if g0 else None},
        "gpus": [asdict(g) for g in facts.gpus],
        "memory_growth": facts.tf.memory_growth, "matmul": facts.tf.matmul,
        "gpu_speedup": round(speedup, 1) if speedup else None, "precision": prec,
        "diagnoses": [asdict(d) for d in diags], "tf_log": {"shown": shown, "noise": noise},
        "environment": {"in_container": facts.in_container, "nvidia_pci_devices": facts.nvidia_pci_devices,
                        "cpu_bf16": facts.cpu_bf16, **facts.env},
        "seconds": round(facts.tf.seconds, 2),
    }


def format_report(r: dict[str, Any]) -> str:
    tf, build = r["tensorflow"], r["tensorflow"]["build"]
    lines = ["TensorFlow GPU check"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<14} {text}")

    if build.get("is_cuda_build"):
        ccs = build.get("cuda_compute_capabilities") or []
        row("TensorFlow", f"{tf['version']}, built for CUDA {build.get('cuda_version')}, cuDNN "
            f"{build.get('cudnn_version')}, compute capabilities {', '.join(map(str, ccs)) or '?'}")
        for lib in r["libraries"]:
            found = f"{lib['path']} ({lib['version'] or 'version unknown'})" if lib["path"] else "NOT FOUND"
            row("  " + lib["library"], f"{lib['expected']}: {found}" + (f"; also {', '.join(lib['others'])}" if lib["others"] else ""))
    else:
        row("TensorFlow", f"{tf['version'] or 'not available'}, CPU-only build (no CUDA libraries needed)")
    d = r["driver"]
    row("Driver", f"{d['version']}, CUDA up to {d['cuda_version'] or '?'}" if d["present"] and d["version"] else
        f"none ({d['reason']})")
    for g in r["gpus"]:
        cc = ".".join(map(str, g["compute_capability"])) if g["compute_capability"] else "?"
        row(f"GPU {g['index']}", f"{g['name']}, {g['memory_used_mb']:.0f} of {g['memory_total_mb']:.0f} MiB used, "
            f"compute capability {cc}")
        for p in g["processes"]:
            used = f"{p['used_memory_mb']:.0f} MiB" if p["used_memory_mb"] is not None else "? MiB"
            row("", f"process {p['pid']} {p['name']}: {used}")
    row("TF sees", ", ".join(g["name"] for g in tf["gpus"]) or "no GPU (runs on the CPU)")
    mg = r["memory_growth"]
    if tf["gpus"] or mg.get("error"):
        row("Memory growth", "on for every GPU" if mg.get("in_effect") else f"NOT in effect {mg.get('error') or ''}")
    for m in r["matmul"]:
        row("Matmul", f"{m['device']}: " + (f"{m['n']}x{m['n']} float32 in {m['seconds'] * 1e3:.1f} ms, "
                                             f"{m['gflops']:.0f} GFLOP/s" if "error" not in m else f"failed: {m['error']}"))
    if r["gpu_speedup"]:
        row("", f"GPU / CPU throughput: {r['gpu_speedup']}x")
    p = r["precision"]
    row("Precision", "; ".join(f"{k} {'yes' if v['sensible'] else 'no'}" for k, v in p["options"].items())
        + f"; auto -> {p['auto']} ({p['auto_reason']})")
    noise = r["tf_log"]["noise"]
    if noise:
        row("TF log", f"{sum(noise.values())} start-up line(s) captured, not errors: " + "; ".join(noise))
    for line in r["tf_log"]["shown"]:
        row("TF log !", line)
    if r["diagnoses"]:
        lines.append("Diagnoses")
    for dg in r["diagnoses"]:
        lines.append(f"  [{dg['severity']}] {dg['summary']}")
        lines += [f"      {x}" for x in dg["details"]]
        lines.append(f"      fix: {dg['fix']}")
    lines.append(f"VERDICT: {r['verdict']['line']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- collection (reads the machine)

def in_container(root: Path = Path("/")) -> bool:
    if (root / ".dockerenv").exists() or (root / "run/.containerenv").exists():
        return True
    try:
        return bool(re.search(r"docker|kubepods|containerd|libpod", (root / "proc/1/cgroup").read_text()))
    except OSError:
        return False


def nvidia_pci_devices(sysfs: Path = Path("/sys/bus/pci/devices")) -> int:
    """NVIDIA (vendor 0x10de) display or 3D controllers: a GPU is there even when no driver is."""
    count = 0
    for dev in sysfs.glob("*"):
        try:
            if (dev / "vendor").read_text().strip() == "0x10de" and (dev / "class").read_text().startswith("0x03"):
                count += 1
        except OSError:
            continue
    return count


def library_dirs(environ: Mapping[str, str]) -> list[Path]:
    """pip's nvidia-* wheels (what tensorflow[and-cuda] uses), LD_LIBRARY_PATH, then the usual system places."""
    dirs = [d for p in sys.path if p.endswith(("site-packages", "dist-packages")) for d in sorted(Path(p).glob("nvidia/*/lib"))]
    dirs += [Path(p) for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    dirs += [Path(p) for p in ("/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                               "/usr/lib64", "/usr/local/lib")]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


def _library_version(lib: ctypes.CDLL, name: str) -> str | None:
    value = ctypes.c_int()
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
    wanted = [("cudart", cuda), ("cublas", cuda)] + ([("cudnn", cudnn)] if cudnn else [])
    return [find_library(name, major, dirs) for name, major in wanted]


def _bench(tf: Any, device: str, n: int, reps: int) -> dict[str, Any]:
    try:
        with tf.device(device):
            a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
            float(tf.reduce_sum(tf.matmul(a, b)))  # warm-up: kernels, cuBLAS handle
            start = time.perf_counter()
            for _ in range(reps):
                c = tf.matmul(a, b)
            float(tf.reduce_sum(c))  # waits for the GPU stream
            seconds = (time.perf_counter() - start) / reps
        return {"device": device, "n": n, "seconds": round(seconds, 6), "gflops": round(2 * n**3 / seconds / 1e9, 1)}
    except Exception as exc:  # the failure is the finding
        return {"device": device, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def probe_main(skip_matmul: bool) -> None:
    """Run in the probe subprocess: start TensorFlow the way training does and print what happened."""
    out: dict[str, Any] = {}
    try:
        import tensorflow as tf
    except Exception as exc:
        print(_MARK + json.dumps({"error": f"import tensorflow failed: {type(exc).__name__}: {exc}"}), flush=True)
        return
    out["version"] = tf.__version__
    out["build"] = {k: v if isinstance(v, (str, int, float, bool)) else str(v)
                    for k, v in tf.sysconfig.get_build_info().items()}
    gpus = tf.config.list_physical_devices("GPU")
    mg: dict[str, Any] = {"in_effect": None, "error": None, "late_call": None}
    for g in gpus:  # before any op, as train.devices does
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
        out["gpus"].append({"name": g.name, "device_name": details.get("device_name"),
                            "compute_capability": details.get("compute_capability")})
    out["matmul"] = [] if skip_matmul else [
        _bench(tf, f"/GPU:{i}", *MATMUL["GPU"]) for i in range(len(gpus))] + [_bench(tf, "/CPU:0", *MATMUL["CPU"])]
    print(_MARK + json.dumps(out), flush=True)


def run_probe(skip_matmul: bool, timeout: float = PROBE_TIMEOUT_S) -> TfFacts:
    """Start TensorFlow in a subprocess: its C++ log goes to a stderr we read, not to the user's terminal."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}  # every line, so library errors cannot be hidden
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r}); "
            f"from train.check import probe_main; probe_main({skip_matmul!r})")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return TfFacts(error=f"the TensorFlow probe did not finish in {timeout:.0f} s", log=err.splitlines(),
                       seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    log = done.stderr.splitlines()
    payload = next((line[len(_MARK):] for line in done.stdout.splitlines() if line.startswith(_MARK)), None)
    if payload is None:
        return TfFacts(error=f"the TensorFlow probe exited with status {done.returncode} before reporting",
                       log=log, seconds=seconds)
    data = json.loads(payload)
    return TfFacts(**{k: v for k, v in data.items() if k in TfFacts.__dataclass_fields__}, log=log, seconds=seconds)


def collect(skip_matmul: bool = False, environ: Mapping[str, str] | None = None) -> Facts:
    environ = os.environ if environ is None else environ
    g = gpuinfo.probe()  # before the probe starts, so every process listed is someone else's
    tf = run_probe(skip_matmul)
    return Facts(tf=tf, driver_present=g.driver_present, driver_reason=g.reason, gpus=g.gpus,
                 libraries=collect_libraries(tf.build, environ), env={k: environ.get(k) for k in ENV_VARS},
                 in_container=in_container(), nvidia_pci_devices=nvidia_pci_devices(),
                 cpu_bf16=hardware.cpu_bf16(hardware.cpu_flags()))


def main(json_output: bool = False, require_gpu: bool = False, skip_matmul: bool = False) -> int:
    """Print the report; exit 0, or NoGPUError (exit 1) with --require-gpu and no usable GPU."""
    report = build_report(collect(skip_matmul), require_gpu, own_pids={os.getpid()})
    print(json.dumps(report, indent=2) if json_output else format_report(report), flush=True)
    if require_gpu and not report["verdict"]["usable_gpus"]:
        d = next((d for d in report["diagnoses"] if d["severity"] == "error"), None) or (report["diagnoses"] or [None])[0]
        why = f"{d['summary']}. Fix: {d['fix']}" if d else report["verdict"]["line"]
        raise NoGPUError(f"--require-gpu: no usable GPU: {why}")
    return report["exit_code"]
