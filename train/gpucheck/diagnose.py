"""The diagnoses of `python -m train check`: pure functions over a `Facts` (train.gpucheck.facts).

`diagnose(facts)` returns every problem found, root causes first, as a list of Diagnosis (code,
severity, summary, fix). Nothing here reads the machine, so every case is tested with faked facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .facts import Facts, _major, _version
from .gpuinfo import GpuInfo
from .tflog import classify_log

# How a fix begins where the CPU is a fine place to train: --require-gpu, which asks for a GPU, leaves it out.
CPU_IS_FINE = "none needed to train on the CPU; "

# Minimum Linux driver per CUDA major (CUDA Toolkit release notes, table 3, "minor version
# compatibility"): any 12.x build runs on >= 525.60.13.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
HIDE_VALUES = ("", "void", "none")  # NVIDIA_VISIBLE_DEVICES values that give a container no GPU
GIVE_GPUS = "set NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), or start with `docker run --gpus all`"
# Errors that leave TensorFlow listing a GPU it cannot run a kernel on: the verdict counts none usable.
GPU_BLOCKING = {"driver_too_old_for_ptx"}
_PTX_ERROR = re.compile(r"UNSUPPORTED_PTX_VERSION|PTX was compiled with an unsupported toolchain", re.I)


@dataclass
class Diagnosis:
    code: str
    severity: str  # info (nothing wrong for a CPU machine) | warning | error (a GPU is there but not used)
    summary: str
    fix: str
    details: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- diagnoses (pure)


def cuda_build(facts: Facts) -> bool:
    return bool(facts.tf.build.get("is_cuda_build"))


def _no_driver(facts: Facts) -> Diagnosis:
    nvd = facts.env.get("NVIDIA_VISIBLE_DEVICES")
    severity = "error" if facts.nvidia_pci_devices else "info"
    runtime_fix = (
        "start the container with `docker run --gpus all` (compose: a `deploy.resources.reservations."
        "devices` entry with `capabilities: [gpu]`), the NVIDIA Container Toolkit installed on the host"
    )
    if not facts.nvidia_pci_devices and facts.in_container:  # likely a CPU host: say so calmly
        runtime_fix = CPU_IS_FINE + "if the host has a GPU, " + runtime_fix
    if facts.in_container and nvd is None:
        return Diagnosis(
            "no_driver",
            severity,
            "no NVIDIA driver visible: this container was started without GPUs "
            "(NVIDIA_VISIBLE_DEVICES is not set, so the NVIDIA runtime added none)"
            + ("" if facts.nvidia_pci_devices else "; no NVIDIA GPU is on the PCI bus either"),
            runtime_fix,
        )
    if nvd is not None and nvd.strip().lower() in HIDE_VALUES:
        return Diagnosis(
            "no_driver",
            severity,
            f"no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES={nvd!r} tells the "
            "NVIDIA runtime to give this container no GPU",
            GIVE_GPUS,
        )
    if facts.in_container:
        return Diagnosis(
            "no_driver",
            severity,
            f"no NVIDIA driver visible: NVIDIA_VISIBLE_DEVICES={nvd!r} asks for "
            "GPUs, but the container was not started with the NVIDIA runtime",
            runtime_fix,
        )
    if facts.nvidia_pci_devices:
        return Diagnosis(
            "no_driver",
            "error",
            f"an NVIDIA GPU is on the PCI bus but no driver is loaded ({facts.driver_reason})",
            "install the NVIDIA driver (then `nvidia-smi` must list the GPU)",
        )
    return Diagnosis(
        "no_driver",
        "info",
        "no NVIDIA GPU or driver on this machine: TensorFlow runs on the CPU",
        CPU_IS_FINE + "for a GPU, run on a machine (or cloud instance) that has one",
    )


def _no_gpu_given(facts: Facts) -> Diagnosis | None:
    """NVIDIA_VISIBLE_DEVICES=none: the NVIDIA runtime mounts the driver (nvidia-smi answers) but no GPU."""
    nvd = facts.env.get("NVIDIA_VISIBLE_DEVICES")
    if facts.gpus or nvd is None or nvd.strip().lower() not in HIDE_VALUES:
        return None
    return Diagnosis(
        "no_driver",
        "error" if facts.nvidia_pci_devices else "info",
        f"no GPU in this container: NVIDIA_VISIBLE_DEVICES={nvd!r} tells the NVIDIA runtime to mount the "
        "driver but give it no GPU",
        ("" if facts.nvidia_pci_devices else CPU_IS_FINE) + GIVE_GPUS,
    )


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
    return Diagnosis(
        "driver_too_old",
        "error",
        f"NVIDIA driver {g.driver_version} (supports CUDA up to {g.cuda_driver_version or '?'}) is too old "
        f"for this TensorFlow build, which needs CUDA {need_cuda}: CUDA {major}.x needs driver >= "
        f"{MIN_DRIVER[major]}",
        f"upgrade the host's NVIDIA driver to {MIN_DRIVER[major]} or newer (a container uses the host's driver)",
    )


def _archs(build: dict, prefix: str) -> list[tuple[int, int]]:
    """("sm_89", "compute_90") in the build info -> [(8, 9)] for prefix "sm", [(9, 0)] for "compute"."""
    found = (re.fullmatch(prefix + r"_(\d+)(\d)a?", str(arch)) for arch in build.get("cuda_compute_capabilities") or [])
    return [(int(m.group(1)), int(m.group(2))) for m in found if m]


def needs_ptx(build: dict, cc: tuple[int, int]) -> bool:
    """Whether a GPU of compute capability `cc` runs this build only through PTX JIT compilation.

    Machine code for sm_XY runs on compute capability X.y with y >= Y (same major); PTX for
    compute_XY is compiled by the driver for any X.Y or newer. No machine code but PTX: JIT.
    """
    sass = any(major == cc[0] and minor <= cc[1] for major, minor in _archs(build, "sm"))
    return not sass and any(arch <= cc for arch in _archs(build, "compute"))


def ptx_driver_floor(tf_version: str | None) -> str | None:
    """The oldest driver that loads the PTX of this TensorFlow's CUDA (train.gpucheck.stack), if known."""
    from .stack import StackError, stack_for

    try:
        return stack_for(tf_version or "").ptx_driver
    except StackError:
        return None


