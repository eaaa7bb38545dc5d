"""train.inputs.pipeline / train.inputs.images on `images:<dir>`: decode up front, name bad files, seeded split, caches."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import first_fast

from train.config import Settings, validate
from train.errors import DataError, StorageError
from train.inputs import images
from train.inputs import pipeline as data
from train.run.files import TMP_MARK


def settings(root, tmp_path, **kw) -> Settings:
    kw = {"runs_dir": str(tmp_path / "runs"), "image_size": 32, "channels": 3, "val_split": 0.25, **kw}
    return validate(Settings(dataset=f"images:{root}", **kw))


def batches(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


@pytest.fixture(autouse=True)
def fresh_memory_cache():
    images._DECODED.clear()
    yield
    images._DECODED.clear()


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


@pytest.mark.parametrize("cache", first_fast("memory", "file", "none"))
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
    images._DECODED.clear()  # a fresh process
    spec2 = data.load_data(s)
    tail_x, tail_y = batches(data.train_dataset(spec2, s, epoch=1, batch_size=8, start_step=3))
    np.testing.assert_array_equal(tail_x, full_x[24:])
    np.testing.assert_array_equal(tail_y, full_y[24:])
    _, other = batches(data.train_dataset(spec, s, epoch=2, batch_size=8))
    assert not np.array_equal(other, full_y)


def test_cache_modes_give_the_same_batches(make_image_dir, tmp_path, monkeypatch):
    decode, traced = images.decode_tensor, []
    monkeypatch.setattr(images, "decode_tensor", lambda *a: traced.append(a) or decode(*a))
    root = make_image_dir()
    got = {}
    for cache in ("memory", "file", "none"):
        s = settings(root, tmp_path, cache=cache, seed=3)
        got[cache] = batches(data.train_dataset(data.load_data(s), s, epoch=0, batch_size=16))
    for cache in ("file", "none"):
        np.testing.assert_array_equal(got[cache][0], got["memory"][0])
        np.testing.assert_array_equal(got[cache][1], got["memory"][1])
    # Seven decode passes (train and val of each load, the uncached epoch), one shape: one trace of the
    # decode per process (none here when an earlier test of this process traced it), not one a pass.
    assert len(traced) <= 1, len(traced)


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


def test_file_cache_removes_a_temp_file_left_by_a_killed_writer(make_image_dir, tmp_path, caplog):
    root = make_image_dir()
    s = settings(root, tmp_path, cache="file")
    data.load_data(s)
    (folder,) = (tmp_path / "runs" / ".cache").iterdir()
    for p in folder.glob("*.npy"):
        p.unlink()
    stale = folder / f"0123456789abcdef{TMP_MARK}dead.npy"  # what a kill during the decode leaves
    stale.write_bytes(b"half an array")
    images._DECODED.clear()
    with caplog.at_level("INFO", logger="train"):
        data.load_data(s)
    assert not stale.exists() and len(list(folder.glob("*.npy"))) == 2
    removed = [r.getMessage() for r in caplog.records if "temp file" in r.getMessage()]
    assert removed == [f"removed a temp file left by an interrupted cache write: {stale}"]  # once: train's write


def test_file_cache_on_a_full_disk_is_a_storage_error_before_writing(make_image_dir, tmp_path, monkeypatch):
    import types

    from train.run import files as rundir

    root = make_image_dir()
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=1000))
    with pytest.raises(StorageError, match="the disk is full"):
        data.load_data(settings(root, tmp_path, cache="file"))
    assert not [p for p in (tmp_path / "runs" / ".cache").rglob("*") if p.is_file() and p.suffix == ".npy"]


def test_file_cache_needs_room_for_the_pixels_and_64_kb_more_before_it_writes(make_image_dir, tmp_path, monkeypatch):
    """64 KB for the .npy header and the record: a memory-mapped write past the disk's end dies of SIGBUS."""
    import types

    from train.run import files as rundir

    s = settings(make_image_dir(classes=2, per_class=3, size=10), tmp_path, cache="file", image_size=10)
    needed = 4 * 10 * 10 * 3 + 65_536  # the training split's pixels (the larger split) and the margin
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=needed - 1))
    with pytest.raises(StorageError, match="the disk is full"):
        data.load_data(s)
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=needed))
    assert data.load_data(s).n_train == 4


def test_smoke_on_images(make_image_dir, tmp_path):
    root = make_image_dir(per_class=300, size=16)
    s = settings(root, tmp_path, smoke=True, image_size=16)
    spec = data.load_data(s)
    assert (spec.n_train, spec.n_val) == (512, 225)


def test_a_file_in_no_image_format_is_named_with_the_formats_read_here_only(tmp_path):
    text = tmp_path / "file.txt"
    text.write_text("hello")
    with pytest.raises(DataError) as e:
        images.load_image_file(text, (32, 32, 3))
    # TensorFlow's own list (JPEG XL, WebP, ...) is not the formats read here.
    assert str(e.value) == (
        f"{text}: not a readable image; the formats read are JPEG, PNG, GIF (first frame) or BMP "
        "(of 8, 24 or 32 bits a pixel): convert or remove it"
    )


def test_a_one_bit_bmp_is_named_with_the_bmp_depths_read(tmp_path):
    """TensorFlow's reason ("... must be 1, 3 or 4, was 0") beside a list naming BMP did not say what to change."""
    from PIL import Image

    path = tmp_path / "scan.bmp"
    Image.new("1", (8, 8)).save(path)
    with pytest.raises(
        DataError, match=r"scan\.bmp: not a readable image .*BMP \(of 8, 24 or 32 bits a pixel\): convert"
    ):
        images.load_image_file(path, (8, 8, 1))


def test_a_whole_jpeg_with_a_cameras_trailer_is_not_decoded_twice(tmp_path, monkeypatch):
    """A JPEG cut short is decoded by PIL in the header pass to refuse it there; one whose end-of-image marker is
    followed by a camera's data (Samsung's "SEFT" trailer) is whole, and was decoded there too: a second decode
    of every photo of such a data set."""
    import io

    from PIL import Image, ImageFile

    noise = np.random.default_rng(0).integers(0, 256, (400, 400, 3), np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(noise).save(encoded, format="JPEG", quality=95)
    raw = encoded.getvalue() + b"\x00" * 1000 + b"SEFH" + b"\x01" * 100 + b"SEFT"
    assert len(encoded.getvalue()) > 70_000  # its pixel data past the first 64 KB, where a thumbnail may be
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im) or real(im))
    assert images.image_info(raw, "photo.jpg", None) == (1, 0) and loads == []
    with pytest.raises(DataError, match="JPEG data cut short or damaged"):
        images.image_info(raw[: len(raw) // 2], "cut.jpg", None)  # cut: decoded, and refused
    assert len(loads) == 1


def test_a_whole_jpeg_under_64_kb_is_not_decoded_in_the_header_pass(monkeypatch):
    """Its end-of-image marker is its last two bytes: nothing past 64 KB is needed to know it is whole."""
    import io

    from PIL import Image, ImageFile

    encoded = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(encoded, format="JPEG")
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im) or real(im))
    assert images.image_info(encoded.getvalue(), "small.jpg", None) == (1, 0) and loads == []


