"""predict: class and probability per image file, from a run's best weights (no export) or its SavedModel."""

from __future__ import annotations

import contextlib
import json
import os
import stat

import numpy as np
import pytest
from PIL import Image

from train.config import Settings
from train.models import build_model
from train.results.predict import format_predictions, predict_files


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "20260101-000000-aaaa"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings(model="cnn").to_dict()))
    (run / "manifest.json").write_text(
        json.dumps({"data": {"input_shape": [28, 28, 1], "class_names": ["cat", "dog", "eel"]}})
    )
    model = build_model("cnn", (28, 28, 1), 3)
    model.save_weights(run / "best.weights.h5")
    return run, model


def _png(path, value):
    Image.fromarray(np.full((28, 28), value, np.uint8)).save(path)
    return str(path)


def test_predict_from_best_weights_matches_the_model(run_dir, tmp_path):
    run, model = run_dir
    files = [_png(tmp_path / "a.png", 0), _png(tmp_path / "b.png", 200)]
    rows = predict_files(run, files)
    expected = np.asarray(model(np.stack([np.full((28, 28, 1), v, np.float32) for v in (0, 200)]), training=False))
    for row, probs in zip(rows, expected):
        k = int(np.argmax(probs))
        assert row["index"] == k and row["class"] == ["cat", "dog", "eel"][k]
        assert row["probability"] == pytest.approx(float(probs[k]), rel=1e-5)
    assert [r["file"] for r in rows] == files


def test_many_files_are_predicted_a_batch_at_a_time_with_the_same_answers(run_dir, tmp_path, monkeypatch):
    """Every file was decoded and given to the model in one batch: memory grew with the number of files."""
    from train.results import export, predict

    run, model = run_dir
    files = [_png(tmp_path / f"{i}.png", 40 * i) for i in range(5)]
    files[2] = str(tmp_path / "missing.png")  # a bad file takes no place in its batch
    batches: list[int] = []

    class Counted:
        inputs = model.inputs

        def __call__(self, batch, training):
            batches.append(len(batch))
            return model(batch, training=training)

    monkeypatch.setattr(export, "rebuild_model", lambda path, runs_dir=None: (Counted(), ["cat", "dog", "eel"], None))
    monkeypatch.setattr(predict, "BATCH", 2)
    rows = predict_files(run, files)
    assert batches == [2, 1, 1]
    expected = np.asarray(model(np.stack([np.full((28, 28, 1), 40 * i, np.float32) for i in (0, 1, 3, 4)])))
    answered = [r for r in rows if "error" not in r]
    assert [r["file"] for r in answered] == [files[i] for i in (0, 1, 3, 4)] and "error" in rows[2]
    assert [r["index"] for r in answered] == [int(np.argmax(p)) for p in expected]


def test_format_predictions_aligns_the_columns():
    out = format_predictions(
        [
            {"file": "a.png", "class": "cat", "probability": 0.5},
            {"file": "long/b.png", "class": "dog", "probability": 0.98765},
        ]
    )
    assert out.splitlines() == ["a.png       cat  0.5000", "long/b.png  dog  0.9877"]


def test_predict_with_the_export_names_classes_from_the_manifest(run_dir, tmp_path):
    """export/labels.txt is a copy for serving code; predict reads the manifest like every reader."""
    from train.errors import ExportError
    from train.results.export import write_savedmodel

    run, model = run_dir
    write_savedmodel(model, run / "export" / "savedmodel")
    (run / "export" / "labels.txt").write_text("x\ny\nz\n")
    (run / "best.weights.h5").unlink()  # the export is what predicts
    rows = predict_files(run, [_png(tmp_path / "a.png", 0)])
    assert rows[0]["class"] == ["cat", "dog", "eel"][rows[0]["index"]]
    # An export older than a change of data (other classes) is refused, not mislabelled.
    data = {"input_shape": [28, 28, 1], "class_names": ["cat", "dog"]}
    (run / "manifest.json").write_text(json.dumps({"data": data}))
    with pytest.raises(ExportError, match="predicts 3 classes but the run has 2.*python -m train export"):
        predict_files(run, [_png(tmp_path / "a.png", 0)])