def _driver_too_old_for_ptx(facts: Facts) -> Diagnosis | None:
    """A GPU newer than the build's machine code, on a driver older than the CUDA that made the PTX."""
    build, cuda = facts.tf.build, str(facts.tf.build.get("cuda_version") or "")
    floor = ptx_driver_floor(facts.tf.version)
    ccs = [tuple(g["compute_capability"]) for g in facts.tf.gpus if g.get("compute_capability")]
    hit = []
    for i, g in enumerate(facts.gpus):
        cc = g.compute_capability or (ccs[i] if i < len(ccs) else None)
        if not (cc and needs_ptx(build, tuple(cc))):
            continue
        if g.cuda_driver_version:
            old = _version(g.cuda_driver_version)[:2] < _version(cuda)[:2]
        else:
            old = bool(floor) and _version(g.driver_version) < _version(floor)
        if old:
            hit.append((g, cc))
    evidence = [line for line in facts.tf.log if _PTX_ERROR.search(line)]
    evidence += [m["error"] for m in facts.tf.matmul if _PTX_ERROR.search(str(m.get("error") or ""))]
    if not hit and not (evidence and facts.gpus):
        return None
    g, cc = hit[0] if hit else (facts.gpus[0], facts.gpus[0].compute_capability or (ccs[0] if ccs else None))
    sass = ", ".join(f"sm_{a}{b}" for a, b in _archs(build, "sm"))
    want = (
        f"{floor} or newer (CUDA {'.'.join(cuda.split('.')[:2])}'s driver)"
        if floor
        else f"one that supports CUDA {cuda}"
    )
    return Diagnosis(
        "driver_too_old_for_ptx",
        "error",
        f"driver too old for this GPU's PTX: {g.name} (compute capability {f'{cc[0]}.{cc[1]}' if cc else '?'}) has "
        f"no machine code in this TensorFlow build ({sass}), so the driver must compile its kernels from PTX "
        f"made by CUDA {cuda}, "
        f"which NVIDIA driver {g.driver_version} (CUDA up to {g.cuda_driver_version or '?'}) cannot load "
        "(CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
        f"upgrade the host's NVIDIA driver to {want}; a container uses the host's driver",
        [f"GPU {h.index}: {h.name}, compute capability {c[0]}.{c[1]}" for h, c in hit] + evidence,
    )


