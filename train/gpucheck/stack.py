"""TensorFlow's tested build configurations, and the versions the lock files actually pin.

TensorFlow publishes the Python / CUDA / cuDNN combination each release was built and tested with
(https://www.tensorflow.org/install/source#gpu). `tensorflow[and-cuda]` only declares ranges for the
nvidia-* wheels, so requirements/gpu.lock is what pins CUDA. `check_locks()` compares the locks with
TESTED, so an upgrade that breaks the match fails in CI (tests/gpucheck/test_stack.py) and in
`invoke lock`, not on a user's GPU. Plain Python, no TensorFlow import: `python -m train.gpucheck.stack`
prints the stack.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

# packaging parses the lock's lines exactly as pip does (requirements/core.in says why it is a dependency).
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..errors import StackError

ROOT = Path(__file__).resolve().parents[2]
CPU_LOCK = ROOT / "requirements/cpu.lock"
GPU_LOCK = ROOT / "requirements/gpu.lock"
TEST_LOCK = ROOT / "requirements/test.lock"  # installed on top of either: must agree with both


@dataclass(frozen=True)
class TestedStack:
    """One row of TensorFlow's "tested build configurations" table (Linux GPU)."""

    tensorflow: str  # major.minor of the release
    python_min: str  # oldest supported Python, major.minor
    python_max: str  # newest supported Python, major.minor
    cuda: str  # CUDA toolkit major.minor it was built with
    cudnn: str  # cuDNN major.minor it was built with
    min_driver: str  # oldest Linux driver that runs this CUDA (CUDA 12.x minor-version compatibility)
    sass: str  # newest GPU architecture with machine code in the wheels (compute capability)
    ptx_driver: str  # oldest driver for newer GPUs: their kernels are JIT-compiled from this CUDA's PTX

    __test__ = False  # not a pytest test class despite the name

    @property
    def pythons(self) -> list[str]:
        major, lo = map(int, self.python_min.split("."))
        hi = int(self.python_max.split(".")[1])
        return [f"{major}.{minor}" for minor in range(lo, hi + 1)]


# Add the new row before raising the TensorFlow pins (docs/development.md, "Lock files and the TensorFlow version").
# Both releases are built with CUDA 12.5.1 for sm_60, sm_70, sm_80, sm_89 plus compute_90 PTX
# (TensorFlow's .bazelrc, `cuda12_version`; `tf.sysconfig.get_build_info()` shows the list). Minor-
# version compatibility (>= 525.60.13) covers the machine code; PTX made by CUDA 12.5 needs a driver
# of CUDA 12.5 or newer (555.42.06 for 12.5.1), so H100/H200 and newer need that driver.
TESTED: dict[str, TestedStack] = {
    "2.20": TestedStack("2.20", "3.9", "3.13", "12.5", "9.3", "525.60.13", "8.9", "555.42.06"),
    "2.21": TestedStack("2.21", "3.10", "3.13", "12.5", "9.3", "525.60.13", "8.9", "555.42.06"),
}

# The wheels whose versions carry the CUDA and cuDNN versions (12.5.82 -> 12.5, 9.3.0.75 -> 9.3).
CUDA_WHEEL = "nvidia-cuda-runtime-cu12"
CUDNN_WHEEL = "nvidia-cudnn-cu12"
_CUDA_ONLY = re.compile(r"^nvidia-.*-cu\d+$")  # nvidia-ml-py is a small pure-Python NVML binding: allowed on CPU


@dataclass(frozen=True)
class Pin:
    name: str  # normalised (PEP 503): lower case, runs of -_. become -
    version: str
    marker: Marker | None  # environment marker; None when the pin applies everywhere


def _requirement_lines(text: str):
    """(line number, requirement text) of a pip/uv lock: hash lines, comments and options skipped."""
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip().removesuffix("\\").strip()
        if line and not line.startswith(("#", "-")):  # "--hash=...", "-r file", "-c file"
            yield number, line


