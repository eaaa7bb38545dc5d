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


@pytest.mark.parametrize("suffix", [".npy", ""])  # np.load reads a member `x_train` as x_train too
def test_an_npz_that_declares_more_than_the_memory_holds_is_refused_before_loading(tmp_path, suffix):
    import zipfile

    # An .npy header declaring 10^12 bytes, followed by almost nothing: numpy would allocate a terabyte.
    header = {"descr": "|u1", "fortran_order": False, "shape": (1_000_000, 1000, 1000)}
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            with z.open(f"{name}{suffix}", "w") as fh:
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


# --- each refusal's whole message, called directly ------------------------------------------------


def test_an_empty_zip_archive_is_an_npz_missing_every_array(tmp_path):
    import zipfile

    path = tmp_path / "empty.npz"
    zipfile.ZipFile(path, "w").close()  # no member: the archive starts with its end record, PK\x05\x06
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == (
        f"{path}: missing array(s) x_train, y_train, x_test, y_test; an .npz needs x_train, y_train, x_test, "
        "y_test (Keras layout)"
    )


def test_a_truncated_npz_is_called_corrupt_with_the_reason_and_the_fix(make_npz):
    path = make_npz()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert re.fullmatch(
        rf"{re.escape(str(path))} is corrupt or truncated \((BadZipFile|EOFError|ValueError|OSError|error): .+\); "
        "replace it with a good copy",
        str(e.value),
    ), str(e.value)


def test_an_object_array_is_refused_with_the_whole_message(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, x_train=np.zeros((2, 4, 4), np.uint8), y_train=np.array([None, 1], dtype=object))
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == (
        f"{path}: y_train is an array of Python objects (dtype object, stored as a pickle, which is never loaded: "
        "unpickling can run code); save plain arrays: uint8 images, integer labels, class_names as strings "
        "(numpy.array(names, dtype=str))"
    )


def test_an_object_array_the_run_does_not_use_is_never_read(tmp_path):
    path = write_npz(tmp_path / "notes.npz", n_train=20, n_test=10, notes=np.array([None, "a note"], dtype=object))
    assert sorted(read_npz(path)) == ["x_test", "x_train", "y_test", "y_train"]


