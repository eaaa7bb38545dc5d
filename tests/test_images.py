"""train.data / train.images on `images:<dir>`: decode up front, name bad files, seeded split, caches."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from train import data, images
from train.config import Settings, validate
from train.errors import DataError, StorageError
from train.rundir import TMP_MARK


def settings(root, tmp_path, **kw) -> Settings:
    kw = {"runs_dir": str(tmp_path / "runs"), "image_size": 32, "channels": 3, "val_split": 0.25, **kw}
    return validate(Settings(dataset=f"images:{root}", **kw))


def batches(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


@pytest.fixture(autouse=True)
def fresh_memory_cache():
    data._DECODED.clear()
    yield
    data._DECODED.clear()


def test_png_and_jpeg_class_dirs(make_image_dir, tmp_path):
    root = make_image_dir()
    s = settings(root, tmp_path)
    spec = data.load_data(s)
    assert spec.class_names == ("class_0", "class_1", "class_2")
    assert (spec.input_shape, spec.num_classes, spec.n_train, spec.n_val) == ((32, 32, 3), 3, 45, 15)
    assert np.bincount(spec._val.y).tolist() == [5, 5, 5]  # stratified
    assert spec.source == str(root) and len(spec.fingerprint) == 64
    x, y = batches(data.val_dataset(spec, s, 8))
    assert x.dtype == np.float32 and x.shape == (15, 32, 32, 3) and y.dtype == np.int32
    # predict's decode is bit-identical to the pipeline's
    for i in (0, 1, 14):
        np.testing.assert_array_equal(
            images.load_image_file(spec._val.files[i], spec.input_shape), x[i].astype(np.uint8)
        )
    assert x[y == 1][..., 1].mean() > x[y == 1][..., 0].mean() + 100  # the class colour survived


def test_smoke_takes_a_subset_of_an_image_dir_and_only_then(make_image_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SMOKE_TRAIN", 6)  # a smoke run's sizes, scaled down to this small folder
    monkeypatch.setattr(data, "SMOKE_VAL", 3)
    root = make_image_dir()
    full = data.load_data(settings(root, tmp_path))
    assert (full.n_train, full.n_val, full.name) == (45, 15, f"images:{root}")
    smoke = data.load_data(settings(root, tmp_path, smoke=True))
    assert (smoke.n_train, smoke.n_val) == (6, 3)


def test_grayscale_and_fingerprint_tracks_bytes(make_image_dir, tmp_path):
    root = make_image_dir(per_class=4)
    spec = data.load_data(settings(root, tmp_path, channels=1))
    assert spec.input_shape == (32, 32, 1)
    (root / "class_0" / "img_000.png").write_bytes((root / "class_0" / "img_002.png").read_bytes())
    assert data.load_data(settings(root, tmp_path, channels=1)).fingerprint != spec.fingerprint


def test_no_class_dirs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class sub-directories") as e:
        data.load_data(settings(tmp_path / "empty", tmp_path))
    assert str(tmp_path / "empty") in str(e.value)


def test_class_dir_without_images(make_image_dir, tmp_path):
    root = make_image_dir(per_class=2)
    (root / "class_9").mkdir()
    (root / "class_9" / "notes.txt").write_text("not an image")
    with pytest.raises(
        DataError, match=r"class_9: class directory has no images \(JPEG, PNG, GIF \(first frame\) or BMP\)"
    ):
        data.load_data(settings(root, tmp_path))


@pytest.mark.parametrize("cache", ["memory", "file", "none"])
def test_non_image_png_is_named(make_image_dir, tmp_path, cache):
    root = make_image_dir()
    bad = root / "class_1" / "img_007.png"
    bad.write_bytes(b"this is not a PNG file at all" * 10)
    with pytest.raises(DataError, match="not a readable image") as e:
        data.load_data(settings(root, tmp_path, cache=cache))
    assert str(bad) in str(e.value)
    assert not list((tmp_path / "runs").rglob(f"*{TMP_MARK}*"))  # no half-written file cache left behind


def test_seeded_split_is_reproducible(make_image_dir, tmp_path):
    root = make_image_dir()
    a = data.load_data(settings(root, tmp_path, seed=1))
    b = data.load_data(settings(root, tmp_path, seed=1))
    c = data.load_data(settings(root, tmp_path, seed=2))
    assert a._val.files == b._val.files and a._train.files == b._train.files
    assert a._val.files != c._val.files


def test_resume_mid_epoch_gives_identical_batches(make_image_dir, tmp_path):
    root = make_image_dir()
    s = settings(root, tmp_path, seed=5)
    spec = data.load_data(s)
    full_x, full_y = batches(data.train_dataset(spec, s, epoch=1, batch_size=8))
    data._DECODED.clear()  # a fresh process
    spec2 = data.load_data(s)
    tail_x, tail_y = batches(data.train_dataset(spec2, s, epoch=1, batch_size=8, start_step=3))
    np.testing.assert_array_equal(tail_x, full_x[24:])
    np.testing.assert_array_equal(tail_y, full_y[24:])
    _, other = batches(data.train_dataset(spec, s, epoch=2, batch_size=8))
    assert not np.array_equal(other, full_y)


def test_cache_modes_give_the_same_batches(make_image_dir, tmp_path):
    root = make_image_dir()
    got = {}
    for cache in ("memory", "file", "none"):
        s = settings(root, tmp_path, cache=cache, seed=3)
        got[cache] = batches(data.train_dataset(data.load_data(s), s, epoch=0, batch_size=16))
    for cache in ("file", "none"):
        np.testing.assert_array_equal(got[cache][0], got["memory"][0])
        np.testing.assert_array_equal(got[cache][1], got["memory"][1])


def test_memory_cache_is_filled_once_per_process(make_image_dir, tmp_path, monkeypatch):
    root = make_image_dir()
    s = settings(root, tmp_path, cache="memory")
    spec = data.load_data(s)
    for p in root.rglob("img_*"):  # the files are gone: every epoch must come from the cache
        p.write_bytes(b"")
    for epoch in range(3):
        x, _ = batches(data.train_dataset(spec, s, epoch=epoch, batch_size=16))
        assert len(x) == 45
    shutil.rmtree(root)
    make_image_dir()  # identical files again; a second load_data in the process does not decode
    monkeypatch.setattr(images, "decode_files", lambda *a, **k: pytest.fail("decoded twice"))
    assert data.load_data(s).n_train == 45


def test_file_cache_is_reused_by_the_next_run(make_image_dir, tmp_path, monkeypatch):
    root = make_image_dir()
    s = settings(root, tmp_path, cache="file")
    data.load_data(s)
    cached = list((tmp_path / "runs" / ".cache").rglob("*.npy"))
    assert len(cached) == 2  # train and val
    monkeypatch.setattr(images, "decode_files", lambda *a, **k: pytest.fail("decoded twice"))
    spec = data.load_data(s)
    assert isinstance(spec._train.x, np.memmap)
    assert len(batches(data.train_dataset(spec, s, epoch=0, batch_size=16))[0]) == 45


def test_file_cache_removes_a_temp_file_left_by_a_killed_writer(make_image_dir, tmp_path):
    root = make_image_dir()
    s = settings(root, tmp_path, cache="file")
    data.load_data(s)
    (folder,) = (tmp_path / "runs" / ".cache").iterdir()
    for p in folder.glob("*.npy"):
        p.unlink()
    stale = folder / f"0123456789abcdef{TMP_MARK}dead.npy"  # what a kill during the decode leaves
    stale.write_bytes(b"half an array")
    data._DECODED.clear()
    data.load_data(s)
    assert not stale.exists() and len(list(folder.glob("*.npy"))) == 2


def test_file_cache_on_a_full_disk_is_a_storage_error_before_writing(make_image_dir, tmp_path, monkeypatch):
    import types

    from train import rundir

    root = make_image_dir()
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=1000))
    with pytest.raises(StorageError, match="the disk is full"):
        data.load_data(settings(root, tmp_path, cache="file"))
    assert not [p for p in (tmp_path / "runs" / ".cache").rglob("*") if p.is_file() and p.suffix == ".npy"]


def test_smoke_on_images(make_image_dir, tmp_path):
    root = make_image_dir(per_class=300, size=16)
    s = settings(root, tmp_path, smoke=True, image_size=16)
    spec = data.load_data(s)
    assert (spec.n_train, spec.n_val) == (512, 225)


def test_load_image_file_names_a_bad_file(tmp_path):
    bad = tmp_path / "x.jpg"
    bad.write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(DataError, match=r"x.jpg: not a readable image \(.*\); the formats read are JPEG, PNG, GIF"):
        images.load_image_file(bad, (32, 32, 3))


# --- links: followed, each real file once and in one class only ----------------------------------


def test_a_link_back_to_a_containing_folder_is_an_error_naming_both(make_image_dir):
    root = make_image_dir(classes=2, per_class=3)
    (root / "class_0" / "up").symlink_to("..")  # followed blindly: class_1 read again as class_0, round and round
    with pytest.raises(DataError, match="a folder that contains it") as e:
        images.list_image_dir(root)
    assert f"{root / 'class_0' / 'up'} links to {root.resolve()}" in str(e.value)


def test_a_file_reachable_from_two_classes_is_an_error_naming_both(make_image_dir):
    root = make_image_dir(classes=2, per_class=3)
    (root / "class_0" / "more").symlink_to(root / "class_1")
    with pytest.raises(DataError, match="are the same file") as e:
        images.list_image_dir(root)
    assert str(root / "class_0" / "more" / "img_000.png") in str(e.value)
    assert str(root / "class_1" / "img_000.png") in str(e.value)


def test_links_are_followed_and_each_real_file_counts_once(make_image_dir, tmp_path):
    root = make_image_dir(classes=2, per_class=3)
    elsewhere = make_image_dir("elsewhere", classes=2, per_class=2)
    (root / "class_1" / "extra").symlink_to(elsewhere / "class_1")  # a folder link: followed
    (root / "class_0" / "linked.png").symlink_to(elsewhere / "class_0" / "img_000.png")  # a file link: followed
    (root / "class_0" / "twice.png").symlink_to("img_000.png")  # the same file again: counted once
    names, rels, labels = images.list_image_dir(root)
    assert labels.tolist() == [0] * 4 + [1] * 5
    assert "class_0/linked.png" in rels and "class_1/extra/img_001.jpg" in rels
    assert ("class_0/img_000.png" in rels) != ("class_0/twice.png" in rels)


def test_a_broken_link_is_named(make_image_dir):
    root = make_image_dir(classes=2, per_class=2)
    (root / "class_1" / "gone.png").symlink_to("no-such-file.png")
    with pytest.raises(DataError, match=r"class_1/gone.png: a broken link \('no-such-file.png' does not exist\)"):
        images.list_image_dir(root)


# --- formats ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["GIF", "BMP"])
@pytest.mark.parametrize("channels", [1, 3])
def test_gif_and_bmp_are_read_for_grayscale_and_colour_models(tmp_path, fmt, channels):
    from PIL import Image

    pixels = np.zeros((20, 20, 3), np.uint8)
    pixels[:10] = 255  # top half white, bottom half black
    path = tmp_path / f"x.{fmt.lower()}"
    if fmt == "GIF":  # an animation: the first frame is the image
        black = Image.fromarray(np.zeros_like(pixels))
        Image.fromarray(pixels).save(path, save_all=True, append_images=[black, black])
    else:
        Image.fromarray(pixels).save(path)
    x = images.load_image_file(path, (16, 16, channels))
    assert x.shape == (16, 16, channels)
    assert x[:7].min() >= 250 and x[9:].max() <= 5


def test_load_image_file_says_what_is_wrong_with_the_path(tmp_path):
    with pytest.raises(DataError, match=r"is a directory, not an image file; give the image files \(JPEG, PNG"):
        images.load_image_file(tmp_path, (32, 32, 3))
    with pytest.raises(DataError, match=r"nope.png does not exist$"):
        images.load_image_file(tmp_path / "nope.png", (32, 32, 3))


def test_a_split_that_leaves_no_validation_image_is_named(make_image_dir, tmp_path):
    root = make_image_dir(classes=2, per_class=4)
    with pytest.raises(
        DataError, match=r"VAL_SPLIT=0.1 of 4 images in the smallest class leaves no image for validation"
    ):
        data.load_data(settings(root, tmp_path, val_split=0.1))
