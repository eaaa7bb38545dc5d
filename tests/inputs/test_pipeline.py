"""train.inputs.pipeline on .npz and built-in data sets: verification up front, reproducible, resumable order."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from builders import write_npz
from helpers import NO_REAL_MNIST, REAL_MNIST, free_local_ports

from train.config import Settings, validate
from train.errors import DataError
from train.inputs import pipeline as data
from train.inputs.arrays import split_indices


def settings(**kw) -> Settings:
    kw.setdefault("runs_dir", "/nonexistent-runs")
    return validate(Settings(**kw))


def batches(ds) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


def test_npz_round_trip(make_npz):
    path = make_npz()
    s = settings(dataset=f"npz:{path}", batch_size=64)
    spec = data.load_data(s)
    # VAL_SPLIT=0.1 of each class of the 600 training examples validates; the test split stays apart
    shape = (spec.input_shape, spec.num_classes, spec.n_train, spec.n_val, spec.n_test, spec.val_from)
    assert shape == ((28, 28, 1), 10, 539, 61, 300, "train")
    assert spec.class_names == tuple(str(i) for i in range(10))
    assert spec.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "_Split" not in repr(spec) and "array" not in repr(spec)
    with np.load(path) as z:
        x_train, y_train, x_test, y_test = z["x_train"], z["y_train"], z["x_test"], z["y_test"]
    ds = data.val_dataset(spec, s, 64)
    first_x, first_y = next(iter(ds))
    assert first_x.dtype.name == "float32" and first_y.dtype.name == "int32"
    assert first_x.shape == (61, 28, 28, 1)
    _, val = split_indices(y_train.astype(np.int32), 0.1, s.seed)
    x, y = batches(ds)
    np.testing.assert_array_equal(x[..., 0], x_train[val].astype(np.float32))
    np.testing.assert_array_equal(y, y_train[val])
    x, y = batches(data.final_test_dataset(spec, 64))
    np.testing.assert_array_equal(x[..., 0], x_test.astype(np.float32))
    np.testing.assert_array_equal(y, y_test)
    train_x, _ = batches(data.train_dataset(spec, s, epoch=0, batch_size=64))
    assert len(train_x) == 539 and data.steps_per_epoch(spec, 64) == 9  # last batch partial: 539 = 8*64 + 27


def test_validation_is_a_stratified_seeded_share_of_the_training_split_never_a_test_example(make_npz):
    s = settings(dataset=f"npz:{make_npz()}", val_split=0.2, seed=7)
    spec = data.load_data(s)
    with np.load(s.dataset[4:]) as z:
        per_class = np.bincount(z["y_train"], minlength=10)
    assert np.bincount(spec._val.y, minlength=10).tolist() == [round(n * 0.2) for n in per_class]  # per class
    assert (spec.n_train + spec.n_val, spec.n_test) == (600, 300)
    train_rows = {r.tobytes() for r in spec._train.x}
    val_rows = {r.tobytes() for r in spec._val.x}
    test_rows = {r.tobytes() for r in spec._test.x}
    assert not (train_rows & val_rows) and not (val_rows & test_rows)
    np.testing.assert_array_equal(spec._val.y, data.load_data(s)._val.y)  # the same split every time
    assert not np.array_equal(spec._val.x, data.load_data(settings(dataset=s.dataset, val_split=0.2, seed=8))._val.x)


def test_val_split_0_trains_on_every_training_example_and_keeps_the_test_split(make_npz):
    spec = data.load_data(settings(dataset=f"npz:{make_npz()}", val_split=0.0, monitor="accuracy"))
    assert (spec.n_train, spec.n_val, spec.n_test) == (600, 0, 300)


def test_a_val_split_too_small_for_any_class_is_refused(tmp_path):
    y = np.arange(30, dtype=np.uint8) % 10  # 3 per class: round(0.1 * 3) = 0
    path = write_npz(tmp_path / "few.npz", n_train=30, n_test=10, y_train=y)
    with pytest.raises(DataError, match=r"VAL_SPLIT=0.1 of 3 examples in the largest class leaves no example"):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_an_npz_path_with_a_colon_loads_and_the_data_line_says_what_was_loaded(tmp_path, caplog):
    path = write_npz(tmp_path / "run:2" / "toy:v1.npz")  # only the first colon separates the kind
    with caplog.at_level("INFO", logger="train"):
        spec = data.load_data(settings(dataset=f"npz:{path}"))
    assert spec.source == str(path)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("data: "))
    assert line == (
        f"data: npz:{path} from {path}: 539 train / 61 val (from train) / 300 test, shape (28, 28, 1), 10 classes, "
        f"fingerprint {spec.fingerprint[:16]}"
    )


def test_builtin_from_data_dir_cifar_labels_flattened(tmp_path):
    y = np.arange(600, dtype=np.uint8).reshape(-1, 1) % 10
    write_npz(tmp_path / "cifar10.npz", shape=(32, 32, 3), y_train=y, y_test=y[:300])
    spec = data.load_data(settings(dataset="cifar10", data_dir=str(tmp_path)))
    assert spec.input_shape == (32, 32, 3) and spec.class_names[0] == "airplane"
    assert spec.source == str(tmp_path / "cifar10.npz")
    train, _ = split_indices(y[:, 0].astype(np.int32), 0.1, 42)
    np.testing.assert_array_equal(spec._train.y, y[train, 0])


def test_builtin_with_wrong_shape_is_refused(tmp_path):
    write_npz(tmp_path / "mnist.npz", shape=(32, 32, 3))
    with pytest.raises(DataError, match=r"images are \(32, 32, 3\) but mnist has \(28, 28, 1\); is it the right file"):
        data.load_data(settings(dataset="mnist", data_dir=str(tmp_path)))


@pytest.mark.parametrize(
    "returned, got",
    [
        ({"x_train": np.zeros((4, 8, 8, 1), np.uint8), "y_train": np.arange(4)}, "no array(s) x_test, y_test"),
        (None, "NoneType"),
    ],
)
def test_a_loader_that_returns_no_keras_layout_is_named(tmp_path, monkeypatch, returned, got):
    """A fork's register(Dataset(...)) loader that forgets the test split, or its return: one line, not a KeyError."""
    from train import datasets

    monkeypatch.setitem(
        datasets.DATASETS, "toy", datasets.Dataset("toy", (8, 8, 1), ("a", "b"), lambda cache: returned)
    )
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset="toy", data_dir=str(tmp_path)))
    assert str(e.value) == (
        f"the loader of toy returned {got}; a loader returns the Keras layout, a dict of x_train, y_train, x_test, "
        "y_test (fix its register(Dataset(...)) loader)"
    )


