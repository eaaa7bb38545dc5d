"""What the hardware can do: CPU bf16 support and the precision `auto` picks, read without TensorFlow,
and the matmul probe of a device's peak FLOP/s (the one function here that starts TensorFlow).

Pure functions over plain inputs (CPU flags, GPU compute capabilities), so the choice is tested on
any machine with faked inputs; `devices` feeds them the real values.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

# CPU flags (as in /proc/cpuinfo) that give TensorFlow/oneDNN native bfloat16 matmuls and convolutions.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# Capped at one of these oneDNN ISA names (ONEDNN_MAX_CPU_ISA) on a CPU with AVX-512, TensorFlow
# still hands bfloat16 work to oneDNN (it decides from the CPU's avx512f flag:
# IsBF16SupportedByOneDNNOnThisCPU in its mkl_graph_util.h), which has no kernel for it under the
# cap: a bfloat16 matmul ends the process (SIGSEGV) and a convolution raises "could not create a
# primitive descriptor" (TensorFlow 2.21, measured with ONEDNN_MAX_CPU_ISA=AVX2, and AVX2_VNNI_2 on
# a CPU without avx_ne_convert, the instructions oneDNN's bfloat16 kernels at that level need).
# Without avx512f, TensorFlow keeps bfloat16 on its own kernels.
ISAS_BF16_FAILS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
# The caps that stop oneDNN below its bfloat16 kernels (AVX512_CORE_BF16 and up): there bfloat16 is
# emulated, or crashes as above, even on a CPU that has it. Any other value (AVX512_CORE_BF16,
# AVX512_CORE_AMX, ALL, ...) leaves the native kernels in reach.
ISAS_WITHOUT_BF16 = (*ISAS_BF16_FAILS, "AVX512_CORE", "AVX512_CORE_VNNI")
# NVIDIA: float16 tensor cores from compute capability 7.0 (Volta), bfloat16 from 8.0 (Ampere).
FP16_MIN_CC = (7, 0)
BF16_MIN_CC = (8, 0)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags; empty when they cannot be read (non-Linux): then auto stays float32."""
    return set((_cpuinfo_value("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC 9R14 ..."), else the processor platform reports; "" if neither."""
    import platform

    model = _cpuinfo_value("model name", cpuinfo)
    return model.strip() if model is not None else platform.processor()


def _cpuinfo_value(key: str, cpuinfo: str | Path) -> str | None:
    """The text after the colon of `cpuinfo`'s first line starting with `key`; None without one (or the file)."""
    try:
        lines = Path(cpuinfo).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1] for line in lines if line.startswith(key) and ":" in line), None)


# The CPU families oneDNN's kernels differ by, strongest first: bit-identical results hold within one
# (TensorFlow's determinism is for the same hardware), and the benchmarks' goals are set per family.
CPU_FAMILIES = ("AMX", "AVX512-BF16", "AVX-512", "AVX2", "older (no AVX2)")
# What a cap (ONEDNN_MAX_CPU_ISA) leaves of a newer CPU; any other value (ALL, AVX512_CORE_AMX) caps nothing.
_CAPPED = {
    "SSE41": "older (no AVX2)",
    "AVX": "older (no AVX2)",
    "AVX2": "AVX2",
    "AVX2_VNNI": "AVX2",
    "AVX2_VNNI_2": "AVX2",
    "AVX512_CORE": "AVX-512",
    "AVX512_CORE_VNNI": "AVX-512",
    "AVX512_CORE_BF16": "AVX512-BF16",
    # The level above the bfloat16 kernels and below AMX: AVX10_1_512, AVX512_CORE_FP16 before oneDNN renamed it.
    "AVX512_CORE_FP16": "AVX512-BF16",
    "AVX10_1_512": "AVX512-BF16",
}