def test_load_image_file_names_a_bad_file(tmp_path):
    bad = tmp_path / "x.jpg"
    bad.write_bytes(b"\xff\xd8\xff truncated")  # a JPEG's signature: refused before TensorFlow's libjpeg prints
    with pytest.raises(
        DataError, match=r"x.jpg: not a readable image \(JPEG data cut short or damaged\); copy the whole file again"
    ):
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


def test_files_not_named_as_images_are_skipped_with_one_warning_counting_them(make_image_dir, caplog):
    root = make_image_dir(classes=2, per_class=2)
    (root / "class_0" / "photo.webp").write_bytes((root / "class_0" / "img_000.png").read_bytes())
    (root / "class_1" / "deeper").mkdir()
    (root / "class_1" / "deeper" / "notes.txt").write_text("not an image")
    (root / "class_1" / ".hidden.webp").write_text("skipped unseen: a dot file")
    with caplog.at_level("WARNING", logger="train"):
        names, rels, labels = images.list_image_dir(root)
    assert labels.tolist() == [0, 0, 1, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"WARNING: {root}: 2 file(s) skipped, not named as JPEG, PNG, GIF (first frame) or BMP (e.g. "
        f"{root / 'class_0' / 'photo.webp'}); convert the images among them to train on them"
    ]


def test_files_beside_the_class_folders_are_in_no_class_and_one_warning_says_so(make_image_dir, caplog):
    root = make_image_dir(classes=2, per_class=2)
    (root / "stray.png").write_bytes((root / "class_0" / "img_000.png").read_bytes())
    (root / "labels.csv").write_text("a,b")
    (root / ".DS_Store").write_text("hidden: not counted")
    with caplog.at_level("WARNING", logger="train"):
        names, rels, labels = images.list_image_dir(root)
    assert names == ("class_0", "class_1") and labels.tolist() == [0, 0, 1, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"WARNING: {root}: 2 file(s) beside the class sub-directories, in no class, are not used (e.g. {root / 'labels.csv'}); "
        "move each into the sub-directory of its class"
    ]


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


# --- class names from folder names --------------------------------------------------------------------


@pytest.mark.parametrize(
    "folder, problem",
    [
        ("two\nlines", r"name 'two\\nlines' holds the control character '\\n'"),
        ("tab\there", r"holds the control character '\\t'"),
        ("cat ", r"name 'cat ' has leading or trailing whitespace"),
        (" ", r"name ' ' is only whitespace"),
        ("cafe\u0301", r"classes \d and \d are both named"),  # beside class "café" (composed): equal once normalised
        (b"caf\xe9", "is not valid UTF-8"),  # a Latin-1 name on a UTF-8 system
    ],
)
def test_a_folder_name_that_cannot_be_a_class_name_is_refused(make_image_dir, tmp_path, folder, problem):
    import os

    root = make_image_dir(classes=2, per_class=2)
    os.rename(root / "class_1", root / "caf\u00e9")
    target = os.path.join(os.fsencode(root), folder if isinstance(folder, bytes) else os.fsencode(folder))
    shutil.copytree(os.fsencode(root / "class_0"), target)
    with pytest.raises(DataError, match=problem) as e:
        data.load_data(settings(root, tmp_path))
    assert str(e.value).startswith(f"{root}: ") and str(e.value).endswith("rename the folder")


# --- one image in a class ---------------------------------------------------------------------------


def test_a_class_of_one_image_is_refused_when_there_is_a_validation_split(make_image_dir, tmp_path):
    root = make_image_dir(classes=3, per_class=4)
    for p in sorted((root / "class_2").iterdir())[1:]:
        p.unlink()
    with pytest.raises(DataError) as e:
        data.load_data(settings(root, tmp_path, val_split=0.5))
    assert str(e.value) == (
        f"{root / 'class_2'}: class 'class_2' has a single image; with VAL_SPLIT=0.5 a class needs at least 2 "
        "(one to train on, one to validate): add images, remove the folder, or set VAL_SPLIT=0"
    )
    no_split = settings(root, tmp_path, val_split=0.0, monitor="accuracy")
    assert data.load_data(no_split).num_classes == 3  # no validation split: nothing to refuse


def test_a_class_left_without_a_validation_image_is_warned_about_once(make_image_dir, tmp_path, caplog):
    root = make_image_dir(classes=3, per_class=2)
    for c in (0, 1):
        for i in range(2, 8):
            shutil.copy(root / f"class_{c}" / "img_000.png", root / f"class_{c}" / f"more_{i}.png")
    with caplog.at_level("WARNING", logger="train"):
        spec = data.load_data(settings(root, tmp_path, val_split=0.25))  # 8 -> 2 validation, 2 -> round(0.5) = 0
    assert np.bincount(spec._val.y, minlength=3).tolist() == [2, 2, 0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"WARNING: {root}: VAL_SPLIT=0.25 leaves 1 of 3 classes without a validation image ('class_2'): their "
        "accuracy is never measured; raise VAL_SPLIT or add images"
    ]


# --- unreadable files and folders ---------------------------------------------------------------------


@pytest.fixture
def shared_dir():
    """A folder under /tmp that another user can enter (pytest's own tmp_path is private to root)."""
    import os
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="unreadable-"))
    path.chmod(0o755)
    yield path
    for p in path.rglob("*"):
        os.chmod(p, 0o755, follow_symlinks=False) if not p.is_symlink() else None
    shutil.rmtree(path)


def as_another_user(fn):
    """fn() with the permissions of an unprivileged user: root reads files of mode 000 anyway, so as
    root the effective uid is switched to `nobody` for the call (every thread follows), then back."""
    import os

    if os.geteuid() != 0:
        return fn()
    from PIL import Image

    Image.init()  # PIL's format plugins imported now, while everything is readable
    os.setegid(65534)
    os.seteuid(65534)
    try:
        return fn()
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize("which", ["an image", "a class folder", "the images root"])
def test_an_unreadable_image_or_folder_is_one_error_naming_it(shared_dir, which):
    from builders import write_image_dir

    root = write_image_dir(shared_dir / "images", classes=2, per_class=2, size=8)
    locked = {
        "an image": root / "class_1" / "img_001.jpg",
        "a class folder": root / "class_1",
        "the images root": root,
    }[which]
    locked.chmod(0)
    s = settings(root, shared_dir, cache="none")
    with pytest.raises(DataError) as e:
        as_another_user(lambda: data.load_data(s))
    assert str(e.value) == f"{locked}: cannot read the folder (Permission denied); fix its permissions".replace(
        "the folder", "it" if which == "an image" else "the folder"
    )