def _libcuda_missing(facts: Facts) -> Diagnosis | None:
    """The driver answers (NVML / nvidia-smi) but its CUDA library libcuda.so.1 does not load: no pip
    wheel brings it. In a container the NVIDIA runtime mounts it only with the `compute` capability
    (NVIDIA_DRIVER_CAPABILITIES unset or empty means `utility` alone: nvidia-smi and NVML)."""
    lib = next((lib for lib in facts.libraries if lib.library == "cuda"), None)
    if lib is None or lib.path is not None or not facts.driver_present:
        return None
    caps = facts.env.get("NVIDIA_DRIVER_CAPABILITIES")
    if facts.in_container:
        given = f"NVIDIA_DRIVER_CAPABILITIES={caps!r}" if caps is not None else "NVIDIA_DRIVER_CAPABILITIES unset"
        why = f" ({given}: the NVIDIA runtime mounts libcuda only with the `compute` capability)"
        fix = (
            "start the container with NVIDIA_DRIVER_CAPABILITIES=compute,utility (or all) in its environment "
            "(this template's image sets it; an image or compose file that sets `utility` alone keeps libcuda out)"
        )
    else:
        why = ""
        fix = (
            "libcuda.so.1 comes with the NVIDIA driver, not from pip: reinstall the driver's user-space "
            "libraries (its .run installer, or the distribution's libcuda1 / libnvidia-compute package), "
            "then `ldconfig`; under WSL add /usr/lib/wsl/lib to LD_LIBRARY_PATH"
        )
    return Diagnosis(
        "libcuda_missing",
        "error",
        f"the NVIDIA driver answers ({len(facts.gpus)} GPU(s) listed) but its CUDA library libcuda.so.1 "
        f"cannot be loaded{why}: TensorFlow uses no GPU without it",
        fix,
    )


def _libraries(facts: Facts) -> list[Diagnosis]:
    missing = _libcuda_missing(facts)
    out = [missing] if missing else []
    fix = f'pip install "tensorflow[and-cuda]=={facts.tf.version}" (brings the CUDA and cuDNN wheels the build expects)'
    for lib in (lib for lib in facts.libraries if lib.library != "cuda"):
        if lib.path is None:
            code = "library_wrong_major" if lib.others else "library_missing"
            found = ", ".join(lib.others) if lib.others else "nothing"
            out.append(
                Diagnosis(
                    code,
                    "error",
                    f"{lib.library}: {lib.expected} not found (found: {found}); this "
                    f"TensorFlow build expects {lib.expected}",
                    fix,
                    [lib.error] if lib.error else [],
                )
            )
        elif lib.library == "cudnn" and lib.version:
            built = str(facts.tf.build.get("cudnn_version", ""))
            if len(_version(built)) >= 2 and _version(lib.version)[:2] < _version(built)[:2]:
                out.append(
                    Diagnosis(
                        "library_wrong_version",
                        "error",
                        f"cudnn: {lib.path} is version {lib.version}; "
                        f"this build was compiled with cuDNN {built} and needs that minor or newer",
                        fix,
                    )
                )
    return out


