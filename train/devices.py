"""Device set-up, the first TensorFlow import: memory growth, seeds, precision, distribution.

`setup_devices` must run before anything touches a GPU and before a model is built: memory growth
and the precision policy cannot be changed afterwards (DESIGN.md, "easy to get wrong").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from .errors import TemplateError
from .hardware import choose_precision, cpu_flags

log = logging.getLogger("train")


class DeviceSetupError(TemplateError):
    """A device setting could not be applied (usually: set after the GPU was initialised)."""

    exit_code = 1
    kind = "devices"


@dataclass
class DeviceSetup:
    precision: str
    precision_reason: str
    gpus: list[str] = field(default_factory=list)
    compute_capabilities: list[tuple[int, int]] = field(default_factory=list)
    memory_growth: bool = False
    strategy: tf.distribute.Strategy | None = None
    replicas: int = 1
    workers: int = 1  # processes in the cluster (MultiWorkerMirroredStrategy when > 1)
    worker_index: int = 0

    def describe(self) -> str:
        where = f"{len(self.gpus)} GPU(s): " + ", ".join(self.gpus) if self.gpus else "CPU"
        return f"devices: {where}; precision {self.precision} ({self.precision_reason})"


def _enable_memory_growth(gpus: list) -> None:
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError as exc:  # "Physical devices cannot be modified after being initialized"
            raise DeviceSetupError(
                f"tf.config.experimental.set_memory_growth({gpu.name}) came too late: the GPU was already "
                f"initialised ({exc}); call train.devices.setup_devices() before any TensorFlow op or model"
            ) from None


def _compute_capability(gpu) -> tuple[int, int] | None:
    try:
        cc = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    except Exception:  # details are best-effort: an unknown device never blocks training
        return None
    return tuple(cc) if cc else None


def setup_devices(settings) -> DeviceSetup:
    """Apply memory growth, seeds, determinism and the precision policy; pick a strategy."""
    gpus = tf.config.list_physical_devices("GPU")
    if settings.memory_growth:
        _enable_memory_growth(gpus)
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    ccs = [cc for cc in (_compute_capability(g) for g in gpus) if cc]
    policy, reason = choose_precision(settings.precision, ccs, cpu_flags())
    keras.mixed_precision.set_global_policy(policy)
    strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else None
    names = []
    for g in gpus:
        try:
            names.append(tf.config.experimental.get_device_details(g).get("device_name", g.name))
        except Exception:
            names.append(g.name)
    return DeviceSetup(
        precision=policy,
        precision_reason=reason,
        gpus=names,
        compute_capabilities=ccs,
        memory_growth=bool(gpus) and settings.memory_growth,
        strategy=strategy,
        replicas=strategy.num_replicas_in_sync if strategy else 1,
    )