# -- bad image files, a damaged or stale export ---------------------------------------------------
@pytest.fixture
def no_hang():
    """A safety net: a read that blocks (a FIFO) fails the test instead of hanging the suite."""
    import signal

    def hung(*_):
        raise TimeoutError("predict blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_fifo_among_the_images_is_refused_without_blocking_and_the_others_are_predicted(run_dir, tmp_path, no_hang):
    import os

    run, _ = run_dir
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    files = [_png(tmp_path / "a.png", 0), str(fifo), str(tmp_path), _png(tmp_path / "b.png", 200)]
    rows = predict_files(run, files)
    assert [r["file"] for r in rows] == files
    assert "class" in rows[0] and "class" in rows[3]
    assert str(rows[1]["error"]) == f"{fifo} is a named pipe (FIFO), not an image file; give regular image files " + (
        "(JPEG, PNG, GIF (first frame) or BMP)"
    )
    assert str(rows[2]["error"]).startswith(f"{tmp_path} is a directory, not an image file")
    odd = tmp_path / "two\nlines.png"
    odd.write_text("no image")
    (row,) = predict_files(run, [str(odd)])
    assert "\n" not in str(row["error"]) and str(row["error"]).startswith(f"{tmp_path}/two\\nlines.png: not a")


def test_an_unreadable_image_is_one_data_error_line(run_dir, tmp_path, monkeypatch):
    import os

    from train.results import predict

    run, _ = run_dir
    locked = _png(tmp_path / "locked.png", 10)
    real_open = os.open

    def denied(path, *a, **k):  # chmod 000: what a user who is not root gets (root reads anything)
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(predict.os, "open", denied)
    (row,) = predict_files(run, [locked])
    assert str(row["error"]) == f"{locked} cannot be read (permission denied): `chmod +r` it or run as its owner"


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root reads a mode-000 file")
def test_a_mode_000_image_is_refused(run_dir, tmp_path):
    run, _ = run_dir
    locked = _png(tmp_path / "locked.png", 10)
    (tmp_path / "locked.png").chmod(0)
    (row,) = predict_files(run, [locked])
    assert "cannot be read (permission denied)" in str(row["error"])


def test_images_of_another_size_or_colour_are_predicted_and_each_conversion_is_said_once(run_dir, tmp_path, capsys):
    from train import cli

    run, _ = run_dir
    photo = tmp_path / "photo.jpg"
    Image.fromarray(np.full((150, 200, 3), 90, np.uint8)).save(photo)  # 200x150 colour
    again = tmp_path / "again\nnote: fake.png"  # another size, the same colours; a name that would forge a line
    Image.fromarray(np.full((60, 50, 3), 50, np.uint8)).save(again, format="PNG")
    small = tmp_path / "small.png"
    Image.fromarray(np.full((40, 40), 20, np.uint8)).save(small)  # grayscale: resized only
    plain = _png(tmp_path / "plain.png", 100)  # already 28x28 grayscale
    rows = predict_files(run, [str(photo), plain])
    assert rows[0]["converted"] == "200x150 RGB -> 28x28 grayscale" and "converted" not in rows[1]
    argv = ["predict", run.name, str(again), str(small), str(photo), plain, "--runs-dir", str(run.parent)]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 4
    said = "converted to the model's input as training decodes images"
    assert err.strip().splitlines() == [
        f"note: {tmp_path}/again\\nnote: fake.png and 1 more {said} (e.g. 50x60 RGB -> 28x28 grayscale)",
        f"note: {small} {said} (40x40 grayscale -> 28x28 grayscale)",
    ]


def test_the_command_reports_each_bad_file_and_predicts_the_others_exit_3(run_dir, tmp_path, capsys):
    from train import cli

    run, _ = run_dir
    (tmp_path / "text.png").write_text("not an image")
    good = _png(tmp_path / "good.png", 100)
    argv = ["predict", run.name, str(tmp_path / "missing.png"), good, str(tmp_path / "text.png")]
    assert cli.main([*argv, "--runs-dir", str(run.parent)]) == 3
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(good) and len(out.splitlines()) == 1
    errors = [line for line in err.splitlines() if line.startswith("DataError: ")]
    assert len(errors) == 2
    assert errors[0].startswith(f"DataError: {tmp_path / 'missing.png'} does not exist")
    assert errors[1] == (
        f"DataError: {tmp_path / 'text.png'}: not a readable image; the formats read are JPEG, PNG, GIF (first frame) "
        "or BMP (of 8, 24 or 32 bits a pixel): convert or remove it"
    )


def test_a_jpeg_cut_short_is_one_data_error_line_and_nothing_else_on_stderr(run_dir, tmp_path, capfd):
    """TensorFlow's libjpeg wrote "Improper call to JPEG library in state 201" (cut in the header) or
    "Premature end of JPEG data" (cut in the pixels) to stderr from C, before the DataError line."""
    import io

    from train import cli

    run, _ = run_dir
    noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3), np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(noise).save(encoded, format="JPEG")
    whole = encoded.getvalue()
    header, pixels = tmp_path / "header.jpg", tmp_path / "pixels.jpg"
    header.write_bytes(whole[:300])  # inside the quantization and Huffman tables
    pixels.write_bytes(whole[: len(whole) // 2])
    capfd.readouterr()
    assert cli.main(["predict", run.name, str(header), str(pixels), "--runs-dir", str(run.parent)]) == 3
    out, err = capfd.readouterr()
    assert out == ""
    said = "not a readable image (JPEG data cut short or damaged); copy the whole file again, or remove it"
    assert err.splitlines() == [f"DataError: {header}: {said}", f"DataError: {pixels}: {said}"]


def test_in_the_compose_container_a_file_left_on_the_host_is_told_to_go_in_data(run_dir, tmp_path, monkeypatch, capsys):
    """`docker compose run --rm train predict RUN digit.png` cannot see digit.png beside the compose file."""
    from train import cli
    from train.setup import hardware

    run, _ = run_dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hardware, "in_container", lambda root=None, orchestrated=False: True)
    monkeypatch.setenv("DATA_DIR", "/data")  # docker-compose.yml's volume
    assert cli.main(["predict", run.name, "digit.png", "--runs-dir", str(run.parent)]) == 3
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("DataError: ")]
    assert errors == [
        "DataError: digit.png does not exist; give existing image files (JPEG, PNG, GIF (first frame) or BMP); "
        "the container sees the host only through its volumes: put the file in ./data beside docker-compose.yml "
        "(DATA_HOST_DIR in .env moves it) and give it as /data/<file>"
    ]