def cuda_visible(cvd: str, gpus: list[GpuInfo]) -> int | None:
    """How many of the driver's GPUs CUDA shows under CUDA_VISIBLE_DEVICES=cvd (None: MIG, not counted here).

    CUDA reads the comma-separated indices or UUID prefixes up to the first that names no GPU ("-1", an
    index out of range, a typo): the entries after it are ignored, so "garbage" or "-1,0" hide every GPU.
    """
    count = 0
    for entry in (e.strip() for e in cvd.split(",")):
        if entry.startswith("MIG-"):
            return None
        ok = entry.isascii() and entry.isdigit() and int(entry) < len(gpus)  # "²" is a digit to isdigit, not to int
        ok = ok or (entry.startswith("GPU-") and sum(g.uuid.startswith(entry) for g in gpus) == 1)
        if not ok:
            break
        count += 1
    return count


def _cut_short(cvd: str, gpus: list[GpuInfo]) -> Diagnosis | None:
    """CUDA_VISIBLE_DEVICES=0,garbage,1: GPU 0 is used, and 1 is dropped without a word from CUDA."""
    entries = [e.strip() for e in cvd.split(",")]
    count = cuda_visible(cvd, gpus)
    if count is None or count >= len(entries) or not entries[count]:
        return None
    return Diagnosis(
        "gpu_hidden",
        "warning",
        f"CUDA_VISIBLE_DEVICES={cvd!r}: {entries[count]!r} names no GPU, so CUDA ignores it and every entry "
        f"after it; TensorFlow uses the first {count} only",
        f"list only GPU indices (0-{len(gpus) - 1} here) or UUIDs from `nvidia-smi -L`",
    )


def _not_visible_to_tf(facts: Facts, shown: list[str], explained: bool) -> Diagnosis | None:
    seen, present = len(facts.tf.gpus), len(facts.gpus)
    if not present or seen >= present or not cuda_build(facts):
        return None
    cvd = facts.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        if seen == 0 and cuda_visible(cvd, facts.gpus) == 0:
            why = "" if cvd.strip() in ("", "-1") else ": CUDA stops at the first entry that is no GPU index or UUID"
            return Diagnosis(
                "gpu_hidden",
                "error",
                f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU from TensorFlow{why}",
                f"unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices to use, 0-{present - 1} here, "
                "or their UUIDs from `nvidia-smi -L`)",
            )
        if seen:
            return _cut_short(cvd, facts.gpus)  # a deliberate subset, unless a bad entry cut it
    fix = (
        "fix the problem(s) above"
        if explained
        else (f'pip install "tensorflow[and-cuda]=={facts.tf.version}" and check the library errors listed')
    )
    if any("Ignoring visible gpu device" in line for line in shown):
        fix = (
            "use a GPU with the compute capability the build supports (see the line above), or a build that supports it"
        )
    severity = "error" if seen == 0 else "warning"
    return Diagnosis(
        "gpu_not_visible_to_tf",
        severity,
        f"the driver shows {present} GPU(s) but TensorFlow sees {seen}",
        fix,
        shown or ["TensorFlow logged no library-loading error"],
    )


def _memory_growth(facts: Facts) -> Diagnosis | None:
    mg = facts.tf.memory_growth
    if not (mg.get("error") and "after being initialized" in mg["error"]):
        return None
    return Diagnosis(
        "memory_growth_too_late",
        "error",
        f"{mg.get('late_call') or 'set_memory_growth'} came too late: the GPU had already been initialised "
        f'("{mg["error"]}")',
        "call tf.config.experimental.set_memory_growth before anything touches the GPU (the first tensor, "
        "model or tf.config.list_logical_devices()); here train.setup.devices does it before building the model",
    )


