"""datasets: the registry read by the settings check and the loader; downloads through
keras.utils.get_file from a local HTTP server (never the internet); the file formats read."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from builders import labelled_arrays
from helpers import LocalFiles

from train import config, datasets
from train.config import Settings, validate
from train.datasets import Dataset, download, read_cifar, read_idx
from train.errors import ConfigError, DataError, RegisterError
from train.inputs import pipeline as data


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_fetches_once_into_the_cache_and_checks_the_hash(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "a.bin").write_bytes(b"payload")
    cache = tmp_path / "cache"
    with LocalFiles(site) as files:
        got = download(files.url("a.bin"), sha256(site / "a.bin"), cache)
        assert got == (cache / "datasets" / "a.bin").resolve() and got.read_bytes() == b"payload"
        download(files.url("a.bin"), sha256(site / "a.bin"), cache)
        assert files.requests == ["/a.bin"]  # the second call is served from the cache
        got.write_bytes(b"half")  # a cached copy that no longer matches is fetched again
        assert download(files.url("a.bin"), sha256(site / "a.bin"), cache).read_bytes() == b"payload"
        assert len(files.requests) == 2
        with pytest.raises(ValueError, match="hash does not match"):
            download(files.url("a.bin"), "0" * 64, cache, subdir="other")
        with pytest.raises(Exception, match="URL fetch failure"):  # offline, or a file the site lacks
            download(files.url("missing.bin"), "0" * 64, tmp_path / "fresh" / "data")
        assert not (tmp_path / "fresh").exists()  # the folders it made for the file are gone with it


def test_a_registered_data_set_is_valid_for_the_settings_and_loads_through_a_download(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    np.savez(site / "tiny-v1.npz", **labelled_arrays(n_train=64, n_test=32, size=12))
    digest = sha256(site / "tiny-v1.npz")
    with LocalFiles(site) as files:

        def load(cache_dir: Path) -> dict:
            with np.load(download(files.url("tiny-v1.npz"), digest, cache_dir)) as z:
                return dict(z)

        monkeypatch.setitem(datasets.DATASETS, "tiny", Dataset("tiny", (12, 12, 1), ("a", "b", "c", "d"), load))
        s = validate(Settings(dataset="tiny", data_dir=str(tmp_path / "data"), runs_dir=str(tmp_path / "runs")))
        spec = data.load_data(s)
    got = (spec.input_shape, spec.class_names, spec.n_train + spec.n_val, spec.n_test)
    assert got == ((12, 12, 1), ("a", "b", "c", "d"), 64, 32)  # validation is a share of the 64 training examples
    assert spec.source == f"downloaded, cached in {tmp_path / 'data' / 'keras'}"
    assert (tmp_path / "data" / "keras" / "datasets" / "tiny-v1.npz").is_file()


def test_an_unknown_data_set_lists_the_registered_ones(monkeypatch):
    monkeypatch.setitem(datasets.DATASETS, "tiny", Dataset("tiny", (8, 8, 1), ("a", "b"), lambda d: {}))
    with pytest.raises(
        ConfigError,
        match=r"DATASET='mnst' is not valid: one of mnist, fashion_mnist, cifar10, tiny, "
        r"npz:<file>, images:<dir>",
    ):
        datasets.check_dataset("mnst")


def _own_mnist(cache_dir: Path) -> dict:
    return {}


def test_a_name_registered_twice_is_refused_naming_both_loaders(monkeypatch):
    """A fork's own `mnist` would otherwise replace the built-in one without a word; the same loader
    registered again (a module imported again) is not a second registration."""
    monkeypatch.setattr(datasets, "DATASETS", dict(datasets.DATASETS))
    with pytest.raises(RegisterError) as info:
        datasets.register(Dataset("mnist", (28, 28, 1), ("a", "b"), _own_mnist))
    assert str(info.value) == (
        "data set 'mnist': registered twice (_mnist and _own_mnist): give the new data set a name of "
        "its own, or remove the other register line"
    )
    assert datasets.DATASETS["mnist"].load is datasets._mnist
    again = Dataset("mnist", (28, 28, 1), tuple(str(i) for i in range(10)), datasets._mnist)
    assert datasets.register(again) is again


def test_dataset_help_names_every_registered_data_set():
    doc = next(f for f in config.fields(Settings) if f.name == "dataset").metadata["doc"]
    assert doc.startswith(" | ".join(datasets.DATASETS) + " | npz:<file>")
    for entry in datasets.DATASETS.values():
        assert len(entry.classes) >= 2 and len(entry.shape) == 3 and entry.shape[2] in (1, 3)


def _idx(path: Path, array: np.ndarray) -> Path:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + array.tobytes())
    return path


def test_read_idx_takes_the_dimensions_from_the_header(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(read_idx(_idx(tmp_path / "x.gz", images)), images)
    labels = np.array([3, 1, 4], np.uint8)
    np.testing.assert_array_equal(read_idx(_idx(tmp_path / "y.gz", labels)), labels)


def test_fashion_mnist_downloads_its_four_files_from_the_publisher_layout(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    arrays = labelled_arrays(n_train=40, n_test=20, classes=10)
    files = {}
    for key, (name, _) in datasets._FASHION_FILES.items():
        path = _idx(site / name, arrays[key])
        files[key] = (name, hashlib.md5(path.read_bytes()).hexdigest())  # md5, as the publisher gives them
    monkeypatch.setattr(datasets, "_FASHION_FILES", files)
    with LocalFiles(site) as server:
        monkeypatch.setattr(datasets, "_FASHION", server.url())
        got = datasets.DATASETS["fashion_mnist"].load(tmp_path / "cache")
    for key in arrays:
        np.testing.assert_array_equal(got[key], arrays[key])
    assert sorted(os.listdir(tmp_path / "cache" / "datasets" / "fashion-mnist")) == sorted(n for n, _ in files.values())


def _cifar_tar(path: Path, folder: str, batches: dict[str, tuple[np.ndarray, list[int]]], label_key: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for member, (x, y) in batches.items():
            # The publisher's layout: rows of 3072 bytes, all red, then green, then blue values.
            blob = pickle.dumps({b"data": x.transpose(0, 3, 1, 2).reshape(len(x), -1), label_key.encode(): y})
            info = tarfile.TarInfo(f"{folder}/{member}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path


def test_read_cifar_restores_height_width_channels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    path = _cifar_tar(
        tmp_path / "c.tar.gz",
        "cifar-10-batches-py",
        {"data_batch_1": (x[:2], [0, 1]), "data_batch_2": (x[2:4], [2, 3]), "test_batch": (x[4:], [4, 5])},
        "labels",
    )
    got = read_cifar(path, "cifar-10-batches-py", ["data_batch_1", "data_batch_2"], "test_batch", "labels")
    np.testing.assert_array_equal(got["x_train"], x[:4])
    np.testing.assert_array_equal(got["x_test"], x[4:])
    assert got["y_train"].tolist() == [0, 1, 2, 3] and got["y_train"].dtype == np.uint8


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_read_cifar_refuses_a_pickle_that_would_run_code(tmp_path):
    blob = pickle.dumps({b"data": _RunsCode(), b"labels": [0]})
    with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("f/test_batch")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(pickle.UnpicklingError, match="posix.system is not allowed|os.system is not allowed"):
        read_cifar(tmp_path / "evil.tar.gz", "f", [], "test_batch", "labels")


def test_a_download_that_fails_its_hash_is_a_data_error_then_fetched_again(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    np.savez(site / "mnist.npz", **labelled_arrays(n_train=40, n_test=20, classes=10))
    good = sha256(site / "mnist.npz")
    (site / "mnist.npz").rename(site / "good.npz")
    (site / "mnist.npz").write_bytes(b"not the real file")
    settings = validate(Settings(data_dir=str(tmp_path / "data"), runs_dir=str(tmp_path / "runs")))
    with LocalFiles(site) as files:

        def load(cache_dir: Path) -> dict:
            with np.load(download(files.url("mnist.npz"), good, cache_dir)) as z:
                return dict(z)

        monkeypatch.setitem(datasets.DATASETS, "mnist", Dataset("mnist", (28, 28, 1), tuple("0123456789"), load))
        with pytest.raises(
            DataError,
            match=r"mnist.npz not found and the download of mnist failed \(ValueError: "
            r"Incomplete or corrupted file detected",
        ):
            data.load_data(settings)
        (site / "good.npz").replace(site / "mnist.npz")  # the site is fixed: the bad copy is not kept
        spec = data.load_data(settings)
        assert spec.n_train + spec.n_val == 40


def test_the_package_uses_no_private_keras_module_and_no_test_double():
    """Downloads go through the public keras.utils.get_file; nothing patches Keras at run time."""
    root = Path(datasets.__file__).parent  # the whole package
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        assert "keras.src" not in text and "unittest" not in text, path.name


def test_fashion_mnist_gives_the_arrays_keras_own_loader_gave(tmp_path, monkeypatch):
    """The same bytes as keras.datasets.fashion_mnist.load_data() (what the template used before): the
    data fingerprint of a downloaded data set, and so a resume's data check, is unchanged. (CIFAR-10:
    Keras' loader is fixed to 10,000 images a batch; test_read_cifar_* check the same layout and dtype.)"""
    from keras.src.datasets import fashion_mnist as keras_fashion

    site = tmp_path / "fashion"
    site.mkdir()
    arrays = labelled_arrays(n_train=30, n_test=10, classes=10)
    paths = [_idx(site / name, arrays[key]) for key, (name, _) in datasets._FASHION_FILES.items()]
    by_name = {p.name: str(p) for p in paths}
    monkeypatch.setattr(keras_fashion, "get_file", lambda fname, **k: by_name[fname])
    monkeypatch.setattr(datasets, "download", lambda url, *a, **k: Path(by_name[url.rsplit("/", 1)[1]]))
    ours = datasets.DATASETS["fashion_mnist"].load(tmp_path / "cache")
    (x_tr, y_tr), (x_te, y_te) = keras_fashion.load_data()
    for key, theirs in (("x_train", x_tr), ("y_train", y_tr), ("x_test", x_te), ("y_test", y_te)):
        assert ours[key].dtype == theirs.dtype and ours[key].tobytes() == theirs.tobytes(), key