def cpu_family(flags: Iterable[str], max_isa: str | None) -> str:
    """The family of this CPU as oneDNN may use it: AMX, AVX512-BF16, AVX-512, AVX2 or older.

    A cap below what the CPU has is said beside the family it stands in for: "AVX2 (stand-in: AMX
    CPU with ONEDNN_MAX_CPU_ISA=AVX2)". Such a stand-in keeps the newer core's caches and memory
    bandwidth, so its speed is not that family's."""
    flags = set(flags)
    have = [("AMX", "amx_bf16"), ("AVX512-BF16", "avx512_bf16"), ("AVX-512", "avx512f"), ("AVX2", "avx2")]
    real = next((family for family, flag in have if flag in flags), CPU_FAMILIES[-1])
    used = _CAPPED.get((max_isa or "").upper(), real)
    if CPU_FAMILIES.index(used) <= CPU_FAMILIES.index(real):
        return real
    return f"{used}{_STAND_IN} {real} CPU with ONEDNN_MAX_CPU_ISA={(max_isa or '').upper()})"


_STAND_IN = " (stand-in:"


def kernels(family: str) -> str:
    """The family whose oneDNN kernels a `cpu_family` answer runs: a stand-in runs the capped ones."""
    return family.split(_STAND_IN)[0]


def cpu_bf16(flags: Iterable[str]) -> list[str]:
    """The bf16 features present, e.g. ['avx512_bf16']; empty means bfloat16 would be emulated (slow)."""
    flags = set(flags)
    return [f for f in CPU_BF16_FLAGS if f in flags]


# TensorFlow's own choice when TF_ENABLE_ONEDNN_OPTS is not set (DefaultOneDnnPolicy, its
# tensorflow/core/util/util.cc): oneDNN's kernels on a Linux x86 CPU with one of these, Eigen's otherwise.
ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
_X86 = ("x86_64", "amd64")


def _onednn_given(env: Mapping[str, str]) -> str | None:
    """TF_ENABLE_ONEDNN_OPTS as given, if TensorFlow reads it as a choice (1, true, 0 or false, any case);
    None when unset or another value, which TensorFlow ignores for its default (" 1" too: it does not
    strip spaces, and says so only in its own log)."""
    value = env.get("TF_ENABLE_ONEDNN_OPTS", "")
    return value if value.lower() in ("1", "true", "0", "false") else None


def onednn_enabled(environ: Mapping[str, str] | None = None, flags: Iterable[str] | None = None) -> bool:
    """Whether TensorFlow's oneDNN CPU kernels are on, as TensorFlow reads TF_ENABLE_ONEDNN_OPTS: 1 or
    true on, 0 or false off; unset or another value, TensorFlow's default for these CPU `flags`
    (ONEDNN_DEFAULT_FLAGS; None: this CPU's)."""
    given = _onednn_given(os.environ if environ is None else environ)
    if given is not None:
        return given.lower() in ("1", "true")
    return bool(set(cpu_flags() if flags is None else flags) & set(ONEDNN_DEFAULT_FLAGS))


# Set by turn_on_onednn in this process: what the run's record says of the kernels.
_TURNED_ON = "TF_ENABLE_ONEDNN_OPTS=1, set by the template: TensorFlow leaves oneDNN off on CPUs without AVX512-VNNI, AVX512-BF16 or AMX"
_turned_on = False


def turn_on_onednn(
    environ: dict[str, str] | None = None, flags: Iterable[str] | None = None, machine: str | None = None
) -> bool:
    """Set TF_ENABLE_ONEDNN_OPTS=1 where TensorFlow would run Eigen's kernels on an x86 CPU (AVX2-only,
    AVX-512 without VNNI): its float32 convolutions are oneDNN's then, the default training's epochs
    1.3-1.5x faster on an AVX2-only EPYC (docs/performance.md); the weights differ by rounding only.
    Only before TensorFlow is imported (it reads the variable once), and never over a value the user
    set (TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen's kernels). -> whether it was set here."""
    import platform
    import sys

    global _turned_on
    env = os.environ if environ is None else environ
    flags = cpu_flags() if flags is None else set(flags)
    x86 = (machine or platform.machine()).lower() in _X86
    if "tensorflow" in sys.modules or "TF_ENABLE_ONEDNN_OPTS" in env or not x86 or onednn_enabled(env, flags):
        return False
    env["TF_ENABLE_ONEDNN_OPTS"] = "1"
    _turned_on = environ is None
    return True


