"""The workers extra's settings: the processes that train one run together, checked before TensorFlow."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from ..sections import setting


@dataclass(frozen=True)
class Section:
    """several machines, one run (TF_CONFIG, when set by a launcher, is read as TensorFlow defines it; docs/distributed.md)"""

    workers: str = setting(
        "",
        "host:port of every worker, chief first, comma-separated (builds TF_CONFIG); empty: one process",
        kind="free",
    )
    worker_index: int = setting(
        -1, "this worker's place in WORKERS, 0 = the chief (-1: not set)", min=-1, max=10000, kind="free"
    )
    join_timeout: float = setting(
        900.0,
        "several workers: seconds to wait for every worker to start before giving up with exit 11 (0: no limit)",
        min=0.0,
        kind="free",
    )


# Settings that change what is trained, yet need not match on every worker: a worker takes the
# chief's BATCH_SIZE (its loop state) and PRECISION (at the join); DATASET may be another path to the
# same file on another host (the data's fingerprint is compared instead) and CACHE is only how a
# worker keeps the decoded examples.
NOT_SHARED = frozenset({"batch_size", "precision", "dataset", "cache"})
# Settings of kind `free` (a resume may change them) that each worker's own loop reads to decide when
# it checkpoints and stops: another value on one worker has it make a collective call the others
# never make, and TensorFlow then waits for ever (or aborts with a collective's traceback).
LOOP = ("epochs", "patience", "min_delta", "checkpoint_every", "steps_per_execution")


def shared(settings) -> dict[str, object]:
    """The settings every worker must be started with alike (compared at the join, before TensorFlow):
    another SEED or VAL_SPLIT would train on other batches and validate on examples another worker
    trains on, another LEARNING_RATE or MODEL would let the workers' weights drift apart, all silently."""
    from ..config import of_kind, unused_settings

    # A setting that does nothing for this data set (IMAGE_SIZE for MNIST) may differ: another value
    # left in one worker's .env changes nothing.
    names = sorted((of_kind("result") - NOT_SHARED - unused_settings(settings.to_dict())) | set(LOOP))
    values = {name: getattr(settings, name) for name in names}
    if settings.smoke:
        values["epochs"] = 1  # SMOKE trains one epoch whatever EPOCHS says
    return values


def check_environ(settings, environ: Mapping[str, str]):
    """The cluster (TF_CONFIG, WORKERS/WORKER_INDEX or SkyPilot's variables) and the batch it splits,
    checked when the settings are loaded, before TensorFlow is imported; None when nothing asks for
    several workers (one process)."""
    asked = settings.workers.strip() or settings.worker_index >= 0
    if not asked and not any(environ.get(name, "").strip() for name in ("TF_CONFIG", "SKYPILOT_NODE_IPS")):
        return None
    from .cluster import read_cluster

    cluster = read_cluster(settings.workers, settings.worker_index, environ)
    if settings.batch_size % cluster.size:
        raise ConfigError(
            "BATCH_SIZE",
            settings.batch_size,
            f"the global batch is split across {cluster.size} workers: use a multiple of {cluster.size}",
        )
    return cluster