def _bomb(path, shapes: dict) -> None:
    """An .npz whose members are .npy headers declaring `shapes` ({name: (shape, descr)}), and no data,
    after a member that is no array (the check reads on past it)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("README.txt", b"not an array")
        for name, (shape, descr) in shapes.items():
            with z.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": shape})


def test_the_declared_size_counts_the_bytes_of_each_element_and_names_the_largest_array(tmp_path, monkeypatch):
    from train.inputs import arrays

    path = tmp_path / "wide.npz"
    big, small = ((1000, 1000, 1000), "<u2"), ((1000,), "<u2")
    _bomb(path, {"x_train": small, "y_train": small, "x_test": big, "y_test": small})
    monkeypatch.setattr(arrays, "available_memory", lambda: 1_000_000_000)
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == (
        f"{path}: its arrays declare 2.0 GB once uncompressed (x_test: (1000, 1000, 1000) uint16, 2.0 GB), more than "
        "half the 1.0 GB of memory available; use a smaller file or more memory (a compressed file that declares "
        "more than it holds is a decompression bomb)"
    )


def test_a_declared_size_past_64_bits_is_counted_whole(tmp_path):
    path = tmp_path / "huge.npz"
    tiny = ((2,), "|u1")
    _bomb(path, {"x_train": ((1 << 32, 1 << 32), "|u1"), "y_train": tiny, "x_test": tiny, "y_test": tiny})
    with pytest.raises(
        DataError, match=re.escape("declare 18446744073.7 GB once uncompressed (x_train: (4294967296, ")
    ):
        read_npz(path)


def test_an_npz_of_version_2_npy_headers_is_read(tmp_path):
    import io
    import zipfile

    path = tmp_path / "v2.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name, array in _arrays().items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, array, version=(2, 0))
            z.writestr(f"{name}.npy", buffer.getvalue())
    got = read_npz(path)
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in _arrays().items()}


def test_arrays_that_fill_exactly_half_the_memory_available_are_read(make_npz, monkeypatch):
    from train.inputs import arrays

    path = make_npz(n_train=20, n_test=10)
    total = sum(a.nbytes for a in np.load(path).values())
    monkeypatch.setattr(arrays, "available_memory", lambda: 2 * total)
    assert sorted(read_npz(path)) == ["x_test", "x_train", "y_test", "y_train"]
    monkeypatch.setattr(arrays, "available_memory", lambda: 2 * total - 2)
    with pytest.raises(DataError, match=rf"declare {total / 1e6:.1f} MB once uncompressed"):
        read_npz(path)


def test_sizes_are_shown_in_gb_from_a_tenth_of_one_and_in_mb_below():
    from train.inputs.arrays import _gb

    assert (_gb(100_000_000), _gb(99_999_999), _gb(2_345_678)) == ("0.1 GB", "100.0 MB", "2.3 MB")
    assert (_gb(1_050_000_001), _gb(1_050_001)) == ("1.1 GB", "1.1 MB")  # a GB is 10^9 bytes, an MB 10^6


def test_under_a_cgroup_v1_memory_limit_only_its_resident_memory_counts_as_used(tmp_path):
    from train.inputs.arrays import available_memory

    (tmp_path / "meminfo").write_text("MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n")
    v1 = tmp_path / "cgroup" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("4000000000\n")
    (v1 / "memory.stat").write_text("cache 2500000000\nrss 900000000\ntotal_rss 1000000000\n")
    assert available_memory(str(tmp_path / "meminfo"), str(tmp_path / "cgroup")) == 3_000_000_000
    (v1 / "memory.stat").write_text("cache 2500000000\ntotal_rss 5000000000\n")  # over the limit: none left
    assert available_memory(str(tmp_path / "meminfo"), str(tmp_path / "cgroup")) == 0


def test_without_memavailable_or_a_cgroup_the_free_pages_are_counted(tmp_path):
    import os

    from train.inputs.arrays import available_memory

    (tmp_path / "meminfo").write_text("MemTotal:       24000000 kB\n")  # a kernel older than 3.14
    page = os.sysconf("SC_PAGE_SIZE")
    free = os.sysconf("SC_AVPHYS_PAGES") * page
    got = available_memory(str(tmp_path / "meminfo"), str(tmp_path / "no-cgroup"))
    assert got % page == 0 and free / 2 < got < free * 2  # free memory moves between the two readings


def test_a_cgroup_limit_without_its_memory_stat_is_not_counted(tmp_path):
    from train.inputs.arrays import available_memory

    (tmp_path / "meminfo").write_text("MemAvailable:   20000000 kB\nbroken line\nHugePages: many\n")
    (tmp_path / "memory.max").write_text("1000\n")
    assert available_memory(str(tmp_path / "meminfo"), str(tmp_path)) == 20_000_000 * 1024


@pytest.mark.parametrize(
    "names, message",
    [
        (["a", "b\n"], "w: class 1 name 'b\\n' holds the control character '\\n'; FIX"),
        (["a", "b\u2028c"], "w: class 1 name 'b\\u2028c' holds the control character '\\u2028'; FIX"),  # line separator
        (["a", "b\u2029c"], "w: class 1 name 'b\\u2029c' holds the control character '\\u2029'; FIX"),  # paragraph sep.
        (["a", ""], "w: class 1 name '' is empty; FIX"),
        (["a", " \t"], "w: class 1 name ' \\t' is only whitespace; FIX"),
        (["a ", "b"], "w: class 0 name 'a ' has leading or trailing whitespace; FIX"),
        (["a", "caf\udce9"], "w: class 1 name 'caf\\udce9' is not valid UTF-8; FIX"),
        (["a", "b", "a"], "w: classes 0 and 2 are both named 'a'; class names must be unique: FIX"),
        (
            ["caf\u00e9", "cafe\u0301"],
            "w: classes 0 and 1 are both named 'cafe\u0301'; class names must be unique: FIX",
        ),
    ],
)
def test_each_class_name_refusal_names_the_place_the_class_and_the_fix(names, message):
    from train.inputs.arrays import check_class_names

    with pytest.raises(DataError) as e:
        check_class_names("w", names, "FIX")
    assert str(e.value) == message


def test_valid_class_names_come_back_as_given():
    from train.inputs.arrays import check_class_names

    assert check_class_names("w", iter(["cat", "caf\u00e9", "a b"]), "FIX") == ("cat", "caf\u00e9", "a b")


NAMES_FIX = (
    "store class_names as a 1-d array of distinct, printable strings, one per class (numpy.array(names, dtype=str))"
)


@pytest.mark.parametrize(
    "names, problem",
    [
        (np.array([["a"], ["b"]]), "class_names has shape (2, 1)"),
        (np.array([1.0, 2.0]), "class_names has dtype float64"),
        (np.array([b"caf\xe9", b"b"]), "class_names holds bytes that are not UTF-8"),
        (np.array([b"a", b"a"]), "classes 0 and 1 are both named 'a'; class names must be unique:"),
    ],
)
def test_an_npz_class_names_refusal_says_how_to_store_them(names, problem):
    from train.inputs.arrays import npz_class_names

    with pytest.raises(DataError) as e:
        npz_class_names("w", names)
    assert str(e.value) == f"w: {problem}; {NAMES_FIX}".replace(":;", ":")


# --- what the file is, when it is not an .npz: the whole message -------------------------------------


@pytest.mark.parametrize(
    "content, what",
    [
        (b"a b\tc\r\n", "it is text ('a b\\tc'...)"),  # a space, a tab, CR LF: text
        (b"abc\x7f", "it does not start like a zip archive"),  # DEL is not text
        (b"abc\x1f", "it does not start like a zip archive"),  # nor is any other control character
        (b"PK\x03\x03", "it does not start like a zip archive"),
    ],
)
def test_a_file_that_is_not_an_npz_gets_the_whole_message(tmp_path, content, what):
    path = tmp_path / "data.npz"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == (
        f"{path} is not an .npz file ({what}); save the arrays with "
        "numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"
    )


def test_a_long_text_file_shows_its_first_24_characters(tmp_path):
    path = tmp_path / "data.npz"
    path.write_bytes(b"0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqr\xff")  # the 65th is never read
    with pytest.raises(DataError, match=re.escape("(it is text ('0123456789abcdefghijklmn'...))")):
        read_npz(path)


def test_a_directory_or_fifo_given_as_npz_gets_the_whole_message(tmp_path):
    import os

    with pytest.raises(DataError) as e:
        read_npz(tmp_path)
    assert str(e.value) == f"{tmp_path} is a directory, not a file; give the path of an .npz file (or use images:<dir>)"
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    error = returns_without_blocking(lambda: read_npz(fifo), fifo)
    assert str(error) == (
        f"{fifo} is a FIFO (named pipe), not a regular file (it is never read: it could block or never end); "
        "give the path of an .npz file"
    )


def test_a_missing_npz_is_named_with_the_reason(tmp_path):
    path = tmp_path / "gone.npz"
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == f"{path}: cannot read it (No such file or directory); check the path and its permissions"


# --- the arrays: each refusal's whole message, what is accepted and how it is converted -------------------


def _arrays(**changed) -> dict:
    x, y = np.zeros((4, 8, 8), np.uint8), np.array([0, 1, 0, 1], np.uint8)
    return {"x_train": x, "y_train": y, "x_test": x[:2], "y_test": y[:2]} | changed


@pytest.mark.parametrize(
    "changed, message",
    [
        (
            {"x_train": np.zeros((4, 8, 8, 2), np.uint8)},
            "x_train has shape (4, 8, 8, 2); expected (N, H, W) or (N, H, W, 1|3) with N > 0",
        ),
        (
            {"x_test": np.zeros((0, 8, 8), np.uint8)},
            "x_test has shape (0, 8, 8, 1); expected (N, H, W) or (N, H, W, 1|3) with N > 0",
        ),
        (
            {"x_train": np.zeros((4, 64), np.uint8)},
            "x_train has shape (4, 64); expected (N, H, W) or (N, H, W, 1|3) with N > 0",
        ),
        ({"x_train": np.zeros((4, 8, 8), bool)}, "x_train has dtype bool; expected uint8 pixel values 0..255"),
        ({"x_train": np.zeros((4, 8, 8), "<U1")}, "x_train has dtype <U1; expected uint8 pixel values 0..255"),
        (
            {"x_test": np.full((2, 8, 8), 256, np.int16)},
            "x_test holds values outside whole numbers 0..255; store raw uint8 pixels (the model rescales)",
        ),
        (
            {"x_test": np.full((2, 8, 8), -1, np.int16)},
            "x_test holds values outside whole numbers 0..255; store raw uint8 pixels (the model rescales)",
        ),
        (
            {"x_train": np.full((4, 8, 8), 0.5)},
            "x_train holds values outside whole numbers 0..255; store raw uint8 pixels (the model rescales)",
        ),
        (
            {"x_train": np.full((4, 8, 8), np.nan)},
            "x_train holds values outside whole numbers 0..255; store raw uint8 pixels (the model rescales)",
        ),
        (
            {"y_train": np.zeros((4, 2), np.int64)},
            "y_train has shape (4, 2) and dtype int64; expected integer class ids of shape (N,)",
        ),
        (
            {"y_test": np.zeros(2, np.float32)},
            "y_test has shape (2,) and dtype float32; expected integer class ids of shape (N,)",
        ),
        ({"y_test": np.zeros(3, np.uint8)}, "x_test has 2 examples but y_test has 3"),
        ({"x_test": np.zeros((2, 8, 8, 3), np.uint8)}, "x_train images are (8, 8, 1) but x_test images are (8, 8, 3)"),
        ({"y_train": np.array([0, 1, -1, 1], np.int8)}, "y_train has labels -1..1; expected 0..1"),
        (
            {"y_train": np.array([1, 2, 1, 2])},
            "y_train has no example of class 0 (labels found: 1..2); labels must be 0..K-1 with every class present: "
            "renumber them, or remove the stray labels",
        ),
        (
            {"y_train": np.zeros(4, np.uint8), "y_test": np.zeros(2, np.uint8)},
            "a single class (every label is 0); a classifier needs at least two",
        ),
        (
            {"y_test": np.array([2**64 - 1, 0], np.uint64)},
            "y_test has labels 0..18446744073709551615 (dtype uint64); labels must be class ids 0..K-1: renumber them, or remove the stray labels",
        ),
    ],
)
def test_each_array_refusal_names_the_array_and_what_is_expected(changed, message):
    from train.inputs.arrays import check_arrays

    with pytest.raises(DataError) as e:
        check_arrays("w", _arrays(**changed), None)
    assert str(e.value) == f"w: {message}"


def test_whole_numbers_from_0_to_255_of_any_numeric_type_are_read_as_uint8_pixels():
    from train.inputs.arrays import check_arrays

    pixels = np.array([0.0, 1.0, 254.0, 255.0]).reshape(4, 1, 1, 1).repeat(3, axis=3)
    labels = np.array([[0], [1], [0], [1]], np.int64)  # cifar10 keeps labels as (N, 1)
    got = check_arrays("w", _arrays(x_train=pixels, y_train=labels, x_test=pixels[:2].astype(np.int16)), None)
    x_train, y_train, x_test, y_test, classes = got
    assert (x_train.dtype, x_train.shape, x_train[:, 0, 0, 0].tolist()) == (np.uint8, (4, 1, 1, 3), [0, 1, 254, 255])
    assert (x_test.dtype, x_test[:, 0, 0, 0].tolist()) == (np.uint8, [0, 1])
    assert (y_train.dtype, y_train.tolist(), y_test.dtype, y_test.tolist(), classes) == (
        np.int32,
        [0, 1, 0, 1],
        np.int32,
        [0, 1],
        2,
    )


def test_a_uint64_label_that_fits_is_read_and_a_given_num_classes_bounds_the_labels_and_wants_each_class():
    from train.inputs.arrays import check_arrays

    got = check_arrays(
        "w", _arrays(y_train=np.array([0, 1, 2, 1], np.uint64), y_test=np.array([0, 0], np.uint64)), None
    )
    assert (got[1].tolist(), got[3].tolist(), got[4]) == ([0, 1, 2, 1], [0, 0], 3)
    with pytest.raises(DataError) as e:  # the largest label int64 holds: named as the label it is, a stray one
        check_arrays("w", _arrays(y_train=np.array([0, 1, 2**63 - 1, 1], np.uint64)), None)
    assert str(e.value).startswith("w: y_train has no example of class 2..")
    assert "(labels found: 0..1, 9223372036854775807)" in str(e.value)
    with pytest.raises(DataError) as e:
        check_arrays("w", _arrays(y_test=np.array([0, 2])), 2)
    assert str(e.value) == "w: y_test has labels 0..2; expected 0..1, one per class name (2 names)"
    with pytest.raises(DataError) as e:
        check_arrays("w", _arrays(), 3)  # 10 classes expected of a built-in set, here 3: class 2 never seen
    assert str(e.value) == (
        "w: y_train has no example of class 2 (labels found: 0..1); labels must be 0..K-1 with every class present: "
        "renumber them, or remove the stray labels"
    )


def test_a_pickled_member_named_without_npy_is_refused_as_a_pickle(tmp_path):
    """numpy also reads a member named `x_train` (no .npy) as the array x_train; the header check looked at
    .npy members only, so such a pickle (or a decompression bomb) passed it and was called corrupt."""
    import io
    import zipfile

    pickled = io.BytesIO()
    np.save(pickled, np.array([None, "code could run here"], dtype=object), allow_pickle=True)
    path = tmp_path / "sneaky.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x_train", pickled.getvalue())
        for name, array in _arrays().items():
            if name != "x_train":
                buffer = io.BytesIO()
                np.save(buffer, array)
                z.writestr(f"{name}.npy", buffer.getvalue())
    with pytest.raises(DataError) as e:
        read_npz(path)
    assert str(e.value) == (
        f"{path}: x_train is an array of Python objects (dtype object, stored as a pickle, which is never loaded: "
        "unpickling can run code); save plain arrays: uint8 images, integer labels, class_names as strings "
        "(numpy.array(names, dtype=str))"
    )


# --- the validation split ------------------------------------------------------------------------------


def test_the_split_is_stratified_seeded_sorted_and_leaves_each_class_an_image_to_train_on():
    from train.inputs.arrays import split_indices

    labels = np.array([0, 1, 0, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0])  # 10, 3 and 1 images of classes 0, 1, 2
    train, val = split_indices(labels, 0.2, 7)
    # round(10 * 0.2) = 2 and round(3 * 0.2) = 1 validate; the class of one image trains. The same SEED must
    # give the same split in every version: a resumed or reproduced run relies on it.
    assert (train.tolist(), val.tolist()) == ([1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 13], [0, 5, 12])
    assert split_indices(labels, 0.2, 8)[1].tolist() == [0, 5, 11]  # another seed, other images
    for val_split in (0.5, 1.0):  # never every image of a class
        assert [a.tolist() for a in split_indices(np.array([0, 0, 1, 1]), val_split, 0)] == [[1, 3], [0, 2]]