def onednn_state(environ: Mapping[str, str] | None = None, flags: Iterable[str] | None = None) -> str:
    """The run's record of its CPU kernels: "on" or "off", and why."""
    env = os.environ if environ is None else environ
    on, given = onednn_enabled(env, flags), _onednn_given(env)
    if on and _turned_on and environ is None:
        return f"on ({_TURNED_ON})"
    if given is not None:
        return f"{'on' if on else 'off'} (TF_ENABLE_ONEDNN_OPTS={given})"
    raw = env.get("TF_ENABLE_ONEDNN_OPTS")
    # A value TensorFlow cannot read ("yes", "on") is ignored, as is the wish behind it: say so.
    ignored = "" if raw is None else f"; TF_ENABLE_ONEDNN_OPTS={raw!r} is ignored: TensorFlow reads 0, 1, true or false"
    if on:
        return f"on (TensorFlow's default on a CPU with AVX512-VNNI, AVX512-BF16 or AMX{ignored})"
    # On x86, train() turns it on unless TensorFlow was imported first (a notebook's own import).
    return (
        f"off (TensorFlow's default on a CPU without AVX512-VNNI, AVX512-BF16 or AMX{ignored}; "
        "TF_ENABLE_ONEDNN_OPTS=1 set before TensorFlow is imported turns it on)"
    )


def onednn_max_isa(environ: Mapping[str, str] | None = None) -> str | None:
    """The instruction set oneDNN is capped at, upper-cased: ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA,
    the older name oneDNN still reads; None when neither is set. ONEDNN_MAX_CPU_ISA=AVX2 makes a
    newer CPU run oneDNN's AVX2 kernels, as a CPU without AVX-512 would."""
    env = os.environ if environ is None else environ
    value = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return value or None


def check_precision_fits_isa(
    policy: str, gpu_compute_capabilities: Sequence[tuple[int, int]], flags: Iterable[str], max_isa: str | None
) -> None:
    """Refuse bfloat16 on the CPU under an ONEDNN_MAX_CPU_ISA cap at which TensorFlow crashes, with
    what to change, instead of a segmentation fault at the first step."""
    flags = set(flags)
    on_onednn = bool({"avx512f", "avx_ne_convert"} & flags)
    fails = max_isa in ISAS_BF16_FAILS and not (max_isa == "AVX2_VNNI_2" and "avx_ne_convert" in flags)
    if policy == "mixed_bfloat16" and not gpu_compute_capabilities and on_onednn and fails:
        from ..errors import ConfigError

        # The variable that set the cap (onednn_max_isa), to say which one to unset.
        older = os.environ.get("DNNL_MAX_CPU_ISA") and not os.environ.get("ONEDNN_MAX_CPU_ISA")
        variable = "DNNL_MAX_CPU_ISA" if older else "ONEDNN_MAX_CPU_ISA"
        raise ConfigError(
            "PRECISION",
            policy,
            f"TensorFlow's bfloat16 CPU kernels crash under {variable}={max_isa}: "
            f"use PRECISION=float32 (or auto), or unset {variable}",
        )


def check_precision_fits_isa_now(policy: str, root: Path = Path("/")) -> None:
    """check_precision_fits_isa before TensorFlow, on a machine where no GPU can be visible (no NVIDIA
    or AMD device node), so a refusal comes before any run directory is made; elsewhere the device
    set-up checks it with the GPUs TensorFlow sees. Paths under `root`, for the tests."""
    if not any((root / node).exists() for node in ("dev/nvidiactl", "dev/kfd")):
        check_precision_fits_isa(policy, [], cpu_flags(root / "proc/cpuinfo"), onednn_max_isa())


# A CPU's native bfloat16 kernels are not always faster than its float32 ones: on a 2-core Intel
# Xeon with avx512_bf16 and no AMX (oneDNN's avx512_core_bf16 kernels), the probe's convolution ran
# at 0.5-0.6x float32's and the default training at 0.80x (batch 128) and 0.875x (512) of float32's
# speed (benchmarks/test_throughput.py), while a Zen 4 with the same flag trained 1.48x faster in
# bfloat16, its forward convolutions 1.64x (docs/performance.md, where a step's time goes). So `auto`
# measures: below this ratio, float32. Between it and 1.0 bfloat16 is kept, as before the probe: the
# probe is one convolution, and bfloat16 also halves the memory traffic of the ops around it.
BF16_MIN_SPEEDUP = 0.9


