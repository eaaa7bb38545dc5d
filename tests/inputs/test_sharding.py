"""data.replica_dataset: each worker's slices of every global batch put back together are exactly the
global batches of train_dataset (any split, any cache mode, from any start step)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import first_fast

from train.config import Settings, validate
from train.inputs import images
from train.inputs import pipeline as data


def _settings(**kw) -> Settings:
    kw.setdefault("runs_dir", "/nonexistent-runs")
    return validate(Settings(**kw))


def _elements(ds):
    return [(x.numpy(), y.numpy(), int(n)) for x, y, n in ds]


def _global_batches(spec, s, epoch, batch, start=0):
    return [(x.numpy(), y.numpy()) for x, y in data.train_dataset(spec, s, epoch, batch, start_step=start)]


def _reassemble(spec, s, epoch, batch, replicas, per_worker, start=0, which="train"):
    """Run every worker's pipeline and glue the replicas' slices of each step back together."""
    workers = replicas // per_worker
    streams = [
        _elements(
            data.replica_dataset(
                spec,
                s,
                which,
                epoch,
                batch,
                start,
                replicas=replicas,
                first_replica=w * per_worker,
                local_replicas=per_worker,
            )
        )
        for w in range(workers)
    ]
    steps = len(streams[0]) // per_worker
    assert all(len(st) == steps * per_worker for st in streams)  # every worker runs the same number of steps
    out = []
    for k in range(steps):
        parts = [st[k * per_worker + r] for st in streams for r in range(per_worker)]
        assert len({n for _, _, n in parts}) == 1  # every replica knows the global batch's size
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        assert parts[0][2] == len(y)
        out.append((x, y))
    return out


@pytest.mark.parametrize("replicas, per_worker", [(1, 1), (2, 1), (2, 2), (4, 2), (3, 1)])
def test_slices_of_every_worker_make_the_global_batches(make_npz, replicas, per_worker):
    # VAL_SPLIT=0: all 100 training examples train, the batch sizes below are exact
    s = _settings(dataset=f"npz:{make_npz(n_train=100, n_test=30)}", seed=5, val_split=0.0, monitor="accuracy")
    spec = data.load_data(s)
    want = _global_batches(spec, s, epoch=2, batch=12)  # 8 full batches and one of 4: uneven slices
    got = _reassemble(spec, s, epoch=2, batch=12, replicas=replicas, per_worker=per_worker)
    assert len(got) == len(want) == 9
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


def test_from_a_start_step_and_for_validation(make_npz):
    s = _settings(dataset=f"npz:{make_npz(n_train=100, n_test=30)}", seed=5)
    spec = data.load_data(s)
    got = _reassemble(spec, s, epoch=1, batch=12, replicas=2, per_worker=1, start=5)
    want = _global_batches(spec, s, epoch=1, batch=12, start=5)
    assert [g[1].tolist() for g in got] == [w[1].tolist() for w in want]
    val = _reassemble(spec, s, epoch=0, batch=8, replicas=2, per_worker=1, which="val")
    want_val = [y.numpy() for _, y in data.val_dataset(spec, s, 8)]
    assert [v[1].tolist() for v in val] == [w.tolist() for w in want_val]


def test_a_last_batch_smaller_than_the_replicas_leaves_empty_slices(make_npz):
    s = _settings(dataset=f"npz:{make_npz(n_train=13, n_test=4, classes=2)}", seed=1, val_split=0.0, monitor="accuracy")
    spec = data.load_data(s)
    elements = _elements(data.replica_dataset(spec, s, "train", 0, 12, replicas=4, first_replica=3, local_replicas=1))
    assert [len(y) for _, y, _ in elements] == [3, 0]  # 12 = 3+3+3+3, then 1 = 1+0+0+0
    assert [n for _, _, n in elements] == [12, 1]


@pytest.mark.parametrize("cache", first_fast("memory", "file", "none"))
def test_every_cache_mode_slices_the_same_way(make_image_dir, tmp_path, cache, monkeypatch):
    decode, traced = images.decode_tensor, []
    monkeypatch.setattr(images, "decode_tensor", lambda *a: traced.append(a) or decode(*a))
    s = _settings(
        dataset=f"images:{make_image_dir()}", cache=cache, seed=3, image_size=16, runs_dir=str(tmp_path / "runs")
    )
    spec = data.load_data(s)
    got = _reassemble(spec, s, epoch=0, batch=16, replicas=2, per_worker=1)
    want = _global_batches(spec, s, epoch=0, batch=16)
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
    # The image shape is known before the first element: the steps are traced (and XLA-compiled) against it.
    ds = data.replica_dataset(spec, s, "train", 0, 16, replicas=2, first_replica=0, local_replicas=1)
    assert ds.element_spec[0].shape.as_list() == [None, 16, 16, 3]
    # Every pipeline above decodes through one trace of the decode per shape and process, not one each.
    assert len(traced) <= 1, len(traced)