def test_predict_names_an_unreadable_image(shared_dir):
    from PIL import Image

    path = shared_dir / "x.png"
    Image.new("RGB", (8, 8)).save(path)
    path.chmod(0)
    with pytest.raises(DataError) as e:
        as_another_user(lambda: images.load_image_file(path, (8, 8, 3)))
    assert str(e.value) == f"{path}: cannot read it (Permission denied); fix its permissions"


def test_a_fifo_among_the_images_or_given_to_predict_is_named_and_never_read(make_image_dir, tmp_path):
    import os

    from test_arrays import returns_without_blocking

    root = make_image_dir(classes=2, per_class=2)
    fifo = root / "class_1" / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match=r"pipe.png is a FIFO \(named pipe\), not an image file; remove it"):
        images.list_image_dir(root)
    error = returns_without_blocking(lambda: images.load_image_file(fifo, (8, 8, 3)), fifo)
    assert isinstance(error, DataError) and str(error).startswith(f"{fifo} is a FIFO (named pipe), not an image file")


# --- decompression bombs: the header's size is checked before decoding --------------------------------


def _png(width: int, height: int, rows: int) -> bytes:
    """A grayscale PNG whose header declares width x height, holding only `rows` rows (a cheap bomb)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (width + 1) * rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_a_png_declaring_20000x20000_pixels_is_refused_before_decoding(make_image_dir, tmp_path):
    root = make_image_dir(classes=2, per_class=4, size=8)
    bomb = root / "class_0" / "bomb.png"
    bomb.write_bytes(_png(20000, 20000, rows=4))
    assert bomb.stat().st_size < 2000
    with pytest.raises(DataError) as e:
        data.load_data(settings(root, tmp_path))
    assert str(e.value) == (
        f"{bomb}: 20000x20000 is 400 million pixels, more than MAX_IMAGE_PIXELS=50,000,000 (decoding it would "
        "take about 1.2 GB); shrink the image (it is resized to IMAGE_SIZE anyway) or raise MAX_IMAGE_PIXELS"
    )
    with pytest.raises(DataError, match="20000x20000 is 400 million pixels, more than MAX_IMAGE_PIXELS"):
        images.load_image_file(bomb, (8, 8, 3))  # predict reads images through the same check


def test_max_image_pixels_is_a_setting_counting_every_frame_of_a_gif(make_image_dir, tmp_path):
    from PIL import Image

    root = make_image_dir(classes=2, per_class=4, size=40)  # 40..48 pixels a side: at most 2304
    data.load_data(settings(root, tmp_path, max_image_pixels=2304))
    frames = [Image.new("RGB", (40, 40), (i * 80, 0, 0)) for i in range(3)]
    gif = root / "class_1" / "anim.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:])  # 3 x 1600 pixels decoded
    with pytest.raises(
        DataError, match=r"anim.gif: 3 frames of 40x40 is 4,800 pixels, more than MAX_IMAGE_PIXELS=2,304"
    ):
        data.load_data(settings(root, tmp_path, max_image_pixels=2304))


# --- EXIF orientation, CMYK ---------------------------------------------------------------------------


def _pattern(height: int = 12, width: int = 20) -> np.ndarray:
    """An image that looks different under each of the 8 flips and turns."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[: height // 2, : width // 3] = (255, 0, 0)
    pixels[height // 2 :, width // 2 :] = (0, 0, 255)
    pixels[0, :] = (0, 255, 0)
    return pixels


@pytest.mark.parametrize("orientation", range(1, 9))
def test_the_exif_orientation_is_applied_as_pil_exif_transpose_does(tmp_path, orientation):
    from PIL import Image, ImageOps

    path = tmp_path / "photo.png"  # lossless, so the pixels can be compared exactly
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(_pattern()).save(path, exif=exif)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)))
    got = images.load_image_file(path, expected.shape)  # no resize: the decode's own pixels
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("orientation", [3, 6])
def test_the_exif_orientation_is_applied_for_a_grayscale_model_too(tmp_path, orientation):
    from PIL import Image, ImageOps

    path = tmp_path / "photo.png"
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(_pattern()[..., 0]).save(path, exif=exif)  # a gray image: decoded as it is
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)))[..., None]
    np.testing.assert_array_equal(images.load_image_file(path, expected.shape), expected)


@pytest.mark.parametrize("cache", first_fast("memory", "file", "none"))
def test_a_phone_photo_held_sideways_trains_upright_as_predict_reads_it(tmp_path, cache):
    from PIL import Image

    root = tmp_path / "images"
    upright = np.zeros((40, 20, 3), np.uint8)
    upright[:20] = 255  # top half white: what a viewer shows
    exif = Image.Exif()
    exif[0x0112] = 6  # the camera stored it turned a quarter to the left
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.rot90(upright, 1).copy()).save(root / c / f"{i}.jpg", exif=exif, quality=95)
    s = settings(root, tmp_path, image_size=16, val_split=0.5, cache=cache)
    spec = data.load_data(s)
    x, _ = batches(data.train_dataset(spec, s, epoch=0, batch_size=4))
    assert x[:, :7].min() > 230 and x[:, 9:].max() < 25  # upright: white on top
    x_val, _ = batches(data.val_dataset(spec, s, batch_size=4))
    for i, f in enumerate(spec._val.files):  # predict's decode is the pipeline's
        np.testing.assert_array_equal(images.load_image_file(f, (16, 16, 3)), x_val[i].astype(np.uint8))


@pytest.mark.parametrize("channels", [1, 3])
def test_a_cmyk_jpeg_is_read_for_grayscale_and_colour_models(tmp_path, channels):
    from PIL import Image

    pixels = np.zeros((20, 20, 3), np.uint8)
    pixels[:10] = 255
    path = tmp_path / "print.jpg"
    Image.fromarray(pixels).convert("CMYK").save(path)
    assert Image.open(path).mode == "CMYK"
    x = images.load_image_file(path, (16, 16, channels))
    assert x.shape == (16, 16, channels) and x[:7].min() >= 245 and x[9:].max() <= 10