def _allow_growth_env(facts: Facts) -> Diagnosis | None:
    """TF_FORCE_GPU_ALLOW_GROWTH: TensorFlow's GPU allocator reads exactly "true" or "false", ignores the rest."""
    value = facts.env.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None or value == "true" or not facts.tf.gpus:
        return None
    if value == "false":
        summary = (
            "TF_FORCE_GPU_ALLOW_GROWTH=false overrides set_memory_growth: TensorFlow takes nearly all of "
            "each GPU's memory at start"
        )
    else:
        summary = (
            f"TF_FORCE_GPU_ALLOW_GROWTH={value!r} is ignored by TensorFlow (it reads only 'true' or 'false', "
            "lower case, and logs an error for anything else)"
        )
    return Diagnosis(
        "allow_growth_env",
        "warning",
        summary,
        "unset TF_FORCE_GPU_ALLOW_GROWTH (training sets memory growth itself, MEMORY_GROWTH) or set it to true",
    )


def _memory_held(facts: Facts, own_pids: set[int]) -> list[Diagnosis]:
    out = []
    for g in facts.gpus:
        others = [p for p in g.processes if p.pid not in own_pids]
        unlisted = g.memory_used_mb - sum(p.used_memory_mb or 0 for p in others)
        if not others and unlisted < max(1024.0, 0.05 * g.memory_total_mb):
            continue
        held = f"{g.memory_used_mb / 1024:.1f} of {g.memory_total_mb / 1024:.1f} GiB"
        details = [
            f"pid {p.pid} {p.name}: "
            + (f"{p.used_memory_mb / 1024:.1f} GiB" if p.used_memory_mb is not None else "amount not reported")
            for p in others
        ]
        if not others:
            details = ["no process listed: held by processes outside this container or PID namespace"]
        fix = (f"stop them (kill {' '.join(str(p.pid) for p in others)})" if others else "free it on the host") + (
            " or pick a free GPU with CUDA_VISIBLE_DEVICES=<index>"
        )
        out.append(
            Diagnosis(
                "memory_held_by_others",
                "warning",
                f"GPU {g.index} ({g.name}): {held} already held by other processes",
                fix,
                details,
            )
        )
    return out


def diagnose(facts: Facts, own_pids: set[int] | None = None) -> list[Diagnosis]:
    """Every problem found, root causes first. Pure: reads only `facts`."""
    tf, diags = facts.tf, []
    if tf.version is None:
        return [
            Diagnosis(
                "tensorflow_unavailable",
                "error",
                f"TensorFlow could not be started: {tf.error}",
                "install the locked requirements (`pip install -r requirements/cpu.lock`) and rerun",
                classify_log(tf.log, facts.driver_present)[0] or tf.log[-5:],
            )
        ]
    if not facts.driver_present:
        diags.append(_no_driver(facts))
    elif hidden := _no_gpu_given(facts):
        diags.append(hidden)
    if not cuda_build(facts):
        gpu_here = bool(facts.gpus)
        diags.append(
            Diagnosis(
                "cpu_only_build",
                "error" if gpu_here else "info",
                f"TensorFlow {tf.version} is a CPU-only build"
                + (" but this machine has a GPU" if gpu_here else " (right for this machine)"),
                # Both wheels are the same tensorflow/ folder: installing over the CPU one mixes them.
                f'pip uninstall -y tensorflow-cpu && pip install "tensorflow[and-cuda]=={tf.version}" '
                "(in this template: requirements/gpu.lock, which the GPU image installs)"
                if gpu_here
                else "none needed on a CPU machine",
            )
        )
    else:
        too_old = _driver_too_old(facts) or _driver_too_old_for_ptx(facts)
        diags += [too_old] if too_old else []
        diags += _libraries(facts)
    shown, _ = classify_log(tf.log, facts.driver_present)
    explained = any(d.severity == "error" for d in diags)
    diags += [
        d for d in (_not_visible_to_tf(facts, shown, explained), _memory_growth(facts), _allow_growth_env(facts)) if d
    ]
    diags += _memory_held(facts, own_pids or set())
    return diags