def read_lock(path: str | Path) -> list[Pin]:
    """Every `name==version ; marker` line of a pip/uv lock file."""
    pins = []
    for number, line in _requirement_lines(Path(path).read_text()):
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise StackError(
                f"{path}, line {number}: {line!r} is not a requirement ({str(exc).splitlines()[0]}); "
                "regenerate the lock with `invoke lock`"
            ) from None
        exact = [spec.version for spec in req.specifier if spec.operator == "=="]
        if len(exact) != 1 or len(req.specifier) != 1:
            raise StackError(
                f"{path}, line {number}: {line!r} does not pin one version with ==; "
                "regenerate the lock with `invoke lock`"
            )
        pins.append(Pin(canonicalize_name(req.name), exact[0], req.marker))
    if not pins:
        raise StackError(f"{path} has no pinned packages; regenerate it with `invoke lock`")
    return pins


def locked_versions(path: str | Path, python: str = "3.11") -> dict[str, str]:
    """{name: version} that pip would install from `path` on CPython `python` on Linux (the image's)."""
    env = {
        "python_version": python,
        "python_full_version": python + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    return {p.name: p.version for p in read_lock(path) if p.marker is None or p.marker.evaluate(env)}


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def stack_for(tf_version: str) -> TestedStack:
    key = major_minor(tf_version)
    if key not in TESTED:
        raise StackError(
            f"TensorFlow {tf_version} has no row in train/gpucheck/stack.py TESTED (known: {', '.join(sorted(TESTED))}); "
            "add it from https://www.tensorflow.org/install/source#gpu"
        )
    return TESTED[key]


def check_locks(
    cpu_lock: str | Path = CPU_LOCK, gpu_lock: str | Path = GPU_LOCK, test_lock: str | Path = TEST_LOCK
) -> tuple[TestedStack, list[str]]:
    """The tested stack the locks claim, and every way in which they disagree with it or each other."""
    problems: list[str] = []
    gpu = locked_versions(gpu_lock)
    tf = gpu.get("tensorflow")
    if tf is None:
        raise StackError(f"{gpu_lock} does not pin tensorflow; regenerate it with `invoke lock`")
    stack = stack_for(tf)
    for wheel, want, what in ((CUDA_WHEEL, stack.cuda, "CUDA"), (CUDNN_WHEEL, stack.cudnn, "cuDNN")):
        got = gpu.get(wheel)
        if got is None or major_minor(got) != want:
            problems.append(f"{gpu_lock}: {wheel}=={got} but TensorFlow {tf} is tested with {what} {want}")
    for python in stack.pythons:
        cpu, gpu = locked_versions(cpu_lock, python), locked_versions(gpu_lock, python)
        if cpu.get("tensorflow-cpu") != tf or gpu.get("tensorflow") != tf:
            problems.append(
                f"Python {python}: the locks do not both pin TensorFlow {tf} (cpu: "
                f"{cpu.get('tensorflow-cpu')}, gpu: {gpu.get('tensorflow')})"
            )
        cuda_on_cpu = sorted(n for n in cpu if _CUDA_ONLY.match(n) or n == "tensorflow")
        if cuda_on_cpu:
            problems.append(f"{cpu_lock} (Python {python}) would download CUDA packages: {', '.join(cuda_on_cpu)}")
        test = locked_versions(test_lock, python)
        for (a, a_lock), (b, b_lock) in (
            ((cpu, cpu_lock), (gpu, gpu_lock)),
            ((test, test_lock), (gpu, gpu_lock)),
            ((test, test_lock), (cpu, cpu_lock)),
        ):
            for name in sorted(a.keys() & b.keys()):
                if a[name] != b[name]:
                    problems.append(f"Python {python}: {name} is {a[name]} in {a_lock} but {b[name]} in {b_lock}")
    return stack, problems


def describe() -> str:
    """One line: the locked TensorFlow, CUDA and cuDNN and what they need from the host."""
    gpu = locked_versions(GPU_LOCK)
    s = stack_for(gpu["tensorflow"])
    return (
        f"TensorFlow {gpu['tensorflow']} | CUDA {s.cuda} ({CUDA_WHEEL} {gpu.get(CUDA_WHEEL)}) | "
        f"cuDNN {s.cudnn} ({CUDNN_WHEEL} {gpu.get(CUDNN_WHEEL)}) | NVIDIA driver >= {s.min_driver} "
        f"(compute capability <= {s.sass}), >= {s.ptx_driver} (newer GPUs) | "
        f"Python {s.python_min}-{s.python_max}"
    )


def main() -> int:
    try:
        _, problems = check_locks()
        print(describe())
    except StackError as exc:
        print(f"StackError: {exc}", file=sys.stderr)
        return exc.exit_code
    for problem in problems:
        print(f"StackError: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