# --- CACHE=file: verified against the data before it is trained on ----------------------------------


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_an_edited_file_cache_is_detected_and_rebuilt_with_one_warning(make_image_dir, tmp_path, caplog):
    root = make_image_dir(classes=2, per_class=4)
    s = settings(root, tmp_path, cache="file", val_split=0.5)
    fresh = batches(data.val_dataset(data.load_data(s), s, 4))
    caches = sorted((tmp_path / "runs" / ".cache").rglob("*.npy"))
    for path in caches:  # the same size and header, other pixels: only a check of the bytes sees it
        raw = bytearray(path.read_bytes())
        raw[-100:] = bytes(255 - b for b in raw[-100:])
        path.write_bytes(bytes(raw))
    with caplog.at_level("WARNING", logger="train"):
        spec = data.load_data(s)
    assert len(_warnings(caplog)) == 2  # one line for each cache (train, val)
    assert all("does not match the data: its bytes changed since it was written" in w for w in _warnings(caplog))
    got = batches(data.val_dataset(spec, s, 4))
    np.testing.assert_array_equal(got[0], fresh[0])
    caplog.clear()
    with caplog.at_level("WARNING", logger="train"):
        data.load_data(s)  # rebuilt and recorded: trusted again, silently
    assert _warnings(caplog) == [] and all(p.exists() for p in caches)


def test_a_file_cache_from_other_data_or_without_its_record_is_rebuilt(make_image_dir, tmp_path, caplog):
    root = make_image_dir(classes=2, per_class=4)
    s = settings(root, tmp_path, cache="file", val_split=0.5)
    cache_dir = tmp_path / "runs" / ".cache"
    old = data.load_data(s)
    old_x = batches(data.val_dataset(old, s, 4))[0]
    old_files = sorted(p for p in cache_dir.rglob("*") if p.suffix in (".npy", ".json"))
    for p in root.rglob("img_*.png"):  # the data changes: a new fingerprint, a new cache
        p.write_bytes((root / "class_0" / "img_001.jpg").read_bytes())
    with caplog.at_level("WARNING", logger="train"):
        spec = data.load_data(s)
    assert spec.fingerprint != old.fingerprint and _warnings(caplog) == []
    new_x = batches(data.val_dataset(spec, s, 4))[0]
    assert not np.array_equal(new_x, old_x)
    memory = data.load_data(settings(root, tmp_path, val_split=0.5))
    np.testing.assert_array_equal(batches(data.val_dataset(memory, s, 4))[0], new_x)
    # The old cache copied over the new one's files (a restored backup, a synced folder): the
    # record's fingerprint says it was decoded from other data.
    new_files = sorted(p for p in cache_dir.rglob("*") if p.suffix in (".npy", ".json") and p not in old_files)
    for src, dst in zip(old_files, new_files):
        shutil.copy(src, dst)
    caplog.clear()
    with caplog.at_level("WARNING", logger="train"):
        spec = data.load_data(s)
    assert len(_warnings(caplog)) == 2 and all("decoded from other data" in w for w in _warnings(caplog))
    np.testing.assert_array_equal(batches(data.val_dataset(spec, s, 4))[0], new_x)
    # A cache without its record (a kill between the two writes, a cache from an older version): rebuilt.
    for p in new_files:
        if p.suffix == ".json":
            p.unlink()
    caplog.clear()
    with caplog.at_level("WARNING", logger="train"):
        spec = data.load_data(s)
    assert len(_warnings(caplog)) == 2 and all("is missing or unreadable" in w for w in _warnings(caplog))
    np.testing.assert_array_equal(batches(data.val_dataset(spec, s, 4))[0], new_x)


# --- at the command line: one line, the data exit code ---------------------------------------------


@pytest.mark.slow
def test_each_bad_input_is_one_line_and_its_exit_code_at_the_command_line(tmp_path):
    import json
    import subprocess
    import sys

    from builders import write_image_dir, write_npz
    from faults import env, fit_flags

    cases = {}
    for name, change in (
        ("newline", lambda root: (root / "class_1").rename(root / "class\n1")),
        ("single", lambda root: [p.unlink() for p in sorted((root / "class_1").iterdir())[1:]]),
        ("bomb", lambda root: (root / "class_1" / "bomb.png").write_bytes(_png(20000, 20000, rows=2))),
    ):
        root = write_image_dir(tmp_path / name, classes=2, per_class=4, size=8)
        change(root)
        cases[name] = (f"images:{root}", 3)
    y = np.arange(60, dtype=np.uint64) % 10
    y[3] = 2**64 - 1
    cases["uint64"] = (f"npz:{write_npz(tmp_path / 'u64.npz', n_train=60, n_test=20, y_train=y)}", 3)
    names = np.array(["a\nb", *map(str, range(1, 10))])
    cases["names"] = (f"npz:{write_npz(tmp_path / 'names.npz', n_train=60, n_test=20, class_names=names)}", 3)
    cases["zero"] = ("npz:/dev/zero", 2)
    code = (
        "import sys, json\nfrom train.cli import main\n"
        "for name, (ds, _) in json.loads(sys.argv[1]).items():\n"
        "    print('BEGIN', name, file=sys.stderr, flush=True)\n"
        "    rc = main(['fit', '--dataset', ds, *sys.argv[2:]])\n"
        "    print('RC', name, rc, file=sys.stderr, flush=True)\n"
    )
    npz = write_npz(tmp_path / "ok.npz", n_train=60, n_test=20)
    flags = fit_flags(tmp_path, npz, image_size=16, val_split=0.5)[2:]
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases), *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env(),
        timeout=600,
    )
    blocks = dict(re.findall(r"BEGIN (\w+)\n(.*?)RC \1 ", p.stderr, re.S))
    for name, (_, rc) in cases.items():
        assert f"RC {name} {rc}" in p.stderr, p.stderr[-3000:]
        errors = [line for line in blocks[name].splitlines() if re.match(r"\w+Error: ", line)]
        assert len(errors) == 1, (name, blocks[name])
    assert "Traceback" not in p.stderr and "epoch 1/" not in p.stderr


@pytest.mark.parametrize("cache", first_fast("none", "memory", "file"))
def test_no_image_pipeline_starts_tf_datas_autotuning_thread(make_image_dir, tmp_path, monkeypatch, cache):
    # Dropping an iterator waits for that thread's next wake-up (docs/performance.md).
    released = []
    real = images.released_at_once
    monkeypatch.setattr(images, "released_at_once", lambda ds: released.append(ds) or real(ds))
    s = settings(make_image_dir(), tmp_path, cache=cache)
    spec = data.load_data(s)
    assert len(released) == 2  # the decode passes that check (and cache) train and val
    for ds in (
        data.train_dataset(spec, s, epoch=0, batch_size=16),
        data.val_dataset(spec, s, 16),
        data.replica_dataset(spec, s, "train", epoch=0, batch_size=16, replicas=2, local_replicas=2),
    ):
        assert ds.options().autotune.enabled is False


# --- the folder scan: each refusal's whole message, what is listed and in which order ------------------


