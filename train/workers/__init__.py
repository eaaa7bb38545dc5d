"""The workers extra: several machines (or processes) train one run on TensorFlow's own
MultiWorkerMirroredStrategy. Worker 0, the chief, alone writes the run directory; the others train
the same steps and write nothing (docs/distributed.md). Nothing beyond TensorFlow is needed.

settings.py   WORKERS, WORKER_INDEX, JOIN_TIMEOUT; the cluster checked as the settings load
cluster.py    which processes train together (TF_CONFIG, WORKERS + WORKER_INDEX or SkyPilot's variables)
join.py       waiting, interruptibly, until every worker has started
strategy.py   TensorFlow's join: MultiWorkerMirroredStrategy with bounded failure detection
start.py      `join(settings, stop, epochs)`, which train.training.fit calls first, and the `Group`
sync.py       what the chief knows, sent to every worker through the strategy
worker.py     a worker other than the chief: the chief's state received, a lost worker as one line

A fork that trains on one machine deletes this folder and its line in train/extras.py.
"""

from ..errors import ConfigError, TemplateError


class PortInUseError(ConfigError):
    """This worker's port (its entry in WORKERS / TF_CONFIG) is already bound by another process."""

    def __init__(self, name: str, address: str, port: int):
        self.name, self.value = name, address
        self.allowed = (
            f"port {port} is in use by another process on this host (another training, or a stale worker): stop it, "
            f"or give this worker a free port in {name} on every worker"
        )
        TemplateError.__init__(self, f"{name}: this worker's address {address}: {self.allowed}")
