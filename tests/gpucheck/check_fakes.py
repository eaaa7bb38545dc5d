"""Faked facts for the train.gpucheck.check tests: build info, libraries, TensorFlow log lines, and Facts as
collected on the machines whose nvidia-smi answers are recorded in tests/gpucheck/fixtures."""

from __future__ import annotations

from test_gpuinfo import recorded_smi

from train.gpucheck import gpuinfo
from train.gpucheck.facts import Facts, LibFact, TfFacts

CUDA_BUILD = {
    "is_cuda_build": True,
    "cuda_version": "12.5.1",
    "cudnn_version": "9",
    "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
}
CPU_BUILD = {"is_cuda_build": False, "is_rocm_build": False, "is_tensorrt_build": False}
LIBS_OK = [
    LibFact("cudart", "libcudart.so.12", "/venv/nvidia/cuda_runtime/lib/libcudart.so.12", "12.5"),
    LibFact("cublas", "libcublas.so.12", "/venv/nvidia/cublas/lib/libcublas.so.12", "12.5.3"),
    LibFact("cudnn", "libcudnn.so.9", "/venv/nvidia/cudnn/lib/libcudnn.so.9", "9.3.0"),
]
# What TensorFlow's CUDA build prints on a machine without a GPU (the "cuInit noise").
CUINIT_NOISE = [
    "2024-03-12 09:41:30.118211: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:282] failed call to "
    "cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected",
    "2024-03-12 09:41:30.118274: I external/local_xla/xla/stream_executor/cuda/cuda_diagnostics.cc:134] retrieving "
    "CUDA diagnostic information for host: 3f2a9c1b7d4e",
    "2024-03-12 09:41:29.905112: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different computation orders.",
]
DLOPEN_ERRORS = [
    "2023-11-29 14:02:15.441871: W tensorflow/compiler/xla/stream_executor/platform/default/dso_loader.cc:64] Could "
    "not load dynamic library 'libcudnn.so.8'; dlerror: libcudnn.so.8: cannot open shared object file: No such file "
    "or directory",
    "2023-11-29 14:02:15.442093: W tensorflow/core/common_runtime/gpu/gpu_device.cc:1960] Cannot dlopen some GPU "
    "libraries. Please make sure the missing libraries mentioned above are installed properly if you would like to "
    "use GPU. Follow the guide at https://www.tensorflow.org/install/gpu for how to download and setup the required "
    "libraries for your platform.",
]


def tf_gpus(n: int = 1, cc=(9, 0), name: str = "NVIDIA H100 80GB HBM3") -> list[dict]:
    return [
        {"name": f"/physical_device:GPU:{i}", "device_name": name, "compute_capability": list(cc)} for i in range(n)
    ]


def cuda_tf(**kw) -> TfFacts:
    return TfFacts(version="2.21.0", build=dict(CUDA_BUILD), **kw)


def cpu_tf(**kw) -> TfFacts:
    return TfFacts(version="2.21.0", build=dict(CPU_BUILD), **kw)


def on(machine: str, tf: TfFacts, **kw) -> Facts:
    """Facts as collected on a machine whose nvidia-smi answers are recorded in tests/gpucheck/fixtures."""
    p = gpuinfo.probe(nvml=None, run=recorded_smi(machine))
    kw.setdefault("libraries", LIBS_OK if tf.build.get("is_cuda_build") else [])
    kw.setdefault("nvidia_pci_devices", len(p.gpus))
    return Facts(tf=tf, driver_present=p.driver_present, driver_reason=p.reason, gpus=p.gpus, **kw)


def codes(report: dict) -> dict[str, dict]:
    return {d["code"]: d for d in report["diagnoses"]}