def test_a_folder_without_class_folders_or_with_only_one_is_refused_with_the_whole_message(tmp_path):
    root = tmp_path / "images"
    (root / ".git").mkdir(parents=True)  # hidden: not a class
    (root / ".git" / "a.png").write_bytes(b"x")
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert str(e.value) == (
        f"{root}: no class sub-directories; put the images in one sub-directory per class, e.g. {root}/cats/001.jpg"
    )
    (root / "cats").mkdir()
    (root / "cats" / "a.png").write_bytes(b"x")
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert str(e.value) == f"{root}: only one class sub-directory (cats); a classifier needs at least two"
    (root / "dogs").mkdir()
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert str(e.value) == (
        f"{root / 'dogs'}: class directory has no images (JPEG, PNG, GIF (first frame) or BMP); add some or "
        "remove the directory"
    )


def test_every_image_extension_in_any_case_is_listed_in_the_order_of_the_paths(tmp_path):
    root = tmp_path / "images"
    names = {
        "cats": ["e.gif", "a.JPG", "c.Png", "b.jpeg", "d.bmp", "f.webp", ".ipynb_checkpoints/a.png"],
        "dogs": ["sub/h.png", "g.jpg", "sub/deeper/i.png"],  # folders in folders: each walked
    }
    for cls, files in names.items():
        for name in files:
            (root / cls / name).parent.mkdir(parents=True, exist_ok=True)
            (root / cls / name).write_bytes(b"listed, never read here")
    classes, rels, labels = images.list_image_dir(root)
    assert classes == ("cats", "dogs")
    assert rels == [
        "cats/a.JPG",
        "cats/b.jpeg",
        "cats/c.Png",
        "cats/d.bmp",
        "cats/e.gif",
        "dogs/g.jpg",
        "dogs/sub/deeper/i.png",
        "dogs/sub/h.png",
    ]
    assert labels.dtype == np.int32 and labels.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


def test_a_file_linked_twice_in_its_class_counts_once_and_the_files_after_it_still_count(tmp_path):
    root = tmp_path / "images"
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        for name in ("1.png", "3.png"):
            (root / cls / name).write_bytes(b"x")
    (root / "cats" / "2.png").symlink_to("1.png")  # sorted between the two files: 3.png comes after it
    assert images.list_image_dir(root)[1] == ["cats/1.png", "cats/3.png", "dogs/1.png", "dogs/3.png"]


def test_a_link_to_a_folder_whose_path_only_starts_like_the_class_folder_is_no_loop(tmp_path):
    root = tmp_path / "data"
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        (root / cls / "1.png").write_bytes(b"x")
    (tmp_path / "data" / "cats-extra").mkdir()  # a third class, whose path starts with cats' path
    (tmp_path / "data" / "cats-extra" / "2.png").write_bytes(b"x")
    (root / "dogs" / "more").symlink_to(root / "cats-extra")  # dogs/more is cats-extra: the same file twice
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert str(e.value) == (
        f"{root}/cats-extra/2.png (class cats-extra) and {root}/dogs/more/2.png (class dogs) are the same file; an "
        "image belongs to one class only: remove one of them (or the link that leads to it)"
    )
    (root / "dogs" / "more").unlink()
    elsewhere = tmp_path / "d"  # a prefix of the path of data/cats, not a folder holding it
    elsewhere.mkdir()
    (elsewhere / "3.png").write_bytes(b"x")
    (root / "cats" / "more").symlink_to(elsewhere)
    assert images.list_image_dir(root)[1] == ["cats/1.png", "cats/more/3.png", "cats-extra/2.png", "dogs/1.png"]


@pytest.mark.parametrize("target", ["..", "."])
def test_a_link_to_its_own_folder_or_one_above_is_a_loop_with_the_whole_message(make_image_dir, target):
    root = make_image_dir(classes=2, per_class=1)
    (root / "class_0" / "up").symlink_to(target)
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    real = (root / "class_0" / target).resolve()
    assert str(e.value) == (
        f"{root / 'class_0' / 'up'} links to {real}, a folder that contains it: the images would be read round a "
        "loop; remove the link"
    )


def test_a_link_up_to_a_folder_whose_name_ends_in_a_space_is_a_loop(tmp_path):
    root = tmp_path / "my images "
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        (root / cls / "1.png").write_bytes(b"x")
    (root / "cats" / "up").symlink_to("..")
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert str(e.value) == (
        f"{root}/cats/up links to {root}, a folder that contains it: the images would be read round a loop; "
        "remove the link"
    )


def test_an_image_in_a_folder_that_can_be_listed_but_not_entered_is_named(shared_dir):
    root = shared_dir / "images"
    for cls in ("cats", "dogs"):
        (root / cls).mkdir(parents=True)
        (root / cls / "1.png").write_bytes(b"x")
    (root / "dogs").chmod(0o444)  # its names can be read, its files not reached
    with pytest.raises(DataError) as e:
        as_another_user(lambda: images.list_image_dir(root))
    assert str(e.value) == f"{root}/dogs/1.png: Permission denied; fix or remove it"


def test_a_broken_link_or_a_fifo_among_the_images_is_named_with_the_whole_message(make_image_dir):
    import os

    root = make_image_dir(classes=2, per_class=1)
    (root / "class_1" / "gone.png").symlink_to("no-such-file.png")
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert (
        str(e.value) == f"{root}/class_1/gone.png: a broken link ('no-such-file.png' does not exist); fix or remove it"
    )
    with pytest.raises(DataError) as e:
        images.load_image_file(root / "class_1" / "gone.png", (8, 8, 3))
    assert str(e.value) == f"{root}/class_1/gone.png does not exist (a broken link)"
    (root / "class_1" / "gone.png").unlink()
    os.mkfifo(root / "class_1" / "pipe.png")
    with pytest.raises(DataError) as e:
        images.list_image_dir(root)
    assert (
        str(e.value) == f"{root}/class_1/pipe.png is a FIFO (named pipe), not an image file; remove it from the folder"
    )
    with pytest.raises(DataError) as e:
        images.load_image_file(root, (8, 8, 3))
    assert str(e.value) == (
        f"{root} is a directory, not an image file; give the image files (JPEG, PNG, GIF (first frame) or BMP)"
    )


# --- the header pass: fingerprint, EXIF orientation, CMYK, the size limit ---------------------------------


def _jpeg(path, orientation: int = 1, cmyk: bool = False) -> Path:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    image = Image.fromarray(_pattern())
    (image.convert("CMYK") if cmyk else image).save(path, exif=exif)
    return path


def test_the_scan_fingerprints_paths_and_bytes_and_reads_each_files_header_past_a_chunk_of_128(tmp_path):
    import hashlib

    from PIL import Image

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    Image.new("L", (2, 2)).save(root / "a" / "000.png")
    rels = [f"a/{i:03d}.png" for i in range(130)]
    for i, rel in enumerate(rels[1:], 1):  # each file's bytes differ: a PNG with its number as text
        Image.new("L", (2, 2)).save(root / rel, pnginfo=_text(str(i)))
    rels[128], rels[129] = "a/128.jpg", "a/129.jpg"
    _jpeg(root / rels[128], cmyk=True)
    _jpeg(root / rels[129], orientation=6)
    fingerprint, info = images.scan_files(root, rels, None)
    outer = hashlib.sha256()
    for rel in rels:
        outer.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
    assert fingerprint == outer.hexdigest()
    assert info.dtype == np.int32 and info.tolist() == [[1, 0]] * 128 + [[1, 1], [6, 0]]


