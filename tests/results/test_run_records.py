"""records: a run's settings, manifest, metrics and resumes read back; unreadable files named."""

from __future__ import annotations

import os
import socket

import pytest
from builders import write_run_records

from train.errors import RunRecordError
from train.results.run_records import Resume, load_records

RESUME_LOG = (
    "2026-11-30 10:00:00 run r1: /runs/r1",
    "2026-11-30 10:05:00 run r1: resuming /runs/r1",
    "2026-11-30 10:05:03 restored from checkpoint: /runs/r1/checkpoints/ckpt-000000094.npz",
    "2026-11-30 10:05:03 resuming at epoch 3, step 12 (global step 106)",
)


def test_records_are_numbers_with_empty_cells_as_none(tmp_path):
    rows = [{"epoch": 1, "loss": 0.5, "val_accuracy": 0.9, "epoch_seconds": 2.0, "gpu_memory_used_mb": ""}]
    rec = load_records(write_run_records(tmp_path / "r1", metrics=rows, log_lines=RESUME_LOG))
    assert rec.rows == [
        {"epoch": 1.0, "loss": 0.5, "val_accuracy": 0.9, "epoch_seconds": 2.0, "gpu_memory_used_mb": None}
    ]
    assert rec.resumes == [Resume(epoch=3, step=12, at="2026-11-30 10:05:03")]
    assert rec.config["batch_size"] == 512 and rec.manifest["status"] == "completed" and rec.name == "r1"


@pytest.mark.parametrize(
    "monitor, mode, best_epoch",
    [("val_accuracy", "auto", 2), ("val_loss", "auto", 3), ("val_loss", "max", 1), ("loss", "min", 3)],
)
def test_best_row_follows_monitor_and_mode_and_keeps_the_first_of_equals(tmp_path, monitor, mode, best_epoch):
    rows = [
        {"epoch": 1, "loss": 0.9, "val_loss": 0.8, "val_accuracy": 0.5, "epoch_seconds": 3},
        {"epoch": 2, "loss": 0.5, "val_loss": 0.4, "val_accuracy": 0.9, "epoch_seconds": 4},
        {"epoch": 3, "loss": 0.2, "val_loss": 0.3, "val_accuracy": 0.9, "epoch_seconds": 5},
    ]
    rec = load_records(write_run_records(tmp_path / "r", {"monitor": monitor, "monitor_mode": mode}, metrics=rows))
    best = rec.best_row()
    assert best["epoch"] == best_epoch
    assert rec.seconds_to(best["epoch"]) == [3, 7, 12][best_epoch - 1]
    assert rec.seconds_to(float("inf")) == 12 and rec.seconds_to(None) is None


def test_best_row_is_the_epoch_of_the_saved_best_weights_when_metrics_csv_rounds_two_alike(tmp_path, caplog):
    rows = [
        {"epoch": 1, "val_loss": 0.0357255, "epoch_seconds": 3},  # as metrics.csv writes 0.03572548 too
        {"epoch": 2, "val_loss": 0.0357255, "epoch_seconds": 4},
    ]
    weights = {"best.weights.h5": {"epoch": 2, "sha256": "ab"}}
    rec = load_records(
        write_run_records(tmp_path / "r", {"monitor": "val_loss"}, metrics=rows, manifest={"weights": weights})
    )
    assert rec.best_row()["epoch"] == 2  # the loop saw epoch 2 lower, and saved its weights
    rec = load_records(write_run_records(tmp_path / "s", {"monitor": "val_loss"}, metrics=rows))
    assert rec.best_row()["epoch"] == 1  # no record of the weights (an older run): the first of equals
    rec.manifest = {"weights": {"best.weights.h5": "ab"}}  # an entry edited into a string: no record either
    assert rec.best_row()["epoch"] == 1
    rec.config["monitor"] = "val_accuracy"  # a column metrics.csv lacks: `-` in runs and compare, and said once
    assert rec.best_row() is None and rec.best_row() is None
    assert [r.getMessage() for r in caplog.records if r.name == "train"] == [
        f"WARNING: {tmp_path / 's' / 'metrics.csv'} has no val_accuracy column, the run's MONITOR: its best epoch "
        "is not known (shown as -); restore the file from a copy of the run"
    ]


def test_resumes_come_from_the_manifest_segments_when_it_has_them(tmp_path):
    segments = [
        {"started_at": "2026-11-30T10:00:00+00:00", "resumed_from": None, "epoch_from": 0},
        {
            "started_at": "2026-11-30T10:05:03+00:00",
            "resumed_from": "ckpt-000000094.npz (epoch 2, step 0)",
            "epoch_from": 2,
        },
        {
            "started_at": "2026-11-30T10:09:00+00:00",
            "resumed_from": "ckpt-000000150.npz (epoch 3, step 17)",
            "epoch_from": 3,
        },
        {"started_at": "2026-11-30T10:12:00+00:00", "resumed_from": None, "epoch_from": 4, "restart": True},
    ]
    # The log's lines are not read when the manifest has segments (they may come from another segment's log).
    rec = load_records(write_run_records(tmp_path / "r", manifest={"segments": segments}, log_lines=RESUME_LOG))
    assert rec.resumes == [Resume(3, 0, "2026-11-30T10:05:03+00:00"), Resume(4, 17, "2026-11-30T10:09:00+00:00")]


