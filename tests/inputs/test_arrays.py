"""arrays: an .npz read in full and every array checked (through load_data, as a run reads them):
corrupt files, files that are not an .npz, pixels and labels that cannot be trained on."""

from __future__ import annotations

import re

import numpy as np
import pytest
from builders import write_npz

from train.config import Settings, validate
from train.errors import DataError
from train.inputs import pipeline as data
from train.inputs.arrays import read_npz


def settings(**kw) -> Settings:
    kw.setdefault("runs_dir", "/nonexistent-runs")
    return validate(Settings(**kw))


# --- a corrupt or incomplete file, pixels out of range -----------------------------------------


def test_truncated_npz(make_npz):
    path = make_npz()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match="corrupt or truncated") as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(path) in str(e.value)


def test_flipped_bytes_in_the_middle(make_npz):
    path = make_npz()
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 16] = bytes(b ^ 0xFF for b in raw[mid : mid + 16])
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="corrupt or truncated") as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(path) in str(e.value)


def test_missing_key(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(
        path, x_train=np.zeros((4, 8, 8), np.uint8), y_train=np.zeros(4, np.uint8), x_test=np.zeros((2, 8, 8), np.uint8)
    )
    with pytest.raises(DataError, match=r"bad\.npz: missing array\(s\) y_test"):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_label_out_of_range_for_builtin(tmp_path):
    write_npz(tmp_path / "mnist.npz", y_test=np.full(300, 10, np.uint8))
    with pytest.raises(DataError, match=r"mnist\.npz: y_test has labels 10\.\.10; expected 0\.\.9"):
        data.load_data(settings(dataset="mnist", data_dir=str(tmp_path)))


def test_negative_labels_and_bad_pixels(make_npz):
    path = make_npz(y_train=np.full(600, -1, np.int16))
    with pytest.raises(DataError, match="expected 0.."):
        data.load_data(settings(dataset=f"npz:{path}"))
    path = make_npz("float.npz", x_train=np.full((600, 28, 28), 0.5, np.float32))
    with pytest.raises(DataError, match="whole numbers 0..255"):
        data.load_data(settings(dataset=f"npz:{path}"))


# --- labels: 0..K-1, every class present, at least two ------------------------------------------


def test_one_stray_label_is_named_not_a_million_classes(make_npz):
    y = np.arange(600, dtype=np.int64) % 10
    y[17] = 1_000_000
    path = make_npz(y_train=y)
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(e.value) == (
        f"{path}: y_train has no example of class 10..999999 (labels found: 0..9, 1000000); labels must be "
        "0..K-1 with every class present: renumber them, or remove the stray labels"
    )


def test_every_gap_in_the_labels_is_named(make_npz):
    y = np.array([0, 2, 5, 6, 9] * 120, np.uint8)
    path = make_npz(y_train=y, y_test=np.zeros(300, np.uint8))
    with pytest.raises(DataError, match=r"no example of class 1, 3\.\.4, 7\.\.8 \(labels found: 0, 2, 5\.\.6, 9\)"):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_many_gaps_are_shortened(make_npz):
    y = np.array([0, 2, 4, 6, 8, 10, 12, 12] * 75, np.uint8)
    path = make_npz(y_train=y, y_test=np.zeros(300, np.uint8))
    with pytest.raises(DataError, match=r"no example of class 1, 3, 5, 7, \.\.\. \(labels found: 0, 2, 4, 6, \.\.\.\)"):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_a_single_class_npz_is_refused(make_npz):
    path = make_npz(y_train=np.zeros(600, np.uint8), y_test=np.zeros(300, np.uint8))
    with pytest.raises(DataError, match="a single class .* needs at least two"):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_a_test_label_that_training_never_sees_is_named(make_npz):
    path = make_npz(classes=3, y_test=np.full(300, 3, np.uint8))
    with pytest.raises(DataError, match=r"y_train has no example of class 3 \(labels found: 0\.\.2\)"):
        data.load_data(settings(dataset=f"npz:{path}"))


# --- what the file is, when it is not an .npz ------------------------------------------------------


@pytest.mark.parametrize(
    "content, what",
    [
        (b"x_train,y_train\n1,2\n", "it is text ('x_train,y_train\\n1,2'...)"),
        (b"", "it is empty"),
        (b"\x00\x01\x02garbage", "it does not start like a zip archive"),
    ],
)
def test_a_file_that_is_not_an_npz_is_called_so(tmp_path, content, what):
    path = tmp_path / "data.npz"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(e.value).startswith(f"{path} is not an .npz file ({what}); save the arrays with numpy.savez")
    assert "pickle" not in str(e.value)


def test_a_single_npy_array_is_called_so(tmp_path):
    path = tmp_path / "x.npz"
    with open(path, "wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(DataError, match="is not an .npz file \\(it is a single .npy array\\)"):
        read_npz(path)


def test_a_directory_given_as_npz_is_called_a_directory(tmp_path):
    with pytest.raises(DataError, match="is a directory, not a file"):
        read_npz(tmp_path)


# --- class names: each becomes one line of labels.txt -----------------------------------------------


@pytest.mark.parametrize(
    "names, problem",
    [
        ([*map(str, range(9)), "two\nlines"], r"class 9 name 'two\\nlines' holds the control character '\\n'"),
        ([*map(str, range(9)), "cr\r"], r"holds the control character '\\r'"),
        ([*map(str, range(9)), "esc\x1b[31m"], r"holds the control character '\\x1b'"),
        ([*map(str, range(9)), "para\u2029graph"], r"holds the control character '\\u2029'"),
        ([*map(str, range(9)), ""], r"class 9 name '' is empty"),
        ([*map(str, range(9)), "   "], r"class 9 name '   ' is only whitespace"),
        ([*map(str, range(9)), " cat"], r"class 9 name ' cat' has leading or trailing whitespace"),
        ([*map(str, range(9)), "cat\t"], r"holds the control character '\\t'"),
        ([*map(str, range(9)), "3"], r"classes 3 and 9 are both named '3'"),
        ([*map(str, range(9)), "caf\u00e9", "cafe\u0301"][1:], r"classes 8 and 9 are both named"),  # NFC equal
    ],
)
def test_class_names_that_cannot_be_a_line_of_labels_txt_are_refused(make_npz, names, problem):
    path = make_npz(class_names=np.array(names))
    with pytest.raises(DataError, match=problem) as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(e.value).startswith(f"{path}: ") and "numpy.array(names, dtype=str)" in str(e.value)


@pytest.mark.parametrize(
    "names, problem",
    [
        (np.array("0123456789"), r"class_names has shape \(\)"),
        (np.array([[str(i)] for i in range(10)]), r"class_names has shape \(10, 1\)"),
        (np.arange(10.0), "class_names has dtype float64"),
        (np.array([b"caf\xe9"] + [str(i).encode() for i in range(1, 10)]), "bytes that are not UTF-8"),
    ],
)
def test_class_names_of_another_shape_or_type_are_refused(make_npz, names, problem):
    path = make_npz(class_names=names)
    with pytest.raises(DataError, match=problem):
        data.load_data(settings(dataset=f"npz:{path}"))


def test_class_names_as_bytes_or_integers_are_read_as_text(make_npz):
    for names in (np.array([f"c{i}".encode() for i in range(10)]), np.arange(10, 20)):
        spec = data.load_data(settings(dataset=f"npz:{make_npz(class_names=names)}"))
        assert spec.class_names == tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names.tolist())


# --- messages that name the real problem -------------------------------------------------------------


def test_an_npz_of_pickled_object_arrays_is_called_so_not_corrupt(tmp_path):
    path = tmp_path / "pickled.npz"
    arrays = {k: v for k, v in (("x_train", np.zeros((4, 8, 8), np.uint8)), ("y_train", np.zeros(4, np.uint8)))}
    np.savez(path, **arrays, x_test=np.array([np.zeros((8, 8)), None], dtype=object), y_test=np.zeros(2, np.uint8))
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(e.value).startswith(f"{path}: x_test is an array of Python objects (dtype object, stored as a pickle")
    assert "corrupt" not in str(e.value)


def test_a_uint64_label_too_large_for_int64_is_shown_as_it_is(make_npz):
    y = np.arange(600, dtype=np.uint64) % 10
    y[7] = 2**64 - 1
    path = make_npz(y_train=y)
    with pytest.raises(DataError, match=r"y_train has labels 0\.\.18446744073709551615 \(dtype uint64\)") as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert "labels -1" not in str(e.value)


def _unblock(fifo):
    """Open the write end of a FIFO and close it: a reader blocked on it gets end-of-file."""
    import os

    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def returns_without_blocking(fn, fifo, timeout: float = 120):
    """fn()'s exception (or None); a call blocked on the FIFO fails the test instead of hanging it."""
    import threading

    box = {}

    def call():
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            box["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        _unblock(fifo)
        t.join(timeout)
        pytest.fail(f"{fn} blocked on the FIFO {fifo}")
    return box.get("error")


def test_a_fifo_or_device_given_as_npz_is_named_and_never_read(tmp_path):
    import os

    from train.config import load_settings
    from train.errors import ConfigError

    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    for path, what in ((fifo, "a FIFO (named pipe)"), ("/dev/zero", "a character device")):
        with pytest.raises(ConfigError, match=rf"{path} is {re.escape(what)}, not a regular file; give the path"):
            load_settings({"dataset": f"npz:{path}"}, env_file=None, environ={})
    error = returns_without_blocking(lambda: read_npz(fifo), fifo)
    assert isinstance(error, DataError) and "is a FIFO (named pipe), not a regular file" in str(error)
    with pytest.raises(ConfigError, match=r"is a FIFO \(named pipe\), not a directory"):
        load_settings({"dataset": f"images:{fifo}"}, env_file=None, environ={})


# --- decompression bombs: the declared size is checked before anything is loaded -------------------


def test_an_npz_that_declares_more_than_the_memory_holds_is_refused_before_loading(tmp_path):
    import zipfile

    # An .npy header declaring 10^12 bytes, followed by almost nothing: numpy would allocate a terabyte.
    header = {"descr": "|u1", "fortran_order": False, "shape": (1_000_000, 1000, 1000)}
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            with z.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array_header_1_0(fh, header)
                fh.write(b"\0" * 64)
    with pytest.raises(DataError) as e:
        data.load_data(settings(dataset=f"npz:{path}"))
    assert str(e.value).startswith(f"{path}: its arrays declare 4000.0 GB once uncompressed (")
    assert "more than half the" in str(e.value) and "decompression bomb" in str(e.value)


def test_a_compressed_npz_larger_than_half_the_memory_available_is_refused(tmp_path, monkeypatch):
    from train.inputs import arrays

    big = tmp_path / "big.npz"
    labels = np.arange(2000, dtype=np.uint8) % 10
    x = np.zeros((2000, 100, 100), np.uint8)  # 20 MB of zeros, 20 kB compressed
    np.savez_compressed(big, x_train=x, y_train=labels, x_test=x[:10], y_test=labels[:10])
    assert big.stat().st_size < 200_000
    monkeypatch.setattr(arrays, "available_memory", lambda: 30_000_000)  # as if 30 MB were free
    with pytest.raises(DataError, match=r"declare 20\.\d MB once uncompressed \(x_train: \(2000, 100, 100\) uint8"):
        data.load_data(settings(dataset=f"npz:{big}"))
    monkeypatch.setattr(arrays, "available_memory", lambda: 100_000_000)
    spec = data.load_data(settings(dataset=f"npz:{big}"))
    assert spec.n_train + spec.n_val == 2000  # validation is a share of the training split


def test_available_memory_is_positive_and_at_most_the_machine_s():
    import os

    from train.inputs.arrays import available_memory

    assert 0 < available_memory() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_members_of_an_npz_that_a_run_does_not_use_are_never_decompressed(tmp_path):
    import zipfile

    path = write_npz(tmp_path / "extra.npz", n_train=200, n_test=50)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z:
        z.writestr("notes.txt", b"\0" * 100_000)
    raw = bytearray(path.read_bytes())
    at = raw.rindex(b"notes.txt") - 46 + 16  # the central directory's CRC of notes.txt
    raw[at : at + 4] = b"\xde\xad\xbe\xef"  # read, it would fail ("Bad CRC-32")
    path.write_bytes(bytes(raw))
    spec = data.load_data(settings(dataset=f"npz:{path}"))
    assert spec.n_train + spec.n_val == 200  # validation is a share of the training split


def test_a_fifo_in_data_dir_is_named_not_taken_for_a_missing_file(tmp_path, monkeypatch):
    import os

    from train import datasets

    monkeypatch.setattr(datasets, "download", lambda *a, **k: pytest.fail("downloaded instead"))
    os.mkfifo(tmp_path / "mnist.npz")
    error = returns_without_blocking(
        lambda: data.load_data(settings(dataset="mnist", data_dir=str(tmp_path))), tmp_path / "mnist.npz"
    )
    assert isinstance(error, DataError) and "mnist.npz is a FIFO (named pipe), not a regular file" in str(error)


def test_under_a_container_memory_limit_only_anonymous_memory_counts_as_used(tmp_path):
    from train.inputs.arrays import available_memory

    (tmp_path / "meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("8000000000\n")
    # 7.5 GB charged, 7 GB of it page cache (files read): 7.5 GB still available, not 0.5 GB.
    (cgroup / "memory.current").write_text("7500000000\n")
    (cgroup / "memory.stat").write_text("anon 500000000\nfile 7000000000\n")
    assert available_memory(str(tmp_path / "meminfo"), str(cgroup)) == 7_500_000_000
    (cgroup / "memory.max").write_text("max\n")  # no limit: the kernel's figure
    assert available_memory(str(tmp_path / "meminfo"), str(cgroup)) == 20_000_000 * 1024