def _text(value: str):
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("n", value)
    return info


@pytest.mark.parametrize("orientation", [0, 9, 255])
def test_an_exif_orientation_outside_1_to_8_is_read_as_upright(tmp_path, orientation):
    raw = _jpeg(tmp_path / "odd.jpg", orientation=orientation).read_bytes()
    assert images.image_info(raw, "odd.jpg", None) == (1, 0)


def test_the_size_limit_counts_width_times_height_and_refuses_only_above_it(tmp_path):
    raw = _png(30000, 20000, rows=1)
    assert images.image_info(raw, "wide.png", 600_000_000) == (1, 0)  # exactly at the limit: read
    with pytest.raises(DataError) as e:
        images.image_info(raw, "wide.png", 599_999_999)
    assert str(e.value) == (
        "wide.png: 30000x20000 is 600 million pixels, more than MAX_IMAGE_PIXELS=599,999,999 (decoding it would "
        "take about 1.8 GB); shrink the image (it is resized to IMAGE_SIZE anyway) or raise MAX_IMAGE_PIXELS"
    )
    (tmp_path / "wide.png").write_bytes(raw)
    with pytest.raises(DataError) as e:
        images.load_image_file(tmp_path / "wide.png", (8, 16, 3))  # predict: the default limit, its own fix
    assert str(e.value) == (
        f"{tmp_path / 'wide.png'}: 30000x20000 is 600 million pixels, more than MAX_IMAGE_PIXELS=50,000,000 "
        "(decoding it would take about 1.8 GB); shrink the image (the model takes 16x8; this limit is "
        "MAX_IMAGE_PIXELS's default, which no setting changes here)"
    )


def test_every_frame_of_a_gif_counts_and_the_message_says_how_many(tmp_path):
    from PIL import Image

    frames = [Image.new("RGB", (40, 30), (i * 80, 0, 0)) for i in range(2)]
    buffer = tmp_path / "anim.gif"
    frames[0].save(buffer, save_all=True, append_images=frames[1:])
    raw = buffer.read_bytes()
    assert images.declared_pixels(raw) == 2400 and images.image_info(raw, "anim.gif", 2400) == (1, 0)
    with pytest.raises(DataError) as e:
        images.image_info(raw, "anim.gif", 2399)
    assert str(e.value).startswith(
        "anim.gif: 2 frames of 40x30 is 2,400 pixels, more than MAX_IMAGE_PIXELS=2,399 (decoding it would take "
        "about 7.2 kB); shrink the image"
    )
    frames[0].save(tmp_path / "anim.png", save_all=True, append_images=frames[1:])  # APNG: one image decoded
    assert images.declared_pixels((tmp_path / "anim.png").read_bytes()) == 1200
    assert images.declared_pixels(_png(30000, 20000, rows=1)) == 600_000_000  # past PIL's own limit
    assert images.declared_pixels(b"not an image") is None


def test_the_size_in_the_message_is_rounded_to_millions_of_pixels_and_tenths_of_a_gb_never_to_zero():
    cases = [((3500, 1000), "4 million pixels"), ((35000, 10000), "about 1.1 GB"), ((3000, 1000), "about 9.0 MB")]
    cases += [((999, 1000), "is 999,000 pixels, more than MAX_IMAGE_PIXELS=1 ")]  # a limit set low: not "1 million"
    for (width, height), shown in cases:
        with pytest.raises(DataError) as e:
            images.image_info(_png(width, height, rows=1), "big.png", 1)
        assert shown in str(e.value)


def test_a_png_is_never_decoded_for_its_exif_and_a_file_pil_cannot_parse_is_upright_colour(monkeypatch):
    import struct
    import zlib

    from PIL import ImageFile

    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im) or real(im))
    exif = b"MM\x00\x2a\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00\x00\x00\x00\x00"
    chunk = struct.pack(">I", len(exif)) + b"eXIf" + exif + struct.pack(">I", zlib.crc32(b"eXIf" + exif))
    raw = _png(20000, 20000, rows=1)
    late = raw[:-12] + chunk + raw[-12:]  # the eXIf chunk after the pixel data, before IEND
    assert images.image_info(late, "late.png", None) == (1, 0) and loads == []  # getexif would decode it whole
    assert images.image_info(b"not an image at all", "x.png", None) == (1, 0)


def test_a_jpeg_without_its_end_marker_is_whole_only_with_one_past_its_first_64_kb(tmp_path, monkeypatch):
    """Only a JPEG with no end marker past its first 64 KB (where an EXIF thumbnail's own may sit) is decoded
    by PIL in the header pass; a marker there is a camera's trailer after a whole image."""
    import io

    from PIL import Image, ImageFile

    noise = np.random.default_rng(0).integers(0, 256, (400, 400, 3), np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(noise).save(encoded, format="JPEG", quality=95)
    cut = bytearray(encoded.getvalue()[:70_000])  # pixel data cut short: no FF D9 at all
    assert b"\xff\xd9" not in cut
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: loads.append(im) or real(im))
    first_trusted = 2 + 65_537
    marked = cut[:]
    marked[first_trusted : first_trusted + 2] = b"\xff\xd9"  # where a camera's trailer may start: trusted
    assert images.image_info(bytes(marked), "a.jpg", None) == (1, 0) and loads == []
    marked = cut[:]
    marked[first_trusted - 1 : first_trusted + 1] = b"\xff\xd9"  # inside an EXIF thumbnail's reach: decoded
    assert images.image_info(bytes(marked), "a.jpg", None) == (1, 0) and len(loads) == 1
    with pytest.raises(DataError) as e:
        images.image_info(bytes(cut), "a.jpg", None)  # no marker: decoded, and refused
    assert len(loads) == 2 and str(e.value) == (
        "a.jpg: not a readable image (JPEG data cut short or damaged); copy the whole file again, or remove it"
    )


# --- the decode: exact pixels ----------------------------------------------------------------------------


def _gray(path, rows) -> Path:
    from PIL import Image

    Image.fromarray(np.asarray(rows, np.uint8)).save(path)
    return path


