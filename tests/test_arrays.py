"""arrays: an .npz read in full and every array checked (through load_data, as a run reads them):
corrupt files, files that are not an .npz, pixels and labels that cannot be trained on."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_npz

from train import data
from train.arrays import read_npz
from train.config import Settings, validate
from train.errors import DataError


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
