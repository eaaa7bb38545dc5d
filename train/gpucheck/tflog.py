"""TensorFlow's C++ start-up log, sorted: the lines that explain why a GPU is not used, and the noise.

`python -m train check` shows the first kind as they are and counts the second kind under a
one-line explanation each, so a CPU machine's harmless cuInit messages do not look like errors.
"""

from __future__ import annotations

import re

# Lines that explain why a GPU is not used; shown as they are.
_RELEVANT = re.compile(
    r"Could not load dynamic library|Cannot dlopen|dlerror|Loaded runtime CuDNN|CUDA driver version is insufficient"
    r"|Ignoring visible gpu device|cudaGetDevice\(\) failed|DNN library|no kernel image|failed to create cublas"
    r"|cannot be modified after being initialized|Could not load library|CUDA_ERROR_(?!NO_DEVICE)"
)
# Start-up noise, each kind explained in one line instead of shown raw.
_NOISE = (
    (
        re.compile(
            r"cuInit|CUDA_ERROR_NO_DEVICE|Could not find cuda drivers|kernel driver does not appear|"
            r"CUDA diagnostic information|hostname: |libcuda reported version|kernel reported version"
        ),
        "cuInit: a CUDA build of TensorFlow looked for a GPU and found none (harmless on a machine without one)",
    ),
    (
        re.compile(
            r"oneDNN custom operations|cpu_feature_guard|appropriate compiler flags|following instructions|"
            r"optimized to use available CPU"
        ),
        "start-up notices about oneDNN and CPU instructions (informational)",
    ),
    (
        re.compile(
            r"register cu\w+ factory|already been registered|computation placer|TensorRT|TF-TRT|absl::InitializeLog"
        ),
        "plugin registration and optional TensorRT notices (harmless)",
    ),
    (re.compile(r"NUMA node"), "NUMA information not readable in a VM or container (harmless)"),
)
# Harmless without a driver; with one they say TensorFlow could not reach it.
_DRIVER_LOOKED = re.compile(r"cuInit|Could not find cuda drivers")
_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] (?:\S+/)?)")


def classify_log(lines: list[str], driver_present: bool) -> tuple[list[str], dict[str, int]]:
    """(lines worth showing, {explanation: count} for the noise). cuInit lines and "Could not find cuda
    drivers" matter when a driver is there."""
    shown, noise = [], {}
    for raw in lines:
        line = _PREFIX.sub("", raw.strip())
        if not line:
            continue
        if _RELEVANT.search(line) or (driver_present and _DRIVER_LOOKED.search(line)):
            shown.append(line)
            continue
        why = next((text for pattern, text in _NOISE if pattern.search(line)), "other start-up messages")
        noise[why] = noise.get(why, 0) + 1
    return shown, noise