KEPT = "the precision this run trained in until now, kept on resume; chosen at its start because: "
_OLD_KEPT = "the precision this run trained in until now, kept on resume; chosen because: "  # records before


def runs_natively(
    policy: str, gpu_compute_capabilities: Sequence[tuple[int, int]], flags: Iterable[str], onednn: bool, max_isa
) -> bool:
    """Whether these devices run `policy` at their own speed: float32 anywhere; float16 and bfloat16 on
    GPUs whose tensor cores have it; bfloat16 on a CPU whose oneDNN kernels have it."""
    if policy == "float32":
        return True
    if gpu_compute_capabilities:
        return min(gpu_compute_capabilities) >= (BF16_MIN_CC if policy == "mixed_bfloat16" else FP16_MIN_CC)
    return policy == "mixed_bfloat16" and bool(cpu_bf16(flags)) and onednn and max_isa not in ISAS_WITHOUT_BF16


def choose_precision(
    requested: str,
    gpu_compute_capabilities: Sequence[tuple[int, int]],
    flags: Iterable[str],
    onednn: bool = True,
    max_isa: str | None = None,
    bf16_speedup: Callable[[], tuple[float, str]] | None = None,
    kept: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """Return (policy, reason). `requested` other than 'auto' is kept as it is.

    `kept`: a resumed run's recorded (policy, reason). It stays where these devices run it natively,
    whatever auto would pick now (a probe's new figure, another machine): a run's metrics must not
    step in the middle of it. Elsewhere auto picks anew, and the run's record says so (train.training.fit).

    GPUs: bfloat16 from 8.0 (same range as float32, so no loss scaling), float16 from 7.0,
    float32 below (no tensor cores: mixed precision would only add casts). With several GPUs the
    weakest decides. CPUs: bfloat16 only with native support (AMX or AVX512-BF16), where oneDNN
    runs the classic Keras MNIST CNN faster than float32; emulated bf16 is slower, so float32 otherwise.
    Measured on a 2-core AMD EPYC with AVX512-BF16 and no AMX (benchmarks/test_throughput.py,
    interleaved in one process): bf16/float32 0.99x at batch 128 (equal within noise: the small
    CNN is bound by memory traffic and per-step overhead there) and 1.48x at batch 512, so AVX512-BF16
    alone is kept: never slower, faster as activations grow. Native bf16 is oneDNN's: with
    TF_ENABLE_ONEDNN_OPTS=0 (`onednn=False`) the same CPU trained the default CNN in mixed_bfloat16
    at a twentieth of its speed with oneDNN (benchmarks/test_cpu_settings.py), so float32 then, and
    likewise when `max_isa` (ONEDNN_MAX_CPU_ISA) keeps oneDNN below its bfloat16 kernels.
    `bf16_speedup()`: (bfloat16's speed over float32's on this CPU, where the figure comes from),
    asked only on a CPU with native bfloat16; below BF16_MIN_SPEEDUP, float32. None: the flags decide.
    """
    if requested != "auto":
        return requested, "set by PRECISION"
    if kept is not None and runs_natively(kept[0], gpu_compute_capabilities, flags, onednn, max_isa):
        # The start's reason, in the past: its "probe measured now" was then, not at this resume.
        then = kept[1].removeprefix(KEPT).removeprefix(_OLD_KEPT).replace("probe measured now", "probe measured then")
        return kept[0], KEPT + then
    if gpu_compute_capabilities:
        cc = min(gpu_compute_capabilities)
        cc_text = f"{cc[0]}.{cc[1]}"
        if cc >= BF16_MIN_CC:
            return "mixed_bfloat16", f"GPU compute capability {cc_text} >= 8.0 has bfloat16 tensor cores"
        if cc >= FP16_MIN_CC:
            return "mixed_float16", f"GPU compute capability {cc_text} >= 7.0 has float16 tensor cores"
        return "float32", f"GPU compute capability {cc_text} < 7.0 has no tensor cores"
    return _cpu_precision(cpu_bf16(flags), onednn, max_isa, bf16_speedup)


def _cpu_precision(native: list[str], onednn: bool, max_isa: str | None, bf16_speedup) -> tuple[str, str]:
    """choose_precision on a CPU whose bfloat16 features are `native`."""
    if native and not onednn:
        return "float32", (
            "TF_ENABLE_ONEDNN_OPTS turns oneDNN off: without it bfloat16 is emulated even on this CPU ("
            + ", ".join(native)
            + ")"
        )
    if native and max_isa in ISAS_WITHOUT_BF16:
        return "float32", (
            f"ONEDNN_MAX_CPU_ISA={max_isa} keeps oneDNN below its bfloat16 kernels (AVX512_CORE_BF16): "
            "bfloat16 would be emulated even on this CPU (" + ", ".join(native) + ")"
        )
    if native and bf16_speedup is not None:
        try:
            speedup, origin = bf16_speedup()
            if not math.isfinite(speedup):  # a timer that measured nothing: no figure to choose by
                raise ValueError(f"the probe measured {speedup}x")
        except Exception as exc:  # a bfloat16 convolution that cannot run here: the model's would not either
            from ..errors import first_line

            why = f"{type(exc).__name__}: {first_line(exc, None)}"
            return "float32", f"CPU has native bfloat16 ({', '.join(native)}), but the bfloat16 probe failed: {why}"
        # Two decimals rounded down, so that a figure just below the threshold never reads as it.
        shown = math.floor(speedup * 100 + 1e-9) / 100
        measured = f"its bfloat16 convolution ran {shown:.2f}x float32's ({origin})"
        if speedup < BF16_MIN_SPEEDUP:
            return "float32", f"CPU has native bfloat16 ({', '.join(native)}), but {measured}"
        return "mixed_bfloat16", f"CPU has native bfloat16 ({', '.join(native)}); {measured}"
    if native:
        return "mixed_bfloat16", "CPU has native bfloat16 (" + ", ".join(native) + ")"
    return "float32", "CPU has no native bfloat16 (no amx_bf16 / avx512_bf16): bf16 would be emulated"


# BATCH_SIZE and LEARNING_RATE left unset: the defaults (512, 0.007) where training runs in 16 bits
# or on GPUs, and this pair on a CPU in float32. Measured with the default CNN on real MNIST, float32
# on a 2-core Xeon (docs/performance.md): an epoch took 1.08x as long at a batch of 256 as at 512
# (1.13x at 128), and 3 epochs reached 99.02-99.19% test accuracy at 256 (five seeds) where 512's
# reached 98.92-98.94% (three): the twice as many steps learn more an epoch. In bfloat16 an example
# costs a quarter less at 512 than at 128, which is worth more there. The rate was measured at that
# batch (an AVX2-only EPYC, seeds 42, 7 and 1, test accuracy after 3 epochs): 0.003 98.93-99.02%,
# 0.005 (0.007 x sqrt(256/512), the rate until 2026-12-08) 99.02-99.10%, 0.008 99.16-99.20%, 0.011
# 99.19-99.27%, 0.014 99.21-99.26%; 0.008 is the lowest on that plateau, and the best after 2 epochs.
CPU_FLOAT32_BATCH = (256, 0.008)


def choose_batch(policy: str, gpus: bool, default: tuple[int, float]) -> tuple[int, float, str]:
    """(BATCH_SIZE, LEARNING_RATE, why) for a run that sets neither, training in `policy`."""
    if gpus or policy != "float32":
        return default[0], default[1], f"the defaults, for training {'on GPUs' if gpus else 'in ' + policy}"
    batch, rate = CPU_FLOAT32_BATCH
    why = (
        f"training in float32 on a CPU, where an example costs about the same at {batch} as at {default[0]} "
        f"and the more steps an epoch reach the accuracy in fewer epochs; LEARNING_RATE {rate:g}, measured "
        f"best at {batch}"
    )
    return batch, rate, why


# The probe: an n x n matmul, the best of `reps` (the MFU's peak and the GPU check's figure).
PROBE_N, PROBE_REPS = 1024, 3


def measure_peak_flops(
    dtype: str = "float32", device: str | None = None, n: int = PROBE_N, reps: int = PROBE_REPS
) -> float:
    """FLOP/s of an n x n matmul in `dtype` on `device` (the default device when None): the best of `reps`."""
    import tensorflow as tf

    with tf.device(device) if device else contextlib.nullcontext():
        a = tf.random.stateless_uniform((n, n), seed=(1, 2), dtype=tf.float32)
        a = tf.cast(a, "float32" if dtype == "tfloat32" else dtype)  # TF32 is how float32 runs, not a type
        float(tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))  # warm-up: kernels, thread pools
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            float(tf.reduce_sum(tf.cast(tf.matmul(a, a), tf.float32)))  # the read forces completion
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def measure_bf16_speedup(reps: int = 5) -> float:
    """float32's time over bfloat16's for a convolution of the default CNN's second layer at a batch of
    256 (3x3, 32 -> 64 channels, 26x26), compiled as training compiles it: the best of `reps` each,
    interleaved so that the machine's load falls on both alike. Above 1, bfloat16 is faster."""
    import tensorflow as tf

    best = {}
    convs = {}
    for dtype in ("float32", "bfloat16"):
        x = tf.cast(tf.random.stateless_uniform((256, 26, 26, 32), seed=(1, 2)), dtype)
        k = tf.cast(tf.random.stateless_uniform((3, 3, 32, 64), seed=(3, 4)), dtype)
        step = tf.function(lambda x, k: tf.reduce_sum(tf.cast(tf.nn.conv2d(x, k, 1, "VALID"), tf.float32)))
        float(step(x, k))  # trace, warm up the kernels and the thread pools
        convs[dtype], best[dtype] = (lambda step=step, x=x, k=k: float(step(x, k))), math.inf
    for _ in range(reps):
        for dtype, conv in convs.items():
            t0 = time.perf_counter()
            conv()  # the read forces completion
            best[dtype] = min(best[dtype], time.perf_counter() - t0)
    return best["float32"] / best["bfloat16"]


