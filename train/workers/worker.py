"""A worker other than the chief, and what the chief sends it.

The chief trains as a single process does (train.training.fit) and tells the other workers its
run id, its starting state and its data fingerprint (`send_state`); each other worker receives them
(`receive_state`) and runs the same loop without writing anything (`run_worker`). A collective that
fails because a worker is gone becomes one WorkerLostError line (`cluster_errors`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import signal

from .. import models
from ..config import Settings
from ..errors import DataError, WorkerLostError
from ..inputs import pipeline as data
from ..training.loop import LoopState, Result, log_distribution, start_loop
from ..training.stop_flag import StopFlag

log = logging.getLogger("train")


def route_signals_again() -> None:
    """Starting MultiWorkerMirroredStrategy replaces the process's SIGTERM handler below Python
    (TensorFlow's own termination watcher), after which Python's handler never runs and SIGTERM is
    swallowed. Registering the same handlers again puts the stop flag back in charge."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if callable(handler):
            signal.signal(sig, handler)


@contextlib.contextmanager
def cluster_errors(setup):
    """A collective that fails because another worker is gone becomes one WorkerLostError line."""
    if setup is None or setup.workers < 2:
        yield
        return
    import tensorflow as tf

    lost = (
        tf.errors.UnavailableError,
        tf.errors.DeadlineExceededError,
        tf.errors.AbortedError,
        tf.errors.CancelledError,
    )
    try:
        yield
    except lost as exc:
        raise WorkerLostError(describe_lost(str(exc), setup.workers)) from None


def describe_lost(message: str, workers: int) -> str:
    """One line from TensorFlow's collective / coordination error text."""
    at = max(message.find("unhealthy"), message.find("remote target"))
    tasks = sorted({int(t) for t in re.findall(r"task:(\d+)", message[at : at + 200])}) if at >= 0 else []
    if "stopped sending heartbeats" in message or "heartbeat" in message.lower():
        why = "stopped sending heartbeats (killed, host lost or network down)"
    elif "deadline" in message.lower() or "timed out" in message.lower():
        why = "did not answer within the collective timeout"
    else:
        why = "is unreachable"
    who = ("worker " + ", ".join(map(str, tasks))) if tasks else "a worker"
    # The chief may have stopped on an error of its own (a run to resume that is not there): its log says.
    chief = " (the chief: its own log says why it stopped)" if tasks == [0] else ""
    return (
        f"{who} of {workers}{chief} {why}; training stopped. The chief's last checkpoint is kept: restart every "
        "worker with RESUME=auto to continue from it"
    )


def run_worker(settings: Settings, setup, stop: StopFlag, epochs: int) -> Result:
    """A worker other than the chief: the same steps, with the chief's run id, state and weights."""
    from . import sync

    run_id = sync.text_from_chief(setup.strategy, "")
    log.info("run %s: worker %d of %d; the chief writes the run directory", run_id, setup.worker_index, setup.workers)
    log.info(setup.describe())
    spec = data.load_data(settings)
    state, resumed = receive_state(setup, spec, settings)
    log_distribution(setup, state)
    loop = start_loop(
        settings,
        None,
        spec,
        setup,
        state,
        epochs,
        stop,
        chief=False,
        models=models,
        resumed=resumed,
    )
    result = loop.run()
    log.info("run %s ended: %s", run_id, result.status)
    return result


# What a worker receives of the chief's LoopState: every field, in order (a new field travels too);
# the float ones (a metric value or None) stay floats, the others are counts.
_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(LoopState))
_FLOAT_FIELDS = tuple(f.name for f in dataclasses.fields(LoopState) if "float" in str(f.type))


def _fingerprint_number(spec) -> int:
    return int(spec.fingerprint[:12], 16)  # 48 bits: exact as float64


def send_state(setup, spec, state: LoopState, resumed: bool) -> None:
    from . import sync

    sync.numbers_from_chief(
        setup.strategy, [float(resumed), _fingerprint_number(spec), *(getattr(state, f) for f in _STATE_FIELDS)]
    )
    other = sync.workers_with(setup.strategy, 0, setup.workers, False)  # the workers' answer to the fingerprint
    if other:
        raise DataError(
            f"worker {', '.join(map(str, other))} of {setup.workers} read(s) other data than the chief "
            f"({spec.name}: fingerprint {spec.fingerprint[:12]} here); give every worker the same data set"
        )


def receive_state(setup, spec, settings) -> tuple[LoopState, bool]:
    from . import sync

    got = sync.numbers_from_chief(setup.strategy, [0.0] * (2 + len(_STATE_FIELDS)))
    # Told to every worker, so the chief refuses the run too instead of waiting for this one.
    other = sync.workers_with(
        setup.strategy, setup.worker_index, setup.workers, int(got[1]) != _fingerprint_number(spec)
    )
    if setup.worker_index in other:
        raise DataError(
            f"worker {setup.worker_index} reads other data than the chief ({settings.dataset}: fingerprint "
            f"{spec.fingerprint[:12]} here, {int(got[1]):012x} on the chief); give every worker the same data set"
        )
    if other:
        raise DataError(
            f"worker {', '.join(map(str, other))} of {setup.workers} read(s) other data than the chief; "
            "give every worker the same data set"
        )
    values = dict(zip(_STATE_FIELDS, got[2:]))
    state = LoopState(**{k: (v if k in _FLOAT_FIELDS else int(v)) for k, v in values.items()})
    state.workers = setup.workers
    return state, bool(got[0])
