"""9. Input pipeline alone: training samples/s that `train_dataset` delivers from its memory cache.

The rate a GPU can be fed at, beside the FLOP ceilings in docs/performance.md (MFU): when the model
would go faster than this, the pipeline (and the host's CPU cores) set the pace.
"""

from __future__ import annotations

import time

import common


def test_pipeline_samples_per_second(benchmark, mnist_npz, quick, tmp_path):
    from train.inputs.pipeline import load_data, train_dataset

    s = common.settings(dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"))
    spec = load_data(s)

    def rate(batch: int) -> float:
        for _ in train_dataset(spec, s, epoch=0, batch_size=batch).take(2):  # warm-up: the cache, the threads
            pass
        t0, n = time.perf_counter(), 0
        for x, _ in train_dataset(spec, s, epoch=1, batch_size=batch):
            n += int(x.shape[0])
        return n / (time.perf_counter() - t0)

    got = common.once(
        benchmark,
        lambda: common.interleave({"batch 128": lambda: rate(128), "batch 512": lambda: rate(512)}, 1 if quick else 3),
    )
    sps = {k: common.median(v) for k, v in got.items()}
    common.record(
        benchmark,
        "9. input pipeline alone: samples/s at batch 512 / batch 128",
        "reported",
        common.ratio(sps["batch 512"], sps["batch 128"]),
        None,
        samples_per_second=sps,
        n_train=spec.n_train,
    )