def test_columns_line_up_whatever_the_names():
    rows = [
        {"file": "a.png", "class": "cat", "probability": 0.5},
        {"file": "some/very/long/folder/name/b.png", "class": "hippopotamus", "probability": 0.98765},
        {"file": "猫の写真.png", "class": "dog", "probability": 1.0},
        {"file": "new\nline.png", "class": "eel", "probability": 0.25},
        {"file": "bad.png", "error": ValueError("left out")},
    ]
    lines = format_predictions(rows).splitlines()
    # The bad file is reported on stderr instead; a newline in a name is shown escaped; a wide
    # (CJK) character takes two columns, as in a terminal.
    assert lines == [
        "a.png" + " " * 27 + "  cat           0.5000",
        "some/very/long/folder/name/b.png  hippopotamus  0.9877",
        "猫の写真.png" + " " * 20 + "  dog           1.0000",
        "new\\nline.png" + " " * 19 + "  eel           0.2500",
    ]


def _lines(caplog):
    """Each record once (a handler another test left on the logger would show it twice)."""
    return list({id(r): r.getMessage() for r in caplog.records}.values())


def _export(run, model, source=None):
    from train.results.export import write_savedmodel, write_source
    from train.run.rundir import ExportDir

    exp = ExportDir(run / "export")
    write_savedmodel(model, exp.savedmodel)
    exp.labels.write_text("cat\ndog\neel\n")
    write_source(exp, source)
    return exp


@pytest.mark.parametrize("recorded", [True, False], ids=["with-source.json", "older-export"])
@pytest.mark.parametrize(
    "damage",
    [
        lambda sm: (sm / "saved_model.pb").write_bytes((sm / "saved_model.pb").read_bytes()[:100]),
        lambda sm: (sm / "variables" / "variables.index").unlink(),
        lambda sm: (sm / "variables" / "variables.index").write_bytes(b"\0" * 10),
        lambda sm: (sm / "saved_model.pb").unlink(),
    ],
    ids=["truncated-pb", "no-index", "garbage-index", "no-pb"],
)
def test_a_damaged_export_is_one_line_naming_it_and_the_fix(run_dir, tmp_path, capsys, recorded, damage):
    from train import cli

    run, model = run_dir
    exp = _export(run, model)
    if not recorded:
        exp.source.unlink()
    damage(exp.savedmodel)
    argv = ["predict", run.name, _png(tmp_path / "a.png", 0), "--runs-dir", str(run.parent)]
    assert cli.main(argv) == 8
    (line,) = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("WARNING")]
    assert line.startswith(f"ExportError: the export of run {run.name}")
    assert line.endswith(f"export it again with `python -m train export {run.name} --runs-dir {run.parent}`")


def test_a_bit_flip_in_the_exported_variables_is_caught_by_source_json(run_dir, tmp_path):
    from train.errors import ExportError

    run, model = run_dir
    exp = _export(run, model)
    data = exp.savedmodel / "variables" / "variables.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(ExportError, match=f"is damaged: {data} has sha256"):
        predict_files(run, [_png(tmp_path / "a.png", 0)])