def test_an_npz_may_name_its_classes(make_npz):
    names = np.array([f"digit {i}" for i in range(10)])
    s = settings(dataset=f"npz:{make_npz(class_names=names)}")
    spec = data.load_data(s)
    assert spec.class_names == tuple(f"digit {i}" for i in range(10)) and spec.name == s.dataset


def test_offline_builtin_names_the_file(tmp_path, monkeypatch):
    from train import datasets

    # The real loader and keras.utils.get_file, pointed at a loopback port where nothing listens.
    monkeypatch.setattr(datasets, "_FASHION", f"http://127.0.0.1:{free_local_ports(1)[0]}/")
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset="fashion_mnist", data_dir=str(tmp_path / "data")))
    assert "put fashion_mnist.npz (Keras format" in str(e.value) and "URL fetch failure" in str(e.value)
    assert str(tmp_path / "data" / "fashion_mnist.npz") in str(e.value)


def test_epoch_order_is_resumable_and_independent_of_global_seed(make_npz):
    import tensorflow as tf

    s = settings(dataset=f"npz:{make_npz()}", seed=7)
    spec = data.load_data(s)
    tf.random.set_seed(1)
    full_x, full_y = batches(data.train_dataset(spec, s, epoch=2, batch_size=32))
    tf.random.set_seed(2)  # a resumed process: other global seed, rebuilt spec and pipeline
    spec2 = data.load_data(s)
    k = 5
    tail_x, tail_y = batches(data.train_dataset(spec2, s, epoch=2, batch_size=32, start_step=k))
    np.testing.assert_array_equal(tail_x, full_x[k * 32 :])
    np.testing.assert_array_equal(tail_y, full_y[k * 32 :])
    _, other_y = batches(data.train_dataset(spec, s, epoch=3, batch_size=32))
    assert not np.array_equal(other_y, full_y)
    assert sorted(other_y.tolist()) == sorted(full_y.tolist())  # same examples, different order


