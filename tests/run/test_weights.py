"""Weights files: the sha256 recorded when written, checked before export, predict and reproduce."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest
from builders import write_run
from helpers import tiny_image_model

from train.errors import RunRecordError, StorageError, WeightsError
from train.run import weights
from train.run.files import read_json, write_json


def _model(seed: int = 0):
    return tiny_image_model(seed)


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "20260101-000000-000001", manifest={"status": "completed"})


@pytest.fixture
def warnings(monkeypatch, caplog):
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="train")
    return caplog


def _flip_a_bit(path, at: int = -100):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x04
    path.write_bytes(bytes(data))


def _weights_rename_fails(monkeypatch) -> None:
    """The record of the new weights file is written; its rename never happens (a kill, an I/O error)."""
    replace = os.replace

    def killed(src, dst):
        if str(dst).endswith(".weights.h5"):
            raise OSError(5, "Input/output error")
        replace(src, dst)

    monkeypatch.setattr("train.run.files.os.replace", killed)


def test_each_write_records_the_files_sha256_epoch_and_the_one_it_replaces(run):
    best = run / "best.weights.h5"
    first = weights.save_weights(_model(0), best, epoch=1)
    second = weights.save_weights(_model(1), best, epoch=3)
    recorded = read_json(run / "manifest.json")["weights"]["best.weights.h5"]
    assert recorded == second and recorded["sha256"] == weights.sha256_file(best) and recorded["epoch"] == 3
    assert recorded["bytes"] == best.stat().st_size
    assert recorded["previous"] == {"sha256": first["sha256"], "bytes": first["bytes"], "epoch": 1}
    assert read_json(run / "manifest.json")["status"] == "completed"  # the rest of the manifest is kept
    assert weights.verify(run, best) == {"file": "best.weights.h5", "sha256": second["sha256"], "epoch": 3}


def test_a_flipped_bit_is_refused_naming_the_file_and_both_hashes(run):
    best = run / "best.weights.h5"
    written = weights.save_weights(_model(), best, epoch=2)
    _flip_a_bit(best)
    with pytest.raises(WeightsError) as info:
        weights.verify(run, best)
    msg = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in msg
    assert str(best) in msg and written["sha256"] in msg and weights.sha256_file(best) in msg
    assert "epoch 2" in msg and "restore it from a backup" in msg
    manifest = read_json(run / "manifest.json")
    manifest["weights"]["best.weights.h5"]["previous"] = "ab"  # an edit: was an AttributeError traceback
    write_json(run / "manifest.json", manifest)
    with pytest.raises(
        RunRecordError, match="manifest.json records best.weights.h5's previous as 'ab', not a JSON object"
    ):
        weights.verify(run, best)


def test_a_kill_between_the_record_and_the_rename_leaves_the_older_file_which_still_verifies(run, monkeypatch):
    best = run / "best.weights.h5"
    first = weights.save_weights(_model(0), best, epoch=1)

    _weights_rename_fails(monkeypatch)
    with pytest.raises(StorageError):
        weights.save_weights(_model(1), best, epoch=2)
    monkeypatch.undo()
    assert read_json(run / "manifest.json")["weights"]["best.weights.h5"]["epoch"] == 2
    assert weights.verify(run, best) == {"file": "best.weights.h5", "sha256": first["sha256"], "epoch": 1}


def test_a_run_written_before_hashes_were_kept_is_used_with_one_warning(run, warnings):
    best = run / "best.weights.h5"
    _model().save_weights(best)
    assert weights.verify(run, best) == {"file": best.name, "sha256": weights.sha256_file(best), "epoch": None}
    (line,) = {id(r): r.getMessage() for r in warnings.records}.values()
    assert line.startswith(f"WARNING: run {run.name}: best.weights.h5 has no recorded sha256")


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda p: p.write_bytes(b""), "it is empty (0 bytes)"),
        (lambda p: p.write_text("not weights\n"), "it is text, not an HDF5 weights file"),
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "it is an HDF5 file that does not load"),
        (lambda p: p.write_bytes(b"\x00\xff" * 64), "it is not an HDF5 weights file"),
    ],
    ids=["empty", "text", "truncated", "binary"],
)
def test_a_weights_file_that_does_not_load_is_one_line_naming_it_and_the_fallback(run, damage, says, warnings):
    run = write_run(run.parent / "my runs" / run.name, manifest={"status": "completed"})  # the mv to paste quotes it
    best, final = run / "best.weights.h5", run / "final.weights.h5"
    weights.save_weights(_model(1), final, epoch=4)
    _model(0).save_weights(best)  # written before hashes were kept: nothing to compare, so it is loaded
    damage(best)
    with pytest.raises(WeightsError) as info:
        weights.load_weights(_model(2), run, best)
    msg = str(info.value)
    assert info.value.exit_code == 4 and "\n" not in msg and f"{best} does not load: {says}" in msg
    assert f"`mv '{best}' '{best}.damaged'`" in msg and "to use final.weights.h5 (epoch 4), which is intact" in msg


def test_with_a_record_a_damaged_file_is_refused_before_it_is_read(run, monkeypatch):
    best = run / "best.weights.h5"
    weights.save_weights(_model(), best, epoch=1)
    best.write_bytes(b"")
    model = _model()
    monkeypatch.setattr(model, "load_weights", lambda p: pytest.fail("a damaged file must not be loaded"))
    with pytest.raises(WeightsError, match="has sha256 e3b0c442"):
        weights.load_weights(model, run, best)


def test_without_an_intact_weights_file_the_latest_checkpoint_is_named(run):
    from train.run import checkpoints

    best = run / "best.weights.h5"
    weights.save_weights(_model(), best, epoch=1)
    _flip_a_bit(best)
    model = _model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    (run / "checkpoints").mkdir()
    checkpoints.save_state(run / "checkpoints", model, {"epoch": 1, "step": 0, "global_step": 7}, keep=2)
    with pytest.raises(WeightsError) as info:
        weights.verify(run, best)
    assert "latest checkpoint ckpt-000000007.npz (epoch 1) still holds its weights" in str(info.value)
    assert f"`python -m train --resume {run.name}`" in str(info.value)


def test_an_unreadable_weights_file_is_a_weights_error(run, monkeypatch):
    best = run / "best.weights.h5"
    weights.save_weights(_model(), best, epoch=1)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(weights, "sha256_file", denied)
    with pytest.raises(WeightsError, match="cannot be read \\(Permission denied\\)"):
        weights.verify(run, best)


def test_reproduce_verifies_the_original_weights_first(tmp_path):
    from builders import write_run_records

    from train.reproduce.rerun import reproduce

    commit = {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": False, "source": "git"}
    run = write_run_records(tmp_path / "runs" / "20260101-000000-000002", manifest={"git": commit})
    final = run / "final.weights.h5"
    weights.save_weights(_model(), final, epoch=5)
    _flip_a_bit(final)
    with pytest.raises(WeightsError, match="final.weights.h5 has sha256"):
        reproduce(run, tmp_path, say=lambda line: None)


def test_the_weights_the_loop_writes_are_recorded(tmp_path):
    """best (each improvement) and final weights of a real 1-epoch run carry their recorded sha256."""
    from train import train
    from train.run.find import list_run_dirs

    pytest.importorskip("helpers")
    from helpers import tiny_settings

    settings = tiny_settings(tmp_path, epochs=1, export=False, model="cnn", report="off")
    train(settings)
    (run,) = list_run_dirs(tmp_path / "runs")
    recorded = read_json(run / "manifest.json")["weights"]
    for name in ("best.weights.h5", "final.weights.h5"):
        assert recorded[name]["sha256"] == weights.sha256_file(run / name) and recorded[name]["epoch"] == 1
    assert np.isfinite(recorded["best.weights.h5"]["bytes"])


@pytest.mark.slow
def test_the_checkpoint_fallback_the_message_gives_works(one_epoch_copy):
    """Both weights files damaged: doing what the message says writes intact final weights again."""
    import re
    import shlex
    import subprocess

    from train import train
    from train.results.export import rebuild_model

    settings, run = one_epoch_copy
    (run / "best.weights.h5").write_text("overwritten\n")
    (run / "final.weights.h5").write_bytes(b"")
    with pytest.raises(WeightsError) as info:
        rebuild_model(run)
    msg = str(info.value)
    for command in re.findall(r"`(mv [^`]+)`", msg):
        subprocess.run(shlex.split(command), check=True)
    assert f"`python -m train --resume {run.name}`" in msg
    train(settings, resume=run.name)
    model, _, source = rebuild_model(run)
    assert source["file"] == "final.weights.h5" and source["epoch"] == 1


def test_a_run_without_records_gets_one_warning_for_all_its_weights(run, warnings):
    _model(0).save_weights(run / "best.weights.h5")
    _model(1).save_weights(run / "final.weights.h5")
    assert [r["file"] for r in weights.verify_all(run)] == ["best.weights.h5", "final.weights.h5"]
    (line,) = {id(r): r.getMessage() for r in warnings.records}.values()
    assert "best.weights.h5 and final.weights.h5 have no recorded sha256" in line and "they are used" in line


def test_one_run_without_records_warns_once_naming_its_one_file_exactly(run, warnings):
    weights.save_weights(_model(1), run / "final.weights.h5", epoch=2)
    _model(0).save_weights(run / "best.weights.h5")
    assert [r["epoch"] for r in weights.verify_all(run)] == [None, 2]
    assert [r.getMessage() for r in warnings.records] == [
        f"WARNING: run {run.name}: best.weights.h5 has no recorded sha256 (written before hashes were kept), "
        "so it is used unverified"
    ]


def test_two_files_without_records_are_one_warning_naming_both_exactly(run, warnings):
    _model(0).save_weights(run / "best.weights.h5")
    _model(1).save_weights(run / "final.weights.h5")
    weights.verify_all(run)
    assert [r.getMessage() for r in warnings.records] == [
        f"WARNING: run {run.name}: best.weights.h5 and final.weights.h5 have no recorded sha256 (written before "
        "hashes were kept), so they are used unverified"
    ]


def test_a_run_without_a_manifest_has_its_weights_used_unverified(run):
    (run / "manifest.json").unlink()
    best = run / "best.weights.h5"
    _model().save_weights(best)
    assert weights.records(run) == {}
    assert weights.verify(run, best) == {"file": best.name, "sha256": weights.sha256_file(best), "epoch": None}


def test_the_first_write_into_a_run_without_a_manifest_creates_one_holding_the_whole_record(run, monkeypatch):
    (run / "manifest.json").unlink()
    monkeypatch.setattr(weights, "now_iso", lambda: "2026-01-01T00:00:00+00:00")
    best = run / "best.weights.h5"
    entry = weights.save_weights(_model(), best, epoch=2)
    assert entry == {
        "sha256": weights.sha256_file(best),
        "bytes": best.stat().st_size,
        "epoch": 2,
        "written_at": "2026-01-01T00:00:00+00:00",
    }
    assert read_json(run / "manifest.json") == {"weights": {"best.weights.h5": entry}}


def test_a_recorded_file_deleted_since_is_no_previous_of_the_next_write(run):
    best = run / "best.weights.h5"
    weights.save_weights(_model(0), best, epoch=1)
    best.unlink()
    second = weights.save_weights(_model(1), best, epoch=2)
    assert "previous" not in second and weights.verify(run, best)["epoch"] == 2


def test_the_older_file_a_kill_left_is_the_previous_of_the_next_write(run, monkeypatch):
    best = run / "best.weights.h5"
    first = weights.save_weights(_model(0), best, epoch=1)
    _weights_rename_fails(monkeypatch)
    with pytest.raises(StorageError):
        weights.save_weights(_model(1), best, epoch=2)
    monkeypatch.undo()
    third = weights.save_weights(_model(2), best, epoch=3)  # the file on disk is the first: the record's previous
    assert third["previous"] == {"sha256": first["sha256"], "bytes": first["bytes"], "epoch": 1}


def test_a_disk_without_room_for_the_size_hint_is_refused_before_anything_is_written(run, monkeypatch):
    from collections import namedtuple

    from train.run.files import storage_error

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("train.run.files.shutil.disk_usage", lambda p: usage(10_000, 9_000, 1_000))
    best = run / "best.weights.h5"
    with pytest.raises(StorageError) as info:
        weights.save_weights(_model(), best, epoch=1, size_hint=1_001)
    assert str(info.value) == str(storage_error(best, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    assert not best.exists() and "weights" not in read_json(run / "manifest.json")


def _unreadable(monkeypatch, path):
    real = weights.sha256_file

    def denied(p):
        if p == path:
            raise PermissionError(13, "Permission denied")
        return real(p)

    monkeypatch.setattr(weights, "sha256_file", denied)


def test_an_unreadable_file_beside_an_intact_one_is_one_exact_line_naming_both(run, monkeypatch):
    best, final = run / "best.weights.h5", run / "final.weights.h5"
    weights.save_weights(_model(0), best, epoch=1)
    weights.save_weights(_model(1), final, epoch=2)
    _unreadable(monkeypatch, best)
    with pytest.raises(WeightsError) as info:
        weights.verify(run, best)
    assert str(info.value) == (
        f"run {run.name}: {best} cannot be read (Permission denied): give the user running this read access to it; "
        f"move it aside (`mv {best} {best}.damaged`) and run the command again to use final.weights.h5 (epoch 2), "
        "which is intact"
    )


def test_a_changed_file_beside_an_intact_one_is_one_exact_line_naming_both(run):
    best, final = run / "best.weights.h5", run / "final.weights.h5"
    written = weights.save_weights(_model(0), best, epoch=1)
    weights.save_weights(_model(1), final, epoch=2)
    _flip_a_bit(best)
    with pytest.raises(WeightsError) as info:
        weights.verify(run, best)
    assert str(info.value) == (
        f"run {run.name}: {best} has sha256 {weights.sha256_file(best)} but {written['sha256']} was recorded when "
        "it was written (epoch 1): the file changed on disk (bit rot, a bad copy); move it aside "
        f"(`mv {best} {best}.damaged`) and run the command again to use final.weights.h5 (epoch 2), which is intact"
    )


def test_describe_names_a_missing_file_by_its_error(tmp_path):
    assert weights.describe(tmp_path / "gone.weights.h5") == "it cannot be read (No such file or directory)"


def test_describe_looks_at_the_first_512_bytes_only(tmp_path):
    path = tmp_path / "x.weights.h5"
    path.write_bytes(b"a" * 512 + b"\xff" * 100)
    assert weights.describe(path) == "it is text, not an HDF5 weights file (612 bytes)"


def test_describe_calls_text_cut_in_a_character_at_512_bytes_text(tmp_path):
    path = tmp_path / "x.weights.h5"
    path.write_bytes(b"a" * 511 + "é".encode() * 10)
    assert weights.describe(path) == "it is text, not an HDF5 weights file (531 bytes)"


@pytest.mark.parametrize(
    "error, shown",
    [(ValueError("bad layer\nsecond line"), "ValueError: bad layer"), (KeyError(), "KeyError: KeyError")],
)
def test_a_load_error_is_shown_by_its_type_and_first_line(run, monkeypatch, error, shown):
    best = run / "best.weights.h5"
    weights.save_weights(_model(), best, epoch=1)
    model = _model()

    def fails(path):
        raise error

    monkeypatch.setattr(model, "load_weights", fails)
    with pytest.raises(WeightsError) as info:
        weights.load_weights(model, run, best)
    assert str(info.value) == (
        f"run {run.name}: {best} does not load: it is an HDF5 file that does not load "
        f"({best.stat().st_size} bytes: truncated or damaged) ({shown}); restore it from a backup, or train the run again"
    )
