"""Several worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy): a run, its artefacts, signals, kills.

Each worker gets its own working directory and RUNS_DIR (no shared disk). Waits are for events
(a process exiting, a checkpoint appearing); the subprocess timeouts only guard against a hang.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from builders import write_tiny_npz
from faults import env, fit_flags, manifest, only_run, wait_until, with_constants
from helpers import free_local_ports

from train.errors import DataError, WorkerLostError

pytestmark = pytest.mark.slow

HANG_GUARD = 600  # seconds: only reached when something hangs
# 384 examples, global batch 32: 12 steps per epoch, 48 in all (room for a signal to land mid-run on a
# loaded machine), checkpoints every 4 steps.
RUN = dict(epochs=4, batch_size=32, checkpoint_every=4, deterministic=True, precision="float32", export=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_npz(tmp_path_factory.mktemp("data"))


def start_workers(
    tmp_path: Path,
    data: Path | list[Path],
    n: int = 2,
    extra: list[str] | None = None,
    scripts: dict[int, str] | None = None,
    constants: dict | None = None,
    **changes,
):
    """n `python -m train fit` processes, one cluster; each in tmp_path/w<i> with its own RUNS_DIR
    (and its own data set when `data` is a list of them; worker i runs `python -c scripts[i] fit ...`;
    `constants`, dotted name -> value, are set in every worker first)."""
    workers = ",".join(f"127.0.0.1:{p}" for p in free_local_ports(n))
    procs = []
    for i in range(n):
        cwd = tmp_path / f"w{i}"
        cwd.mkdir(exist_ok=True)
        out = open(cwd / "out.txt", "a")
        flags = fit_flags(cwd, data[i] if isinstance(data, list) else data, **{**RUN, **changes})
        start = ["-c", scripts[i]] if scripts and i in scripts else ["-m", "train"]
        if constants:
            start = ["-c", with_constants(constants, scripts[i] if scripts and i in scripts else None)]
        proc = subprocess.Popen(
            [sys.executable, *start, "fit", *flags, *(extra or [])],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env(WORKERS=workers, WORKER_INDEX=str(i)),
        )
        proc.out_path = cwd / "out.txt"
        procs.append(proc)
    return procs


def text(proc) -> str:
    return proc.out_path.read_text()


def wait_all(procs) -> list[int]:
    return [p.wait(timeout=HANG_GUARD) for p in procs]


def final_weights(run: Path) -> list[np.ndarray]:
    import h5py

    out = []
    with h5py.File(run / "final.weights.h5", "r") as f:
        f.visititems(lambda name, obj: out.append(np.asarray(obj)) if isinstance(obj, h5py.Dataset) else None)
    return out


MIRRORED = """
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from train.setup import devices
real = devices.setup_devices
def two_replicas(settings, cluster=None, **probes):
    setup = real(settings, **probes)
    setup.strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    setup.replicas = 2
    return setup
devices.setup_devices = two_replicas
from faults import fit_flags
from train.cli import main
sys.exit(main(["fit", *sys.argv[1:]]))
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("pair")
    # With a profile of steps 2-3: the chief alone writes it (one pair for both checks)
    procs = start_workers(tmp, data, export=True, profile="steps", profile_steps="2:4")
    codes = wait_all(procs)
    return tmp, procs, codes


def test_two_workers_finish_and_only_the_chief_writes(pair):
    tmp, procs, codes = pair
    assert codes == [0, 0], [text(p)[-3000:] for p in procs]
    run = only_run(tmp / "w0" / "runs")
    m = manifest(run)
    assert m["status"] == "completed" and m["epochs_completed"] == 4
    assert m["distribution"][-1] == {
        "workers": 2,
        "worker_index": 0,
        "replicas": 2,
        "global_batch": 32,
        "per_replica_batch": 16,
        "from_global_step": 0,
    }
    assert m["export"]["max_abs_diff"] <= 1e-5
    for name in (
        "final.weights.h5",
        "best.weights.h5",
        "metrics.csv",
        "train.log",
        "config.json",
        "checkpoints/LATEST",
        "export/savedmodel/saved_model.pb",
        "tensorboard",
    ):
        assert (run / name).exists(), name
    assert not (tmp / "w1" / "runs").exists() or not any((tmp / "w1" / "runs").iterdir())
    worker = text(procs[1])
    assert f"run {run.name}: worker 1 of 2" in worker and "[worker 1]" in worker
    assert "2 worker(s), this is worker 1, 2 replica(s) in sync, global batch 32, 16 per replica" in worker
    assert "Traceback" not in worker + text(procs[0])
    # The test split: evaluated by the chief alone (a plain copy of the model, no collective), once per weights file
    assert set(m["test"]["weights"]) == {"best", "final"} and m["test"]["examples"] == 128
    assert "test (128 examples): accuracy=" in text(procs[0]) and "test (" not in worker
    # The profile: the chief's, in its run's tensorboard folder; none from the worker
    assert len(list((run / "tensorboard").glob("plugins/profile/*/*.xplane.pb"))) == 1
    assert list((tmp / "w1").rglob("*.xplane.pb")) == []
    assert "profile of steps 2-3 written to" in text(procs[0]) and "profile of" not in worker