def test_an_export_swapped_in_while_predict_checks_the_previous_one_is_read_again_not_called_damaged(
    run_dir, tmp_path, monkeypatch
):
    import shutil

    from train.results import export, predict
    from train.run.rundir import ExportDir

    run, model = run_dir
    exp = _export(run, model)
    staged = ExportDir(run / "export.tmp-new")  # the next export, its labels.txt another file
    shutil.copytree(exp.path, staged.path)
    staged.labels.write_text("cat\ndog\neel\r\n")
    export.write_source(staged, None)
    real = predict._recorded_file_sha256

    def swapped_first(*args):  # export swaps its folder in between source.json's read and the files'
        if staged.path.exists():
            export._swap_into_place(staged.path, exp.path)
        return real(*args)

    monkeypatch.setattr(predict, "_recorded_file_sha256", swapped_first)
    (row,) = predict_files(run, [_png(tmp_path / "a.png", 0)])
    assert row["class"] in ("cat", "dog", "eel") and json.loads(exp.source.read_text())["files"]["labels.txt"]


def test_an_export_older_than_the_runs_best_weights_says_so_in_one_warning(run_dir, tmp_path, caplog, monkeypatch):
    import logging

    from train.run.weights import save_weights, verify

    run, model = run_dir
    save_weights(model, run / "best.weights.h5", epoch=1)
    _export(run, model, verify(run, run / "best.weights.h5"))
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        predict_files(run, [_png(tmp_path / "a.png", 0)])
        assert _lines(caplog) == []  # up to date: nothing to say
        newer = build_model("cnn", (28, 28, 1), 3)
        save_weights(newer, run / "best.weights.h5", epoch=3)  # a resume with EXPORT=false trained on
        rows = predict_files(run, [_png(tmp_path / "a.png", 0)])
    (line,) = _lines(caplog)
    assert line == (
        f"WARNING: the export of run {run.name} was made from best.weights.h5 of epoch 1, but the run's weights are "
        f"now best.weights.h5 (epoch 3): these predictions come from the export's weights, not those; bring it up to date with "
        f"`python -m train export {run.name}`"
    )
    assert "class" in rows[0]  # still answered, from the export


def test_an_export_that_records_no_source_is_used_with_one_warning(run_dir, tmp_path, caplog, monkeypatch):
    import logging

    run, model = run_dir
    _export(run, model).source.unlink()
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        predict_files(run, [_png(tmp_path / "a.png", 0)])
    (line,) = _lines(caplog)
    assert line == (
        f"WARNING: the export of run {run.name} does not record the weights it was made from (exported before that "
        "was kept): it may be older than the run's best weights; export it again with "
        f"`python -m train export {run.name}` to be sure"
    )


def test_an_export_whose_source_json_was_deleted_is_refused_not_served_unchecked(run_dir, tmp_path, capsys):
    """The manifest records the export, which wrote source.json: its absence is damage (or tampering),
    not an export older than source.json, and the files it would have checked are not used."""
    from train import cli
    from train.run.manifest import update_manifest

    run, model = run_dir
    exp = _export(run, model)
    update_manifest(run / "manifest.json", export={"savedmodel": str(exp.savedmodel), "source": {"file": None}})
    exp.source.unlink()
    assert cli.main(["predict", run.name, _png(tmp_path / "a.png", 0), "--runs-dir", str(run.parent)]) == 8
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"ExportError: the export of run {run.name} is damaged: {exp.source} is missing, though the run's manifest "
        f"records an export that wrote it, so its files cannot be checked: export it again with "
        f"`python -m train export {run.name} --runs-dir {run.parent}`"
    )


@pytest.mark.parametrize(
    "content", [b"", b"weights\n", b"\x89HDF\r\n\x1a\n" + b"\0" * 40], ids=["empty", "text", "cut"]
)
def test_predict_without_an_export_and_damaged_best_weights_is_one_line_exit_4(run_dir, tmp_path, capsys, content):
    from train import cli

    run, _ = run_dir
    (run / "best.weights.h5").write_bytes(content)
    (run / "checkpoints").mkdir()  # the fallback: a checkpoint's header is all the message reads of it
    np.savez(run / "checkpoints" / "ckpt-000000007.npz", __meta__=np.frombuffer(b'{"epoch": 1}', np.uint8))
    assert cli.main(["predict", run.name, _png(tmp_path / "a.png", 0), "--runs-dir", str(run.parent)]) == 4
    (line,) = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("WARNING")]
    assert line.startswith(f"WeightsError: run {run.name}: {run / 'best.weights.h5'} does not load: it is ")
    assert f"--resume {run.name} --runs-dir {run.parent}`" in line  # where the run was found


def _hand_export(root):
    """An export folder with a hand-written source.json (no TensorFlow): what a copied export may hold."""
    import hashlib

    from train.run.rundir import ExportDir

    exp = ExportDir(root / "export")
    (exp.savedmodel / "variables").mkdir(parents=True)
    (exp.savedmodel / "saved_model.pb").write_bytes(b"pb")
    exp.labels.write_text("cat\ndog\n")
    files = {
        rel: hashlib.sha256((exp.path / rel).read_bytes()).hexdigest()
        for rel in ("savedmodel/saved_model.pb", "labels.txt")
    }
    return exp, files