def test_shrinking_averages_every_pixel_and_growing_interpolates(tmp_path):
    column = _gray(tmp_path / "column.png", [[0, 255, 0]] * 3)
    row = _gray(tmp_path / "row.png", [[0] * 3, [255] * 3, [0] * 3])
    dot = _gray(tmp_path / "dot.png", [[0, 0, 0], [0, 255, 0], [0, 0, 0]])
    pair = _gray(tmp_path / "pair.png", [[0, 255]])
    strip = _gray(tmp_path / "strip.png", [[0, 255, 0]])
    got = {
        "column to 3x1": images.load_image_file(column, (3, 1, 1))[..., 0].tolist(),  # as tall: still "area"
        "row to 1x3": images.load_image_file(row, (1, 3, 1))[..., 0].tolist(),  # as wide: still "area"
        "dot to 1x1": images.load_image_file(dot, (1, 1, 1))[..., 0].tolist(),
        "pair to 1x4": images.load_image_file(pair, (1, 4, 1))[..., 0].tolist(),  # as tall, wider: bilinear
        "strip to 2x1": images.load_image_file(strip, (2, 1, 1))[..., 0].tolist(),  # taller, narrower: bilinear
    }
    assert got == {
        "column to 3x1": [[85], [85], [85]],
        "row to 1x3": [[85, 85, 85]],
        "dot to 1x1": [[28]],  # 255 / 9 = 28.3; bilinear would sample the centre, 255
        "pair to 1x4": [[0, 64, 191, 255]],  # 63.75 and 191.25 rounded; "area" would give 0, 0, 255, 255
        "strip to 2x1": [[255], [255]],  # the centre sampled; "area" would give 85
    }


def test_a_grayscale_model_reads_a_png_with_its_own_gray_and_a_gif_bmp_or_cmyk_jpeg_through_rgb(tmp_path):
    from PIL import Image

    yellow = Image.new("RGB", (4, 4), (255, 255, 0))
    for fmt in ("png", "gif", "bmp"):
        yellow.save(tmp_path / f"yellow.{fmt}")
    yellow.convert("CMYK").save(tmp_path / "yellow.jpg", quality=100)
    Image.new("RGBA", (4, 4), (255, 255, 0, 128)).save(tmp_path / "yellow32.bmp")  # 32 bits a pixel
    formats = ("png", "gif", "bmp", "jpg", "32.bmp")
    got = {
        fmt: images.load_image_file(tmp_path / f"yellow{'' if fmt[0].isdigit() else '.'}{fmt}", (4, 4, 1))
        for fmt in formats
    }
    # libpng's own gray of yellow is 225; TensorFlow's rgb_to_grayscale gives 226.
    assert {fmt: (x.shape, int(x.min()), int(x.max())) for fmt, x in got.items()} == {
        "png": ((4, 4, 1), 225, 225),
        "gif": ((4, 4, 1), 226, 226),
        "bmp": ((4, 4, 1), 226, 226),
        "jpg": ((4, 4, 1), 226, 226),
        "32.bmp": ((4, 4, 1), 226, 226),
    }


def test_a_colour_model_reads_a_gray_or_a_transparent_png_as_three_channels(tmp_path):
    from PIL import Image

    Image.new("L", (4, 4), 77).save(tmp_path / "gray.png")
    Image.new("RGBA", (4, 4), (10, 20, 30, 40)).save(tmp_path / "rgba.png")
    gray, rgba = (images.load_image_file(tmp_path / name, (4, 4, 3)) for name in ("gray.png", "rgba.png"))
    assert (gray.shape, gray[0, 0].tolist(), rgba.shape, rgba[0, 0].tolist()) == (
        (4, 4, 3),
        [77, 77, 77],
        (4, 4, 3),
        [10, 20, 30],  # the alpha channel dropped
    )


def _upright(paths) -> np.ndarray:
    """The scan's header info of files that are upright and not CMYK, as the scan records it for a PNG."""
    return np.tile(np.int32([1, 0]), (len(paths), 1))


def test_decode_files_fills_each_row_in_order_over_several_batches_and_names_a_bad_file_in_a_later_one(tmp_path):
    shades = [_gray(tmp_path / f"{v}.png", [[v, v], [v, v]]) for v in (10, 20, 30)]
    paths = [str(shades[i % 3]) for i in range(2 * images._DECODE_BATCH + 7)]
    out = np.zeros((len(paths), 2, 2, 1), np.uint8)
    images.decode_files(paths, (2, 2, 1), _upright(paths), out)
    assert out[:, 0, 0, 0].tolist() == [(10, 20, 30)[i % 3] for i in range(len(paths))]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a PNG")
    paths[2 * images._DECODE_BATCH + 3] = str(bad)  # in the third batch
    with pytest.raises(DataError) as e:
        images.decode_files(paths, (2, 2, 1), _upright(paths), out)
    assert str(e.value) == (
        f"{bad}: not a readable image; the formats read are JPEG, PNG, GIF (first frame) or BMP (of 8, 24 or 32 "
        "bits a pixel): convert or remove it"
    )


def test_the_search_for_the_file_that_failed_a_decode_pass_applies_no_size_limit(tmp_path):
    """The scan checked MAX_IMAGE_PIXELS, which may be raised above its default: when a pass fails, the search for
    its bad file must not refuse a photo for predict's default limit and name it instead of the file that failed."""
    big = tmp_path / "big.png"
    big.write_bytes(_png(8000, 8000, rows=8000))  # 64 million black pixels; the default limit is 50 million
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a PNG")
    with pytest.raises(DataError) as e:
        images.decode_files([str(big), str(bad)], (2, 2, 1), _upright("ab"))
    assert str(e.value) == (
        f"{bad}: not a readable image; the formats read are JPEG, PNG, GIF (first frame) or BMP (of 8, 24 or 32 "
        "bits a pixel): convert or remove it"
    )