def test_two_workers_match_one_process_with_two_replicas(pair, data, tmp_path):
    tmp, _, codes = pair
    assert codes == [0, 0]
    flags = fit_flags(tmp_path, data, **RUN)
    proc = subprocess.run(
        [sys.executable, "-c", MIRRORED, *flags],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one = final_weights(only_run(tmp_path / "runs"))
    two = final_weights(only_run(tmp / "w0" / "runs"))
    assert len(one) == len(two)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(one, two))
    print(f"\nFIGURES max |weight difference| 2 workers vs 1 process x 2 replicas: {diff:.3g}")
    assert diff <= 1e-5


def _saved_at(out: str) -> str | None:
    import re

    m = re.search(r"saved a resumable state at (epoch \d+ step \d+)", out)
    return m.group(1) if m else None


def _wait_for_checkpoint(procs, runs: Path, name: str = "ckpt-000000004.npz") -> None:
    assert wait_until(lambda: bool(list(runs.glob(f"*/checkpoints/{name}"))), procs[0], timeout=HANG_GUARD), text(
        procs[0]
    )[-3000:]


def test_sigterm_to_one_worker_stops_both_at_the_same_step_and_the_resumed_pair_matches(pair, data, tmp_path):
    reference = manifest(only_run(pair[0] / "w0" / "runs"))["final_weights_sha256"]
    procs = start_workers(tmp_path, data)
    _wait_for_checkpoint(procs, tmp_path / "w0" / "runs")
    procs[1].send_signal(signal.SIGTERM)
    assert wait_all(procs) == [75, 75], [text(p)[-3000:] for p in procs]
    chief, worker = text(procs[0]), text(procs[1])
    assert "received SIGTERM" in worker and "Traceback" not in chief + worker
    assert _saved_at(chief) is not None and _saved_at(chief) == _saved_at(worker), (_saved_at(chief), _saved_at(worker))
    run = only_run(tmp_path / "w0" / "runs")
    assert manifest(run)["status"] == "interrupted"
    # Restart the pair with RESUME=auto: the chief finds the run, the worker follows it.
    procs = start_workers(tmp_path, data, resume="auto")
    assert wait_all(procs) == [0, 0], [text(p)[-3000:] for p in procs]
    assert only_run(tmp_path / "w0" / "runs") == run
    m = manifest(run)
    assert m["status"] == "completed" and len(m["resumed_at"]) == 1
    assert m["final_weights_sha256"] == reference
    assert "retracing" not in text(procs[0]) + text(procs[1])  # the chief's broadcasts are traced once


# The coordination service notices a dead worker when its heartbeats stop: 10 s instead of the
# product's 30 in the tests that wait for that (the wait is for the event, never a sleep).
QUICK_HEARTBEAT = {"train.workers.strategy.HEARTBEAT_SECONDS": 10}


def test_sigkill_of_a_worker_ends_the_other_with_one_line_and_the_run_is_interrupted(data, tmp_path):
    """The pair's restart from such a state is the SIGTERM test's (the same restore path)."""
    procs = start_workers(tmp_path, data, constants=QUICK_HEARTBEAT)
    _wait_for_checkpoint(procs, tmp_path / "w0" / "runs")
    procs[1].kill()
    # Bounded by the coordination service's heartbeat timeout (train.workers.strategy.HEARTBEAT_SECONDS); the
    # subprocess timeout only guards against a hang.
    assert procs[0].wait(timeout=HANG_GUARD) == WorkerLostError.exit_code, text(procs[0])[-3000:]
    chief = text(procs[0])
    # "stopped sending heartbeats" when the heartbeat notices first, "is unreachable" when a collective does
    assert "WorkerLostError: worker 1 of 2 " in chief and "Traceback" not in chief
    run = only_run(tmp_path / "w0" / "runs")
    m = manifest(run)
    assert m["status"] == "interrupted" and m["error"].startswith("WorkerLostError"), m