def _write_files(exp, files):
    import json

    exp.source.write_text(json.dumps({"weights": {}, "files": files}))


_OUTSIDE = "not a file inside the export folder"


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "../../../../../../../../etc/hostname",
            f"{{source}} lists '../../../../../../../../etc/hostname', {_OUTSIDE}",
        ),
        ("/etc/hostname", f"{{source}} lists '/etc/hostname', {_OUTSIDE}"),
        ("/dev/zero", f"{{source}} lists '/dev/zero', {_OUTSIDE}"),
        ("out", f"{{source}} lists 'out', {_OUTSIDE}"),  # a link out of the folder
        ("zero", f"{{source}} lists 'zero', {_OUTSIDE}"),  # a link to a device
        ("fifo", "{path} is a named pipe (FIFO), not a file export writes"),
        ("sock", "{path} is a socket, not a file export writes"),  # it said No such device or address
        ("savedmodel", "{path} is a directory, not a file export writes"),
        ("", f"{{source}} lists '', {_OUTSIDE}"),
        ("nul\0byte", f"{{source}} lists 'nul\\x00byte', {_OUTSIDE}"),  # shown escaped, on one line
        ("loop", f"{{source}} lists 'loop', {_OUTSIDE}"),
        ("../" * 100 + "etc", "{source} lists '" + ("../" * 100)[:199] + f", {_OUTSIDE}"),  # cut at 200 characters
    ],
)
def test_source_json_names_only_regular_files_inside_the_export(tmp_path, monkeypatch, entry, says, no_hang):
    import os
    import socket

    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, files = _hand_export(tmp_path)
    (exp.path / "out").symlink_to("/etc/hostname")
    (exp.path / "zero").symlink_to("/dev/zero")
    (exp.path / "loop").symlink_to(exp.path / "loop")
    os.mkfifo(exp.path / "fifo")
    monkeypatch.chdir(exp.path)  # a socket's path is limited to 108 bytes
    socket.socket(socket.AF_UNIX).bind("sock")
    _write_files(exp, {**files, entry: "0" * 64})
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r")
    # Nothing outside the export is read, so no digest of it is shown.
    says = says.format(source=exp.source, path=exp.path / entry)
    assert str(err.value) == f"the export of run r is damaged: {says}: export it again with `python -m train export r`"


@pytest.mark.parametrize(
    "gone, flags",
    [
        ("savedmodel/saved_model.pb", ""),
        ("model.onnx", " --format onnx"),
        ("model.int8.tflite", " --format litert --quantize int8"),
    ],
)
def test_a_file_deleted_from_the_export_is_missing_with_the_command_that_makes_it(tmp_path, gone, flags):
    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, files = _hand_export(tmp_path)
    _write_files(exp, {**files, gone: "0" * 64})
    (exp.path / gone).unlink(missing_ok=True)
    with pytest.raises(ExportError) as err:  # it said "damaged: ... cannot be read (No such file or directory)"
        verify_export_files(exp, "r", runs_dir="elsewhere")
    assert str(err.value) == (
        f"the export of run r is missing {exp.path / gone}, which export wrote: "
        f"export it again with `python -m train export r --runs-dir elsewhere{flags}`"
    )


def test_a_named_pipe_for_source_json_is_refused_never_waited_on(tmp_path):
    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, _ = _hand_export(tmp_path)
    os.mkfifo(exp.source)  # nobody writes it: predict and serve blocked on it forever
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r")
    assert str(err.value).startswith(f"the export of run r: {exp.source} is unreadable (a named pipe (FIFO), not a")


@pytest.mark.parametrize("kept", [(), ("labels.txt",)], ids=["no-files", "not-the-savedmodel"])
def test_a_source_json_that_leaves_the_savedmodel_unrecorded_is_refused(tmp_path, kept):
    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, files = _hand_export(tmp_path)
    _write_files(exp, {rel: files[rel] for rel in kept})
    with pytest.raises(ExportError, match="lists no files|records no sha256 of savedmodel/saved_model.pb"):
        verify_export_files(exp, "r")
    _write_files(exp, files)
    assert verify_export_files(exp, "r") == {}