@pytest.mark.parametrize("buffer", [0, 1, 50, 599, 600, 10_000])
def test_epoch_order_is_a_permutation(buffer):
    order = data.epoch_order(600, seed=3, epoch=1, buffer=buffer)
    assert sorted(order.tolist()) == list(range(600))
    np.testing.assert_array_equal(order, data.epoch_order(600, seed=3, epoch=1, buffer=buffer))
    if buffer == 1:
        np.testing.assert_array_equal(order, np.arange(600))  # a buffer of one does not shuffle


def test_smoke_sizes(make_npz):
    path = make_npz(n_train=3000, n_test=400)  # VAL_SPLIT=0.1: 300 to validate, the smoke run keeps 256 of them
    s = settings(dataset=f"npz:{path}", smoke=True)
    spec = data.load_data(s)
    assert (spec.n_train, spec.n_val, spec.n_test) == (512, 256, 256)
    np.testing.assert_array_equal(spec._train.y, data.load_data(s)._train.y)  # the same subset every time
    # 512 different examples, none drawn twice (the generated images are all distinct)
    assert len(np.unique(spec._train.x.reshape(512, -1), axis=0)) == 512
    assert len(np.unique(spec._val.x.reshape(256, -1), axis=0)) == 256


def _register(monkeypatch, load):
    from train import datasets

    monkeypatch.setitem(datasets.DATASETS, "tiny", datasets.Dataset("tiny", (28, 28, 1), tuple("0123456789"), load))


def test_a_downloaded_data_set_is_fingerprinted_by_its_content(tmp_path, monkeypatch):
    def arrays(seed):
        with np.load(write_npz(tmp_path / f"src{seed}.npz", seed=seed)) as z:
            return dict(z)

    def fingerprint(seed):
        _register(monkeypatch, lambda cache: arrays(seed))
        return data.load_data(settings(dataset="tiny", data_dir=str(tmp_path / "data"))).fingerprint

    assert fingerprint(1) == fingerprint(1)  # a resume's data check compares it
    assert fingerprint(1) != fingerprint(2)


@pytest.mark.parametrize(
    "error, shown",
    [
        (ValueError(""), "(ValueError: no message)"),
        (OSError("  \n"), "(OSError: no message)"),
        (RuntimeError("x" * 300 + "\nsecond line"), "(RuntimeError: " + "x" * 200 + ")"),
    ],
)
def test_a_failed_download_shows_the_first_line_of_its_error_cut_at_200_characters(tmp_path, monkeypatch, error, shown):
    def load(cache):
        raise error

    _register(monkeypatch, load)
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset="tiny", data_dir=str(tmp_path / "data")))
    assert shown in str(e.value) and "second line" not in str(e.value)


def test_offline_in_the_compose_container_the_message_says_where_data_is_on_the_host(monkeypatch):
    """The path it names is the container's /data: a newcomer puts the file in the host folder behind it."""
    from train.setup import hardware

    def load(cache):
        raise OSError("no network")

    _register(monkeypatch, load)
    monkeypatch.setattr(hardware, "in_container", lambda root=None, orchestrated=False: True)
    monkeypatch.setenv("DATA_DIR", "/data")  # docker-compose.yml's volume
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset="tiny", data_dir="/data"))
    assert str(e.value).endswith(
        "at /data/tiny.npz, or allow network access; "
        "/data is ./data beside docker-compose.yml on the host (DATA_HOST_DIR in .env moves it)"
    )


@pytest.mark.skipif(REAL_MNIST is None, reason=NO_REAL_MNIST)
def test_real_mnist(tmp_path):
    src = REAL_MNIST
    (tmp_path / "mnist.npz").symlink_to(src.resolve())
    s = settings(dataset="mnist", data_dir=str(tmp_path))
    spec = data.load_data(s)
    # VAL_SPLIT=0.1 of each digit's training images, rounded per digit: 5,999 to validate, the 10,000
    # test images apart
    assert (spec.input_shape, spec.n_train, spec.n_val, spec.n_test, spec.num_classes) == (
        (28, 28, 1),
        54001,
        5999,
        10000,
        10,
    )
    assert spec._test.y[:5].tolist() == [7, 2, 1, 0, 4]
    assert spec.fingerprint == hashlib.sha256(src.read_bytes()).hexdigest()
    x, y = next(iter(data.train_dataset(spec, s, epoch=0, batch_size=128)))
    assert x.shape == (128, 28, 28, 1) and float(x.numpy().max()) == 255.0