def test_sigkill_of_the_chief_ends_the_worker_with_one_line(data, tmp_path):
    procs = start_workers(tmp_path, data, constants=QUICK_HEARTBEAT)
    _wait_for_checkpoint(procs, tmp_path / "w0" / "runs")
    procs[0].kill()
    assert procs[1].wait(timeout=HANG_GUARD) == WorkerLostError.exit_code, text(procs[1])[-3000:]
    assert "WorkerLostError: worker 0 of 2" in text(procs[1]) and "Traceback" not in text(procs[1])


def test_a_worker_with_other_data_than_the_chief_is_refused_on_every_worker(data, tmp_path):
    other = write_tiny_npz(tmp_path, "other.npz", seed=1)  # same shape and classes, other examples
    procs = start_workers(tmp_path, [data, other])
    assert wait_all(procs) == [DataError.exit_code] * 2, [text(p)[-3000:] for p in procs]
    chief, worker = text(procs[0]), text(procs[1])
    assert "DataError: worker 1 reads other data than the chief" in worker
    assert "DataError: worker 1 of 2 read(s) other data than the chief" in chief
    assert "Traceback" not in chief + worker
    run = only_run(tmp_path / "w0" / "runs")
    assert manifest(run)["status"] == "failed" and not list(run.glob("checkpoints/ckpt-*"))


LEAVES_AFTER_THE_STATE = """
import os, sys
from train.workers import worker
real = worker.receive_state
def receive_and_leave(*args):
    real(*args)
    os._exit(0)  # gone before the model's variables are broadcast
worker.receive_state = receive_and_leave
from train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_worker_lost_while_the_model_is_built_is_a_lost_worker_not_a_model_error(data, tmp_path):
    procs = start_workers(tmp_path, data, scripts={1: LEAVES_AFTER_THE_STATE}, constants=QUICK_HEARTBEAT)
    assert procs[0].wait(timeout=HANG_GUARD) == WorkerLostError.exit_code, text(procs[0])[-3000:]
    procs[1].wait(timeout=HANG_GUARD)
    chief = text(procs[0])
    assert "WorkerLostError: worker 1 of 2 " in chief and "ModelError" not in chief and "Traceback" not in chief


def test_sigterm_to_invoke_train_with_local_workers_stops_and_saves_both(data, tmp_path):
    """`kill` of `invoke train --local --workers 2` (a cancelled CI job, systemd) stops both workers as a
    Ctrl-C does: invoke alone would die, and its terminal with it would take the workers unsaved."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "tasks.py").is_file():
        pytest.skip("tasks.py is a host-side file (not in the image)")
    pytest.importorskip("invoke")
    flags = shlex.join(fit_flags(tmp_path, data, **{**RUN, "epochs": 50}))
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "invoke", "-r", str(root), "train", "--local", "--workers", "2", "--args", flags],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env(),
        )
    assert wait_until(lambda: "[worker 0] epoch 1/" in out.read_text(errors="replace"), proc, HANG_GUARD)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_GUARD) == 75, out.read_text(errors="replace")[-3000:]
    said = out.read_text(errors="replace")
    assert all(f"[worker {i}] received SIGINT" in said for i in (0, 1)) and "Traceback" not in said, said[-3000:]
    assert manifest(only_run(tmp_path / "runs"))["status"] == "interrupted"


@pytest.mark.parametrize(
    "tasks, who",
    [
        ("/job:worker/replica:0/task:0", "worker 0 of 2 (the chief: its own log says why it stopped) is unreachable"),
        ("/job:worker/replica:0/task:1", "worker 1 of 2 is unreachable"),
    ],
)
def test_a_lost_chief_is_named_as_the_chief_whose_log_says_why(tasks, who):
    """It may have stopped on an error of its own (a --resume of a run that is not there): the worker's
    line sent the user to restart every worker, with nothing to say the chief's log holds the cause."""
    from train.workers.worker import describe_lost

    said = describe_lost(
        f"Collective ops is aborted by: ... Additional GRPC error information from remote target {tasks}", 2
    )
    assert said == (
        f"{who}; training stopped. The chief's last checkpoint is kept: restart every worker with RESUME=auto "
        "to continue from it"
    )