def test_a_decode_pass_that_fails_though_each_of_its_files_decodes_alone_names_its_images_and_the_reason(
    tmp_path, monkeypatch
):
    """Python opens "file://img.png" as the file img.png in the folder "file:"; TensorFlow reads it as a URI, finds
    no file there, and the pass fails. The search then finds no bad file: the message says which images the pass
    held and why it failed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file:").mkdir()
    _gray(tmp_path / "file:" / "img.png", [[9]])
    assert images.load_image_file("file://img.png", (1, 1, 1)).tolist() == [[[9]]]
    with pytest.raises(DataError) as e:
        images.decode_files(["file://img.png"], (1, 1, 1), _upright("a"))
    assert str(e.value) == "decoding images 1 to 1 of 1 failed (file://img.png; No such file or directory)"


# --- where each CACHE keeps the decoded images --------------------------------------------------------


def _small_dir(make_image_dir, tmp_path, cache):
    """settings of a folder of 2 classes of 3 tiny images: 2 x 2 to train on, 2 x 1 to validate."""
    return settings(make_image_dir(classes=2, per_class=3, size=10), tmp_path, cache=cache, image_size=10)


@pytest.mark.parametrize("cache", ["none", "memory", "file"])
def test_each_cache_keeps_the_decoded_images_where_it_says_and_nowhere_else(make_image_dir, tmp_path, cache):
    spec = data.load_data(_small_dir(make_image_dir, tmp_path, cache))
    kept = [spec._train.x, spec._val.x]
    written = sorted(p.relative_to(tmp_path / "runs") for p in (tmp_path / "runs").rglob("*") if p.is_file())
    if cache == "none":  # each file decoded once to check it, then read again at each epoch
        assert (kept, images._DECODED, written) == ([None, None], {}, [])
        return
    assert [(type(x), x.dtype, x.shape) for x in kept] == [
        (np.ndarray if cache == "memory" else np.memmap, np.uint8, (n, 10, 10, 3)) for n in (4, 2)
    ]
    if cache == "memory":  # kept for the process, on no disk
        assert [id(x) for x in images._DECODED.values()] == [id(x) for x in kept] and written == []
        return
    # On disk, in one folder named after the data's fingerprint: each split's array and its record.
    (folder,) = {p.parent for p in written}
    assert folder.parent == Path(".cache") and spec.fingerprint.startswith(folder.name) and images._DECODED == {}
    keys = [p.stem for p in written if p.suffix == ".npy"]
    assert len(keys) == 2 and sorted(p.name for p in written) == sorted(
        [".writers.lock", *(k + e for k in keys for e in (".json", ".npy"))]
    )


# --- the split's checks, called directly --------------------------------------------------------------


def test_the_split_refusals_name_the_classes_and_the_smallest_class(tmp_path, caplog):
    names = ["a", "b", "c"]
    with pytest.raises(DataError) as e:
        images._check_split(tmp_path, names, np.array([0, 0, 1, 2]), np.array([0]), 0.5)
    assert str(e.value) == (
        f"{tmp_path / 'b'}: class 'b' has a single image (and 1 more classes); with VAL_SPLIT=0.5 a class needs at "
        "least 2 (one to train on, one to validate): add images, remove the folder, or set VAL_SPLIT=0"
    )
    with pytest.raises(DataError) as e:
        images._check_split(tmp_path, names, np.array([0] * 4 + [1] * 6 + [2] * 5), np.array([], np.int64), 0.1)
    assert str(e.value) == (
        f"{tmp_path}: VAL_SPLIT=0.1 of 4 images in the smallest class leaves no image for validation; raise "
        "VAL_SPLIT or add images"
    )
    many = [f"c{i}" for i in range(8)]
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7])
    with caplog.at_level("WARNING", logger="train"):
        images._check_split(tmp_path, many, labels, np.array([0, 2]), 0.2)  # c2..c7 validate nothing
        images._check_split(tmp_path, many, labels, np.array([0, 2, 4, 6, 8, 10]), 0.2)  # c6, c7
        images._check_split(tmp_path, many, labels, np.array([0, 2, 4]), 0.2)  # five, all named: c3..c7
        images._check_split(tmp_path, many, labels, np.arange(0, 16, 2), 0.2)  # every class: no warning
    assert _warnings(caplog) == [
        f"WARNING: {tmp_path}: VAL_SPLIT=0.2 leaves 6 of 8 classes without a validation image ('c2', 'c3', 'c4', "
        "'c5', 'c6', ...): their accuracy is never measured; raise VAL_SPLIT or add images",
        f"WARNING: {tmp_path}: VAL_SPLIT=0.2 leaves 2 of 8 classes without a validation image ('c6', 'c7'): their "
        "accuracy is never measured; raise VAL_SPLIT or add images",
        f"WARNING: {tmp_path}: VAL_SPLIT=0.2 leaves 5 of 8 classes without a validation image ('c3', 'c4', 'c5', "
        "'c6', 'c7'): their accuracy is never measured; raise VAL_SPLIT or add images",
    ]


# --- CACHE=file: each reason a cache is not trusted, in its warning ----------------------------------


def test_each_reason_a_file_cache_is_not_trusted_is_the_whole_warning(tmp_path, caplog):
    import json

    from train.digest import sha256_file

    path = tmp_path / "cache.npy"
    record = tmp_path / "cache.json"
    shape = (2, 4, 4, 1)

    def check(expected_problem):
        caplog.clear()
        with caplog.at_level("WARNING", logger="train"):
            assert images._verified_cache(path, shape, "fp") is None
        if expected_problem is None:
            assert _warnings(caplog) == []
        else:
            assert _warnings(caplog) == [
                f"WARNING: decode cache {path} does not match the data: {expected_problem}; decoding the images again"
            ]

    def write(array, fingerprint="fp", digest=None):
        np.save(path, array)
        record.write_text(json.dumps({"fingerprint": fingerprint, "sha256": digest or sha256_file(path)}))

    check(None)  # no cache yet: silently none
    np.save(path, np.zeros(shape, np.uint8))
    check("its record cache.json is missing or unreadable (FileNotFoundError)")
    record.write_text("[1, 2]")
    check("its record cache.json is missing or unreadable (ValueError)")
    record.write_text("{not json")
    check("its record cache.json is missing or unreadable (JSONDecodeError)")
    write(np.zeros(shape, np.uint8), fingerprint="other")
    check("it was decoded from other data (its record holds another data fingerprint)")
    write(np.zeros(shape, np.uint8), digest="0" * 64)
    check("its bytes changed since it was written")
    write(np.zeros((2, 4, 4, 3), np.uint8))
    check("it holds uint8 (2, 4, 4, 3), not uint8 (2, 4, 4, 1)")
    write(np.zeros(shape, np.float32))
    check("it holds float32 (2, 4, 4, 1), not uint8 (2, 4, 4, 1)")
    path.write_bytes(b"not an array")
    record.write_text(json.dumps({"fingerprint": "fp", "sha256": sha256_file(path)}))
    check(  # numpy's words for bytes that are no .npy
        "it cannot be read (ValueError: This file contains pickled (object) data. If you trust the file you can "
        "load it unsafely using the `allow_pickle=` keyword argument or `pickle.load()`.)"
    )
    path.unlink()
    check(f"it cannot be read (FileNotFoundError: [Errno 2] No such file or directory: '{path}')")
    write(np.full(shape, 7, np.uint8))
    assert images._verified_cache(path, shape, "fp").tolist() == np.full(shape, 7).tolist()


def test_tf_message_keeps_what_went_wrong_and_drops_the_op_and_function_names():
    class OpError(Exception):
        message = "{{function_node __wrapped__DecodeImage}} Unknown image file format [Op:DecodeImage] name: x\nmore"

    assert images.tf_message(OpError()) == "Unknown image file format"
    assert images.tf_message(ValueError("first line\nsecond")) == "first line"
    assert images.tf_message(ValueError("x" * 300)) == "x" * 200
    assert images.tf_message(ValueError("")) == "ValueError"