@pytest.mark.parametrize("seed, buffer", [(7, 0), (8, 0), (7, 50)])
def test_train_batches_follow_epoch_order_of_seed_and_shuffle_buffer(make_npz, seed, buffer):
    s = settings(dataset=f"npz:{make_npz()}", seed=seed, shuffle_buffer=buffer)
    spec = data.load_data(s)
    order = data.epoch_order(spec.n_train, seed, 2, buffer)
    # What the loop reads (per replica, here one and two) and the plain pipeline: the same order.
    for ds in (
        data.train_dataset(spec, s, epoch=2, batch_size=64),
        ((x, y) for x, y, _ in data.replica_dataset(spec, s, "train", epoch=2, batch_size=64)),
        (
            (x, y)
            for x, y, _ in data.replica_dataset(spec, s, "train", epoch=2, batch_size=64, replicas=2, local_replicas=2)
        ),
    ):
        x, y = batches(ds)
        np.testing.assert_array_equal(x, spec._train.x[order].astype(np.float32))
        np.testing.assert_array_equal(y, spec._train.y[order])


def test_seed_epoch_and_shuffle_buffer_each_change_the_order():
    base = data.epoch_order(600, seed=7, epoch=2, buffer=0)
    for other in (
        data.epoch_order(600, seed=8, epoch=2, buffer=0),
        data.epoch_order(600, seed=7, epoch=3, buffer=0),
        data.epoch_order(600, seed=7, epoch=2, buffer=50),
    ):
        assert not np.array_equal(other, base)


@pytest.mark.parametrize("buffer", [1, 2, 50, 599])
def test_a_shuffle_buffer_only_draws_from_its_window(buffer):
    """Like tf.data's shuffle: position t holds one of the first `buffer + t` examples, not yet used."""
    order = data.epoch_order(600, seed=5, epoch=0, buffer=buffer)
    assert all(int(i) < buffer + t for t, i in enumerate(order))
    assert sorted(order.tolist()) == list(range(600))
    if buffer > 1:
        assert not np.array_equal(order, np.arange(600))


def test_no_buffer_or_a_buffer_of_the_whole_set_is_the_same_true_shuffle():
    true_shuffle = data.epoch_order(600, seed=3, epoch=1, buffer=0)
    np.testing.assert_array_equal(data.epoch_order(600, seed=3, epoch=1), true_shuffle)
    np.testing.assert_array_equal(data.epoch_order(600, seed=3, epoch=1, buffer=600), true_shuffle)
    np.testing.assert_array_equal(data.epoch_order(600, seed=3, epoch=1, buffer=10_000), true_shuffle)
    assert not np.array_equal(true_shuffle, np.arange(600))


def test_a_shuffle_buffer_draws_anywhere_in_its_window():
    firsts = {int(data.epoch_order(600, seed=s, epoch=0, buffer=50)[0]) for s in range(30)}
    assert len(firsts) > 10 and max(firsts) < 50  # uniform over the first 50, not always the same slot


def test_a_registered_data_set_whose_class_names_cannot_be_labels_is_refused(tmp_path, monkeypatch):
    from train import datasets

    names = (*"012345678", "8")
    entry = datasets.Dataset("tiny", (28, 28, 1), names, lambda cache: dict(np.load(write_npz(tmp_path / "s.npz"))))
    monkeypatch.setitem(datasets.DATASETS, "tiny", entry)
    with pytest.raises(DataError, match=r"^tiny: classes 8 and 9 are both named '8'; class names must be unique: fix"):
        data.load_data(settings(dataset="tiny", data_dir=str(tmp_path / "data")))


def _autotune_thread(ds) -> bool:
    return ds.options().autotune.enabled is not False


def test_no_pipeline_the_loop_iterates_starts_tf_datas_autotuning_thread(make_npz):
    # Dropping an iterator waits for that thread's next wake-up: seconds at every epoch's end.
    s = settings(dataset=f"npz:{make_npz()}")
    spec = data.load_data(s)
    pipelines = {
        "train": data.train_dataset(spec, s, epoch=0, batch_size=64),
        "val": data.val_dataset(spec, s, 64),
        "one replica": data.replica_dataset(spec, s, "train", epoch=0, batch_size=64),
        "two replicas": data.replica_dataset(spec, s, "val", epoch=0, batch_size=64, replicas=2, local_replicas=2),
    }
    assert {name: _autotune_thread(ds) for name, ds in pipelines.items()} == dict.fromkeys(pipelines, False)