def in_container(root: Path = Path("/"), orchestrated: bool = False) -> bool:
    """Whether this process runs in a Docker or Podman container (their marker files); with
    `orchestrated`, also in one that Kubernetes or containerd started without them (the GPU check's
    question: /proc/1/cgroup names the runtime). Paths under `root`, for the tests."""
    if (root / ".dockerenv").exists() or (root / "run/.containerenv").exists():
        return True
    if not orchestrated:
        return False
    try:
        return bool(re.search(r"docker|kubepods|containerd|libpod", (root / "proc/1/cgroup").read_text()))
    except OSError:
        return False


# The volumes docker-compose.yml mounts, each a host folder: (the setting in .env that moves it, its
# default). The image's DATA_DIR and RUNS_DIR are these folders, and so are compose's.
COMPOSE_VOLUMES = {"/data": ("DATA_HOST_DIR", "./data"), "/runs": ("RUNS_HOST_DIR", "./runs")}


def compose_volume_hint(
    path: str | os.PathLike, environ: Mapping[str, str] | None = None, root: Path = Path("/")
) -> str:
    """Where `path`, a file this process cannot find, goes on the host: in a Docker or Podman
    container of the image (whose DATA_DIR is /data, the volume compose mounts) the host is seen only
    through the volumes, so a file beside docker-compose.yml is not there. '' elsewhere."""
    environ = os.environ if environ is None else environ
    if environ.get("DATA_DIR") != "/data" or not in_container(root):
        return ""
    full = os.path.abspath(path)
    for mount, (setting, default) in COMPOSE_VOLUMES.items():
        if full.startswith(mount + "/"):
            return f"{mount} is {default} beside docker-compose.yml on the host ({setting} in .env moves it)"
    return (
        "the container sees the host only through its volumes: put the file in ./data beside docker-compose.yml "
        "(DATA_HOST_DIR in .env moves it) and give it as /data/<file>"
    )