def test_an_image_over_the_pixel_limit_is_told_to_shrink_not_to_raise_a_setting_predict_ignores(
    run_dir, tmp_path, monkeypatch
):
    """predict (and serve) read with MAX_IMAGE_PIXELS's default: `raise MAX_IMAGE_PIXELS`, as training says,
    changed nothing here (MAX_IMAGE_PIXELS=500000000 python -m train predict ... gave the same line)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    run, _ = run_dir
    monkeypatch.setenv("MAX_IMAGE_PIXELS", "500000000")
    big = tmp_path / "big.png"  # a header declaring 20000x20000 grayscale pixels, four rows of them held
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)
    big.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 20001 * 4))
        + chunk(b"IEND", b"")
    )
    (row,) = predict_files(run, [str(big)])
    assert str(row["error"]) == (
        f"{big}: 20000x20000 is 400 million pixels, more than MAX_IMAGE_PIXELS=50,000,000 (decoding it would take "
        "about 1.2 GB); shrink the image (the model takes 28x28; this limit is MAX_IMAGE_PIXELS's default, which no setting "
        "changes here)"
    )


def test_the_rebuilt_model_is_called_for_inference_on_float32_and_an_index_past_the_names_is_shown_as_a_number(
    run_dir, tmp_path, monkeypatch
):
    """training=True would run dropout (another answer each time); the model takes float32, not the decoded uint8.
    A model with more outputs than the run has class names answers the index itself, never a wrong name."""
    from train.results import export

    run, model = run_dir
    calls = []

    class Fixed:
        inputs = model.inputs

        def __call__(self, batch, training):
            calls.append((batch.dtype, training))
            return np.tile(np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]], np.float32), (len(batch) // 2, 1))

    monkeypatch.setattr(export, "rebuild_model", lambda path, runs_dir=None: (Fixed(), ["cat", "dog"], None))
    rows = predict_files(run, [_png(tmp_path / "a.png", 0), _png(tmp_path / "b.png", 9)])
    assert calls == [(np.float32, False)]
    assert [{k: r[k] for k in ("class", "index", "probability")} for r in rows] == [
        {"class": "2", "index": 2, "probability": pytest.approx(0.7)},
        {"class": "cat", "index": 0, "probability": pytest.approx(0.6)},
    ]


def test_an_export_that_does_not_load_names_the_error_and_its_first_line(tmp_path, monkeypatch):
    import tensorflow as tf

    from train.errors import ExportError
    from train.results.predict import open_savedmodel
    from train.run.rundir import ExportDir

    def broken(path):
        raise OSError("saved_model.pb: Input/output error\n  (the rest of a long trace)")

    monkeypatch.setattr(tf.saved_model, "load", broken)
    exp = ExportDir(tmp_path / "export")
    with pytest.raises(ExportError) as err:
        open_savedmodel(exp, "r1", ["cat"])
    assert str(err.value) == (
        f"the export of run r1 ({exp.savedmodel}) does not load (OSError: saved_model.pb: Input/output error): "
        "export it again with `python -m train export r1`"
    )


def test_only_bad_files_print_nothing_and_combining_or_fullwidth_characters_keep_the_columns():
    from train.results.predict import format_predictions

    assert format_predictions([{"file": "bad.png", "error": ValueError("left out")}]) == ""
    rows = [
        {"file": "e\u0301.png", "class": "cat", "probability": 0.5},  # é as e and a combining accent: 5 columns
        {"file": "\uff21.png", "class": "dog", "probability": 0.25},  # a fullwidth A: 6 columns
    ]
    assert format_predictions(rows).splitlines() == ["e\u0301.png   cat  0.5000", "\uff21.png  dog  0.2500"]


@pytest.mark.parametrize(
    "mode, size, shape, said",
    [
        ("RGB", (28, 28), (28, 28, 3), None),
        ("L", (28, 28), (28, 28, 3), "28x28 grayscale -> 28x28 RGB"),
        ("L", (28, 28), (28, 28), None),  # no channel axis: one channel
        ("L", (28, 28), (28, 28, 4), "28x28 grayscale -> 28x28 4 channels"),
        ("RGB", (30, 20), (28, 28, 3), "30x20 RGB -> 28x28 RGB"),
    ],
)
def test_the_conversion_said_compares_size_and_channels_with_the_models_input(mode, size, shape, said):
    import io

    from train.results.predict import _conversion

    encoded = io.BytesIO()
    Image.new(mode, size).save(encoded, format="PNG")
    assert _conversion(encoded.getvalue(), shape) == said


def test_an_image_path_through_a_file_names_that_file_directly_or_through_a_link(tmp_path):
    from train.errors import DataError
    from train.results.predict import read_image_file

    (tmp_path / "notes.txt").write_text("not a folder")
    link = tmp_path / "cat.png"
    link.symlink_to(tmp_path / "notes.txt" / "cat.png")
    for given in (tmp_path / "notes.txt" / "dog.png", link):
        with pytest.raises(DataError) as err:
            read_image_file(given)
        assert str(err.value) == (
            f"{given} does not exist ({tmp_path / 'notes.txt'} is a file, not a folder); "
            "give existing image files (JPEG, PNG, GIF (first frame) or BMP)"
        )


def test_a_broken_link_given_as_an_image_is_named_so(tmp_path, monkeypatch):
    from train.errors import DataError
    from train.results.predict import read_image_file

    # As on a host: in the image (DATA_DIR=/data) the line goes on to say where the volumes are (tested above).
    monkeypatch.delenv("DATA_DIR", raising=False)
    link = tmp_path / "cat.png"
    link.symlink_to(tmp_path / "moved.png")
    with pytest.raises(DataError) as err:
        read_image_file(link)
    assert str(err.value) == (
        f"{link} does not exist (a broken link); give existing image files (JPEG, PNG, GIF (first frame) or BMP)"
    )


@pytest.mark.parametrize("copied", [False, True], ids=["run", "copied-away"])
def test_an_export_without_or_with_an_unreadable_source_json_is_named_with_the_fix_for_where_it_is(
    tmp_path, caplog, monkeypatch, copied
):
    """A copied export folder is no run: it is named by its path, and `export` needs the run it came from."""
    import logging

    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, _ = _hand_export(tmp_path)
    if copied:
        which = f"the export folder {exp.path}"
        again = "copy the whole export/ folder of its run again, or export the run again (`python -m train export RUN`)"
        warning = f"WARNING: {which} has no source.json: its files cannot be checked against what export wrote; {again}"
    else:
        which, again = "the export of run r", "export it again with `python -m train export r`"
        warning = (
            f"WARNING: {which} does not record the weights it was made from (exported before that was kept): it may "
            f"be older than the run's best weights; {again} to be sure"
        )
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        assert verify_export_files(exp, "r", copied=copied) is None
    assert _lines(caplog) == [warning]
    exp.source.write_text("{")
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r", copied=copied)
    assert str(err.value) == (
        f"{which}: {exp.source} is unreadable (Expecting property name enclosed in double quotes: line 1 column 2 "
        f"(char 1)): {again}"
    )


def test_every_file_of_the_savedmodel_must_be_recorded_and_an_empty_one_is_missing_saved_model_pb(tmp_path):
    """What is served is the whole savedmodel/ folder: a file source.json leaves out would go unchecked."""
    import shutil

    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, files = _hand_export(tmp_path)
    (exp.savedmodel / "variables" / "variables.index").write_bytes(b"index")
    _write_files(exp, files)  # saved_model.pb and labels.txt, not the index beside them
    damaged = f"the export of run r is damaged: {exp.source} records no sha256 of"
    again = "which is served: export it again with `python -m train export r`"
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r")
    assert str(err.value) == f"{damaged} savedmodel/variables/variables.index, {again}"
    shutil.rmtree(exp.savedmodel)
    exp.savedmodel.mkdir()  # nothing in it: the file every SavedModel has is the one named
    _write_files(exp, {"labels.txt": files["labels.txt"]})
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r")
    assert str(err.value) == f"{damaged} savedmodel/saved_model.pb, {again}"


def test_a_run_without_a_manifest_checks_its_export_as_one_older_than_source_json(tmp_path, caplog, monkeypatch):
    """Whether the export wrote a source.json is read from the manifest; a run that has none yet is no
    reason for another error here (the class names, read next from the manifest, say what is missing)."""
    import logging

    from train.results.predict import check_export
    from train.run.rundir import RunDir

    run = tmp_path / "20260101-000000-aaaa"
    _hand_export(run)  # no source.json, and no manifest.json in the run
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        check_export(RunDir(run))
    (line,) = _lines(caplog)
    assert line.startswith(f"WARNING: the export of run {run.name} does not record the weights it was made from")


def test_a_file_of_the_export_replaced_by_a_link_after_its_path_was_checked_is_not_followed(tmp_path, monkeypatch):
    """The race O_NOFOLLOW closes: the path is resolved and found inside the export, then, before it is
    opened, someone puts a link to a file elsewhere in its place."""
    from train.errors import ExportError
    from train.results import predict

    exp, files = _hand_export(tmp_path)
    _write_files(exp, files)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("cat\ndog\n")  # the bytes recorded: followed, the link would pass the check
    checked = predict._inside

    def swapped_after_the_check(root, rel):
        path = checked(root, rel)
        if rel == "labels.txt":
            path.unlink()
            path.symlink_to(elsewhere)
        return path

    monkeypatch.setattr(predict, "_inside", swapped_after_the_check)
    with pytest.raises(ExportError) as err:
        predict.verify_export_files(exp, "r")
    assert str(err.value) == (
        f"the export of run r is damaged: {exp.labels} cannot be read (Too many levels of symbolic links): "
        "export it again with `python -m train export r`"
    )


@contextlib.contextmanager
def _of_a_kind_without_a_name(monkeypatch):
    """os.fstat answering BSD's whiteout for every file, inside the block only (pytest uses it too):
    no kind Linux returns is left unnamed by the messages, so this one stands for a future kind."""
    real_fstat = os.fstat
    whiteout = stat.S_IFMT(0o160000)

    def odd_kind(fd):
        st = real_fstat(fd)
        return os.stat_result((whiteout | stat.S_IMODE(st.st_mode), *tuple(st)[1:]))

    with monkeypatch.context() as patched:
        patched.setattr(os, "fstat", odd_kind)
        yield


def test_a_file_of_the_export_that_fails_while_read_or_is_of_a_kind_without_a_name_is_one_line(tmp_path, monkeypatch):
    """After the open: a read error (a disk error, a network file system gone) and a file type this
    platform has but the messages do not name are both refused on one line."""
    import errno

    from train import digest
    from train.errors import ExportError
    from train.results.predict import verify_export_files

    exp, files = _hand_export(tmp_path)
    _write_files(exp, files)
    again = "export it again with `python -m train export r`"

    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(digest, "sha256_fd", failing)
    with pytest.raises(ExportError) as err:
        verify_export_files(exp, "r")
    first = exp.savedmodel / "saved_model.pb"  # the first file source.json lists
    assert str(err.value) == f"the export of run r is damaged: {first} cannot be read (Input/output error): {again}"
    with _of_a_kind_without_a_name(monkeypatch):
        with pytest.raises(ExportError) as err:
            verify_export_files(exp, "r")
    assert str(err.value) == (
        f"the export of run r is damaged: {first} is not a regular file, not a file export writes: {again}"
    )


def test_inside_takes_only_a_nonempty_relative_string():
    """source.json's keys are strings, but `_inside` is the one check that an entry names a file below the
    export: anything else is no path there."""
    from pathlib import Path

    from train.results.predict import _inside

    root = Path("/srv/export")
    assert [_inside(root, rel) for rel in (5, None, b"labels.txt", "", "/srv/export/labels.txt")] == [None] * 5
    assert _inside(root, "labels.txt") == root / "labels.txt"


def test_the_stale_export_warning_without_records_or_epochs_and_a_recorded_sha256_not_measured_again(
    tmp_path, caplog, monkeypatch
):
    """Weights written before their sha256 was kept are hashed now; a recorded sha256 is used as it is
    (a weights file can be gigabytes); an export's weights without a file name or epoch say less."""
    import hashlib
    import logging

    from train import digest
    from train.results.predict import check_export
    from train.run.rundir import RunDir

    run = tmp_path / "20260101-000000-aaaa"
    exp, files = _hand_export(run)
    (run / "best.weights.h5").write_bytes(b"weights")

    def warnings(source):
        exp.source.write_text(json.dumps({"weights": source, "files": files}))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="train"):
            check_export(RunDir(run))
        return _lines(caplog)

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    assert warnings({"sha256": hashlib.sha256(b"weights").hexdigest()}) == []  # no record: measured, the same
    assert warnings({"sha256": "0" * 64}) == [
        f"WARNING: the export of run {run.name} was made from the trained model, but the run's weights are now "
        "best.weights.h5: these predictions come from the export's weights, not those; bring it up to date with "
        f"`python -m train export {run.name}`"
    ]
    (run / "manifest.json").write_text(json.dumps({"weights": {"best.weights.h5": {"sha256": "1" * 64, "epoch": 2}}}))
    monkeypatch.setattr(digest, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    assert warnings({"sha256": "1" * 64, "file": "best.weights.h5", "epoch": 2}) == []


def test_an_image_that_cannot_be_opened_or_read_or_is_of_a_kind_without_a_name_is_one_line(tmp_path, monkeypatch):
    import errno

    from train.errors import DataError
    from train.results.predict import read_image_file

    loop = tmp_path / "loop.png"
    loop.symlink_to(loop)
    with pytest.raises(DataError) as err:
        read_image_file(loop)
    assert str(err.value) == f"{loop} cannot be opened (Too many levels of symbolic links); give regular image files"
    image = _png(tmp_path / "a.png", 0)

    def failing(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fdopen", failing)
        with pytest.raises(DataError) as err:
            read_image_file(image)
    assert str(err.value) == f"{image} cannot be read (Input/output error); give regular image files"
    with _of_a_kind_without_a_name(monkeypatch):
        with pytest.raises(DataError) as err:
            read_image_file(image)
    assert str(err.value) == (
        f"{image} is not a regular file, not an image file; give regular image files (JPEG, PNG, GIF (first frame) or BMP)"
    )
