"""8. What the all-reduce costs per step: 2 workers x 1 thread vs 1 process x 2 threads, same global batch.

Both sides are `python -m train fit` on the default CNN and MNIST-shaped data, 2 epochs, the
second epoch timed (the first includes tracing). One process uses 2 intra-op threads on the whole
batch; two workers on 127.0.0.1 use 1 thread each on half the batch and all-reduce the gradients
(and the step's metric sums) every step. The difference per step is the price of the collective and
of the lock-step between processes, on CPU over loopback gRPC.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time

import common
import pytest

sys.path.insert(0, str(common.ROOT / "tests"))  # helpers: free ports for the two workers
from helpers import free_local_ports  # noqa: E402

GLOBAL_BATCH = 128
HANG = 3600  # seconds: a pair of workers that has not ended by then hangs
# A worker's port taken by another process between its choice and the worker's bind (PortInUseError):
# the pair starts again on new ports, up to this many times.
PORT_ATTEMPTS = 3
PORT_TAKEN = "is in use by another process"


def _env(threads: int, **extra: str) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("WORKERS", "WORKER_INDEX", "TF_CONFIG")}
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(common.ROOT),
        TF_NUM_INTRAOP_THREADS=str(threads),
        TF_NUM_INTEROP_THREADS="1",
        OMP_NUM_THREADS=str(threads),
        **extra,
    )
    return env


def _flags(npz, runs) -> list[str]:
    return [
        "fit",
        "--dataset",
        f"npz:{npz}",
        "--runs-dir",
        str(runs),
        "--epochs",
        "2",
        "--batch-size",
        str(GLOBAL_BATCH),
        "--no-export",
        "--progress",
        "line",
        "--checkpoint-every",
        "0",
        "--precision",
        "float32",
        # Neither is timed, both cost each process seconds: the report's pictures and the peak probe.
        "--report",
        "off",
        "--peak-flops",
        "1e12",
    ]


def _ms_per_step(runs, n_train: int) -> float:
    (run,) = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]  # .cache holds the measured peak
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    steps = -(-n_train // GLOBAL_BATCH)
    return float(rows[-1]["epoch_seconds"]) / steps * 1000


def _start_pair(npz, runs, other_runs, logs) -> list[subprocess.Popen]:
    """The two workers on ports free now, each writing its output to its log."""
    workers = ",".join(f"127.0.0.1:{p}" for p in free_local_ports(2))
    procs = []
    for i, log in enumerate(logs):
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "train", *_flags(npz, runs if i == 0 else other_runs)],
                    env=_env(1, WORKERS=workers, WORKER_INDEX=str(i)),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def _pair(procs: list[subprocess.Popen]) -> list[int]:
    """The workers' exit codes, once both have ended. One that fails ends the other (which would wait
    JOIN_TIMEOUT or a collective's timeout for it); a pair that hangs is ended before the test fails."""
    deadline = time.monotonic() + HANG
    while None in (codes := [p.poll() for p in procs]):  # each polled: any() would stop at the first running
        hung = time.monotonic() >= deadline
        if hung or any(code not in (None, 0) for code in codes):
            _end(procs)
        assert not hung, f"the two workers did not end in {HANG} s"
        time.sleep(0.5)
    return codes


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.processes
def test_allreduce_cost_per_step(benchmark, mnist, mnist_npz, quick, tmp_path):
    n_train = len(mnist[0]["y_train"])
    rounds = {"one": 0, "two": 0}

    def one_process() -> float:
        rounds["one"] += 1
        runs = tmp_path / f"one{rounds['one']}"
        proc = subprocess.run(
            [sys.executable, "-m", "train", *_flags(mnist_npz, runs)],
            env=_env(2),
            capture_output=True,
            text=True,
            timeout=HANG,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return _ms_per_step(runs, n_train)

    def two_workers() -> float:
        rounds["two"] += 1
        attempt = 0
        while True:
            attempt += 1
            runs = tmp_path / f"two{rounds['two']}.{attempt}"
            logs = [tmp_path / f"two{rounds['two']}.{attempt}-worker{i}.log" for i in range(2)]
            if _pair(_start_pair(mnist_npz, runs, tmp_path / "none", logs)) == [0, 0]:
                return _ms_per_step(runs, n_train)
            text = [log.read_text(errors="replace") for log in logs]
            assert attempt < PORT_ATTEMPTS and any(PORT_TAKEN in t for t in text), "the two workers failed:\n" + (
                "\n".join(t[-3000:] for t in text)
            )

    got = common.once(
        benchmark,
        lambda: common.interleave(
            {"1 process x 2 threads": one_process, "2 workers x 1 thread": two_workers}, 1 if quick else 2
        ),
    )
    one, two = common.median(got["1 process x 2 threads"]), common.median(got["2 workers x 1 thread"])
    common.record(
        benchmark,
        "8. ms/step: 2 workers x 1 thread / 1 process x 2 threads (same global batch)",
        "reported",
        common.ratio(two, one),
        None,
        global_batch=GLOBAL_BATCH,
        n_train=n_train,
        one_process_ms_per_step=one,
        two_workers_ms_per_step=two,
        allreduce_ms_per_step=two - one,
        ms_per_step=got,
    )
