"""Device set-up, the first TensorFlow import: memory growth, seeds, precision, distribution.

`setup_devices` must run before anything touches a GPU and before a model is built: memory growth
and the precision policy cannot be changed afterwards (TensorFlow refuses to change an initialised
GPU, and layers built earlier keep the policy they were built with).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from ..errors import DeviceSetupError
from .hardware import (
    check_precision_fits_isa,
    choose_batch,
    choose_precision,
    cpu_family,
    cpu_flags,
    cpu_model,
    onednn_enabled,
    onednn_max_isa,
    onednn_state,
)

log = logging.getLogger("train")


@dataclass
class DeviceSetup:
    precision: str
    precision_reason: str
    gpus: list[str] = field(default_factory=list)
    compute_capabilities: list[tuple[int, int]] = field(default_factory=list)
    strategy: tf.distribute.Strategy | None = None
    replicas: int = 1
    workers: int = 1  # processes in the cluster (MultiWorkerMirroredStrategy when > 1)
    worker_index: int = 0
    group: Any = None  # several workers: what they share at the run's fixed points (train.workers.start.Group)
    # {"model", "family", "onednn"}: what the precision was chosen on, and the CPU kernels that ran it
    cpu: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        where = f"{len(self.gpus)} GPU(s): " + ", ".join(self.gpus) if self.gpus else "CPU"
        kernels = "" if self.gpus or "onednn" not in self.cpu else f"; oneDNN {self.cpu['onednn']}"
        return f"devices: {where}; precision {self.precision} ({self.precision_reason}){kernels}"


def _enable_memory_growth(gpus: list) -> None:
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as exc:  # "Physical devices cannot be modified after being initialized"
            raise DeviceSetupError(
                f"tf.config.experimental.set_memory_growth({gpu.name}) came too late: the GPU was already "
                f"initialised ({exc}); call train.setup.devices.setup_devices() before any TensorFlow op or model"
            ) from None


def _details(gpu) -> dict[str, Any]:
    try:
        return dict(tf.config.experimental.get_device_details(gpu))
    except Exception:  # details are best-effort: an unknown device never blocks training
        return {}


def setup_devices(settings, cluster=None, bf16_speedup=None, kept=None) -> DeviceSetup:
    """Apply memory growth, seeds, determinism and the precision policy; pick a strategy.

    With a multi-worker `cluster` (train.workers.cluster.Cluster) this joins it: it returns once every
    worker has started. `bf16_speedup`: PRECISION=auto's probe on a CPU with native bfloat16
    (hardware.choose_precision); None, the CPU's flags decide (a worker other than the chief, which
    then takes the chief's choice: train.workers.start). `kept`: a resumed run's recorded (policy,
    reason), which PRECISION=auto keeps where these devices run it natively."""
    gpus = tf.config.list_physical_devices("GPU")
    if settings.memory_growth:
        _enable_memory_growth(gpus)
    multi = None
    if cluster is not None and cluster.multi:
        multi = cluster.join()  # before any other op: the runtime starts with the cluster in it
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    ccs = [tuple(cc) for cc in (_details(g).get("compute_capability") for g in gpus) if cc]
    flags, max_isa = cpu_flags(), onednn_max_isa()
    policy, reason = choose_precision(
        settings.precision, ccs, flags, onednn_enabled(flags=flags), max_isa, bf16_speedup, kept
    )
    check_precision_fits_isa(policy, ccs, flags, max_isa)
    keras.mixed_precision.set_global_policy(policy)
    strategy = multi or (tf.distribute.MirroredStrategy() if len(gpus) > 1 else None)
    replicas = strategy.num_replicas_in_sync if strategy else 1
    if settings.batch_size % replicas:
        from ..errors import ConfigError

        raise ConfigError(
            "BATCH_SIZE",
            settings.batch_size,
            f"the global batch is split across {replicas} replicas: use a multiple of {replicas}",
        )
    names = [_details(g).get("device_name", g.name) for g in gpus]
    return DeviceSetup(
        precision=policy,
        precision_reason=reason,
        cpu={"model": cpu_model(), "family": cpu_family(flags, max_isa), "onednn": onednn_state(flags=flags)},
        gpus=names,
        compute_capabilities=ccs,
        strategy=strategy,
        replicas=replicas,
        workers=cluster.size if cluster is not None else 1,
        worker_index=cluster.index if cluster is not None else 0,
    )


def batch_choice(settings, bf16_speedup=None) -> tuple[int, float, str]:
    """(BATCH_SIZE, LEARNING_RATE, why) for a new run that sets neither (hardware.choose_batch), by the
    precision setup_devices will choose here: asked before any device is set up (listing the GPUs
    leaves them as they are), so that config.json holds the pair from the run's start."""
    default = (settings.batch_size, settings.learning_rate)
    if tf.config.list_physical_devices("GPU"):
        return choose_batch("", True, default)
    flags, max_isa = cpu_flags(), onednn_max_isa()
    policy, _ = choose_precision(settings.precision, [], flags, onednn_enabled(flags=flags), max_isa, bf16_speedup)
    return choose_batch(policy, False, default)


def gpu_memory() -> tuple[float | None, float | None]:
    """(MB TensorFlow holds on its GPUs now, the most it held since the last call), summed over the
    GPUs; (None, None) on a CPU. metrics.csv records it once per epoch.

    TensorFlow's own allocator counts: no driver query (nvidia-smi would be a subprocess per epoch)
    and nothing from the optional GPU check. A failure is an empty figure, never a failed epoch.
    """
    try:
        count = len(tf.config.list_logical_devices("GPU"))
        if not count:
            return None, None
        used = peak = 0.0
        for i in range(count):
            info = tf.config.experimental.get_memory_info(f"GPU:{i}")
            used, peak = used + info["current"] / 2**20, peak + info["peak"] / 2**20
            tf.config.experimental.reset_memory_stats(f"GPU:{i}")  # the next epoch's peak is its own
        return used, peak
    except Exception:  # a figure for the log: never fatal
        return None, None