def test_a_run_without_epochs_has_no_best(tmp_path):
    rec = load_records(write_run_records(tmp_path / "r", metrics=[]))
    assert rec.rows == [] and rec.best_row() is None and rec.seconds_to(3) is None
    # restarted from epoch 1 and still training: its metrics.csv lags the manifest's last count, not cut short
    rec = load_records(
        write_run_records(tmp_path / "s", metrics=[], manifest={"status": "running", "epochs_completed": 4})
    )
    assert rec.rows == [] and rec.best_row() is None


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("metrics.csv", "epoch,loss\n1,0.5\n2,abc\n", "line 3: loss='abc' is not a number"),
        ("metrics.csv", "loss,accuracy\n0.5,0.9\n", "line 1: no 'epoch' column (its header: loss, accuracy); restore"),
        ("metrics.csv", "epoch,loss\n1,0.5,7\n", "line 2: more values than the header has columns"),
        ("metrics.csv", "epoch,loss\n,0.5\n", "line 2: the epoch is empty"),
        # read as more epochs than trained: "2/1" in compare, its training time counted twice
        ("metrics.csv", "epoch,loss\n1,0.5\n2,0.4\n1,0.5\n", "line 4: epoch 1 after epoch 2 (rows repeated or"),
        # cut short mid-row (a partial copy): was read as an epoch whose metrics were missing
        (
            "metrics.csv",
            "epoch,loss,val_loss,mfu\n1,0.5,0.4,0.1\n2,0.3",
            "line 3: the row ends before its val_loss, mfu",
        ),
        ("config.json", "{not json", "config.json is unreadable (JSONDecodeError"),
        ("manifest.json", "[1, 2]", "manifest.json holds list, not a JSON object"),
        ("metrics.csv", b"\xff\xfe\x00bad", "metrics.csv is unreadable (UnicodeDecodeError"),
        # empty, or cut at a line, while the manifest records 5 epochs: was read as a run of no epochs
        ("metrics.csv", "", "metrics.csv holds no epoch, but manifest.json records 5 epoch(s) completed"),
        ("metrics.csv", "epoch,loss\n1,0.5\n2,0.4\n", "metrics.csv ends at epoch 2, but manifest.json records 5"),
        # a named pipe in its place (None): opening it blocked every command that reads the run, `runs` too
        ("manifest.json", None, "manifest.json is unreadable (NotRegularFileError: a named pipe (FIFO), not a"),
        ("metrics.csv", None, "metrics.csv is unreadable (NotRegularFileError: a named pipe (FIFO), not a"),
        ("metrics.csv", "socket", "metrics.csv is unreadable (NotRegularFileError: a socket, not a regular file)"),
    ],
)
def test_an_unreadable_record_names_the_file_and_the_problem(tmp_path, monkeypatch, name, content, expected):
    run = write_run_records(tmp_path / "r", manifest={"epochs_completed": 5})
    if content is None:
        (run / name).unlink()
        os.mkfifo(run / name)
    elif content == "socket":  # No such device or address, said of it before
        (run / name).unlink()
        monkeypatch.chdir(run)  # a socket's path is limited to 108 bytes
        socket.socket(socket.AF_UNIX).bind(name)
    else:
        (run / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(RunRecordError) as info:
        load_records(run)
    assert expected in str(info.value) and str(run / name) in str(info.value)
    assert info.value.exit_code == 4


def test_a_directory_without_config_is_not_a_run(tmp_path):
    with pytest.raises(RunRecordError, match="has no config.json .*: it is not a complete run directory"):
        load_records(tmp_path)


def test_missing_optional_records_are_empty(tmp_path):
    run = write_run_records(tmp_path / "r")
    for name in ("manifest.json", "metrics.csv", "train.log"):
        (run / name).unlink()
    rec = load_records(run)
    assert (rec.manifest, rec.rows, rec.resumes) == ({}, [], [])


def test_time_to_best_counts_what_a_stopped_segment_trained_of_its_unfinished_epoch(tmp_path):
    from builders import peaked_metrics

    segments = [
        {"status": "interrupted", "epoch_from": 0, "unfinished_epoch": {"epoch": 2, "train_seconds": 7.5}},
        {"status": "interrupted", "epoch_from": 1, "unfinished_epoch": {"epoch": 4, "train_seconds": 3.0}},
        {"status": "killed", "epoch_from": 3},  # unknown: not counted
        {"status": "completed", "epoch_from": 4, "unfinished_epoch": {"epoch": "x", "train_seconds": float("nan")}},
    ]
    rec = load_records(write_run_records(tmp_path / "r", manifest={"segments": segments}, metrics=peaked_metrics()))
    assert rec.best_row()["epoch"] == 3  # epoch_seconds 10, 20, 30, 40, 50
    assert rec.seconds_to(1) == 10 and rec.seconds_to(3) == 60 + 7.5
    assert rec.seconds_to(float("inf")) == 150 + 7.5 + 3.0
