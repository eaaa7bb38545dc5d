"""logs: metrics.csv (append, truncate on resume, reload) and the shared console/train.log format."""

from __future__ import annotations

import csv
import logging

import pytest

from train.run.files import TMP_MARK
from train.run.metrics_files import METRIC_COLUMNS, MetricsFile, read_back, read_rows
from train.run.train_log import close_logging, setup_logging


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_append_writes_every_column_and_empty_gpu_columns(tmp_path):
    path = tmp_path / "metrics.csv"
    m = MetricsFile(path)
    m.append(
        {
            "epoch": 1,
            "loss": 0.123456789,
            "accuracy": 0.5,
            "batch_size": 32,
            "gpu_memory_used_mb": None,
            "gpu_memory_peak_mb": None,
            "not_a_column": 7,
        }
    )
    assert path.read_text().splitlines()[0] == ",".join(METRIC_COLUMNS)
    (row,) = _read(path)
    assert row["epoch"] == "1" and row["loss"] == "0.123457" and row["batch_size"] == "32"
    assert row["gpu_memory_used_mb"] == "" and row["gpu_memory_peak_mb"] == "" and row["val_loss"] == ""
    assert "not_a_column" not in row
    assert not any(TMP_MARK in p.name for p in tmp_path.iterdir())


def test_a_model_with_other_metrics_gets_their_columns(tmp_path):
    from train.run.metrics_files import metric_columns

    m = MetricsFile(tmp_path / "metrics.csv", metric_columns(("mae", "rmse")))
    m.append({"epoch": 1, "loss": 0.5, "mae": 0.25, "val_rmse": 0.75, "accuracy": 1.0})
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert header.startswith("epoch,loss,mae,rmse,val_loss,val_mae,val_rmse,learning_rate")
    (row,) = _read(tmp_path / "metrics.csv")
    assert row["mae"] == "0.25" and row["val_rmse"] == "0.75" and "accuracy" not in row


def test_reload_truncate_and_append_after_a_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    m = MetricsFile(path)
    for epoch in (1, 2, 3):
        m.append({"epoch": epoch, "loss": 1.0 / epoch})
    again = MetricsFile(path)  # a resumed run reloads the file
    assert [r["epoch"] for r in again.rows] == ["1", "2", "3"]
    again.truncate_from(3)  # resuming inside epoch 3: its row will be written again
    assert [r["epoch"] for r in again.rows] == ["1", "2"]
    again.append({"epoch": 3, "loss": 0.25})
    assert [(r["epoch"], r["loss"]) for r in _read(path)] == [("1", "1"), ("2", "0.5"), ("3", "0.25")]


def test_a_row_read_back_has_the_numbers_it_was_written_with(tmp_path):
    m = MetricsFile(tmp_path / "metrics.csv")
    m.append({"epoch": 2, "loss": 0.125, "batch_size": 64, "learning_rate": 1e-3, "mfu": None})
    row = read_back(MetricsFile(tmp_path / "metrics.csv").rows[0])
    assert row["epoch"] == 2 and isinstance(row["epoch"], int) and row["batch_size"] == 64
    assert (row["loss"], row["learning_rate"], row["mfu"], row["gpu_memory_used_mb"]) == (0.125, 1e-3, None, None)
    assert read_back({"epoch": "3", "loss": "not a number"}) == {"epoch": 3, "loss": "not a number"}


def test_a_missing_file_starts_empty(tmp_path):
    m = MetricsFile(tmp_path / "metrics.csv")
    assert m.rows == []
    m.truncate_from(1)
    assert m.rows == []


def test_console_and_log_file_get_the_same_lines(tmp_path, capsys):
    log = logging.getLogger("train")
    try:
        setup_logging(tmp_path / "train.log")
        setup_logging(tmp_path / "train.log")  # a second run in-process replaces the handlers
        log.info("hello %d", 42)
        assert len(log.handlers) == 2
        close_logging()
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 1 and out[0].endswith(" hello 42")
        assert (tmp_path / "train.log").read_text().splitlines() == out
        assert not any(isinstance(h, logging.FileHandler) for h in log.handlers)
    finally:
        for h in list(log.handlers):
            log.removeHandler(h)
        log.propagate = True


def test_a_handler_of_the_callers_own_on_the_logger_stays_and_gets_the_lines(tmp_path, capsys):
    """A notebook's own handler on logging.getLogger("train") (a FileHandler collecting every run's lines)
    was removed by the first run's set-up, or closed at its end."""
    log = logging.getLogger("train")
    mine = logging.FileHandler(tmp_path / "mine.log", encoding="utf-8")
    log.addHandler(mine)
    try:
        setup_logging(tmp_path / "train.log")
        log.info("first run")
        close_logging()
        setup_logging(tmp_path / "train.log")
        log.info("second run")
        close_logging()
        assert mine in log.handlers and mine.stream is not None and not mine.stream.closed
        mine.flush()
        assert (tmp_path / "mine.log").read_text().splitlines() == ["first run", "second run"]
    finally:
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()
        log.propagate = True


def test_hparams_summary_carries_the_settings_and_final_metrics(tmp_path):
    """What TensorBoard's HParams dashboard reads: a session summary with the settings, metric scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from train.run.metrics_files import write_hparams

    logdir = tmp_path / "20260101-000000-000001" / "tensorboard"
    write_hparams(
        logdir,
        {"batch_size": 64, "model": "cnn", "deterministic": True, "resume": None},
        {"val_accuracy": 0.97, "best_val_accuracy": 0.98, "loss": float("nan")},
        step=3,
    )
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.group_name == "20260101-000000-000001"
    assert start.hparams["batch_size"].number_value == 64 and start.hparams["model"].string_value == "cnn"
    assert start.hparams["deterministic"].bool_value is True and "resume" not in start.hparams
    tags = acc.Tags()["tensors"]
    assert {"hparams/val_accuracy", "hparams/best_val_accuracy"} <= set(tags) and "hparams/loss" not in tags
    (event,) = acc.Tensors("hparams/best_val_accuracy")
    import tensorflow as tf

    assert event.step == 3 and abs(float(tf.make_ndarray(event.tensor_proto)) - 0.98) < 1e-6


def test_every_reader_starts_from_the_same_rows_with_their_line_numbers(tmp_path):
    from train.run.metrics_files import read_rows

    assert read_rows(tmp_path / "metrics.csv") == ([], [])  # none yet
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,loss\n1,0.5\n2,0.4,extra\n3\n")
    header, rows = read_rows(path)
    assert header == ["epoch", "loss"]
    assert rows == [
        (2, {"epoch": "1", "loss": "0.5"}),
        (3, {"epoch": "2", "loss": "0.4", None: ["extra"]}),  # a cell the header lacks
        (4, {"epoch": "3", "loss": None}),  # a cell the row lacks
    ]


def test_a_file_saved_again_by_a_spreadsheet_with_a_byte_order_mark_reads_as_written(tmp_path):
    """Excel's "CSV UTF-8" puts a byte-order mark first: its first column was '\\ufeffepoch', so a resume
    failed with `KeyError: 'epoch'` (a traceback) and report/compare said there was no 'epoch' column."""
    from train.results.run_records import read_metrics

    path = tmp_path / "metrics.csv"
    m = MetricsFile(path)
    for epoch in (1, 2):
        m.append({"epoch": epoch, "loss": 0.5 / epoch})
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    again = MetricsFile(path)
    again.truncate_from(2)
    assert [r["epoch"] for r in again.rows] == ["1"]
    assert [r["epoch"] for r in read_metrics(path)] == [1.0, 2.0]


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\xff\xfe garbage", "metrics.csv is unreadable (UnicodeDecodeError: "),
        (b"foo,bar\n1,2,3,4\n", "metrics.csv has no 'epoch' column (its header: foo, bar); "),
        (b"epoch,loss\n1,0.5\nx,0.4\n", "metrics.csv, line 3: epoch='x' is not a whole number; "),
    ],
)
def test_a_damaged_file_a_resume_goes_on_from_is_one_run_record_error(tmp_path, content, says):
    """A resume of a run whose metrics.csv is damaged failed with a KeyError or UnicodeDecodeError traceback."""
    from train.errors import RunRecordError

    path = tmp_path / "metrics.csv"
    path.write_bytes(content)
    with pytest.raises(RunRecordError) as info:
        MetricsFile(path)
    assert says in str(info.value) and str(info.value).startswith(str(tmp_path))
    assert str(info.value).endswith(
        "restore it from a copy of the run, or move it out of the run to go on without the rows it held"
    )


def test_a_metric_shows_the_digits_of_the_number_metrics_csv_keeps(tmp_path):
    """A value half-way between two 4-decimal numbers (an accuracy of n/20000) is rounded once, from the
    six digits the file keeps: the log and a reader of the file show the same."""
    import numpy as np

    from train.run.metrics_files import metric_text

    values = [float(np.float32(n / 20000)) for n in range(18000, 18400)]
    file = MetricsFile(tmp_path / "metrics.csv")
    for epoch, value in enumerate(values, start=1):
        file.append({"epoch": epoch, "val_accuracy": value})
    kept = [read_back(row)["val_accuracy"] for _, row in read_rows(tmp_path / "metrics.csv")[1]]
    assert [metric_text(v) for v in values] == [f"{v:.4f}" for v in kept]
    assert metric_text(np.float32(0.90825)) == "0.9083"  # the float32 itself is 0.9082499...


def test_epoch_and_batch_size_read_back_whole_and_the_rest_as_floats():
    row = read_back({"epoch": "2", "batch_size": "64", "loss": "1", "learning_rate": "", "mfu": None})
    assert row == {"epoch": 2, "batch_size": 64, "loss": 1.0, "learning_rate": None, "mfu": None}
    assert [type(row[k]) for k in ("epoch", "batch_size", "loss")] == [int, int, float]


def test_finite_takes_numbers_that_are_neither_nan_nor_infinite_nor_bools():
    from train.run.metrics_files import finite

    assert [finite(v) for v in (0, -3, 0.5, 1e308)] == [True] * 4
    assert [finite(v) for v in (float("nan"), float("inf"), -float("inf"), True, False, "1", None)] == [False] * 7


def test_a_metric_is_a_column_the_model_computed():
    from train.run.metrics_files import is_metric

    computed = ["loss", "accuracy", "val_loss", "val_accuracy", "mae"]
    assert [c for c in [*METRIC_COLUMNS, "mae"] if is_metric(c)] == computed


def test_a_long_header_without_epoch_is_cut_in_the_message(tmp_path):
    from train.errors import RunRecordError

    path = tmp_path / "metrics.csv"
    columns = [f"column{i:02d}" for i in range(12)]
    path.write_text(",".join(columns) + "\n" + ",".join("1" * 12) + "\n")
    with pytest.raises(RunRecordError) as info:
        MetricsFile(path)
    assert str(info.value) == (
        f"{path} has no 'epoch' column (its header: {', '.join(columns)[:80]}); restore it from a copy of the run, "
        "or move it out of the run to go on without the rows it held"
    )
    assert len(", ".join(columns)) > 80


def test_a_header_without_epoch_and_no_rows_starts_empty(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("loss,accuracy\n")
    assert MetricsFile(path).rows == []


def test_an_unreadable_file_is_named_with_the_first_line_of_why(tmp_path):
    from train.errors import RunRecordError

    path = tmp_path / "metrics.csv"
    path.write_bytes(b"epoch\n\xff\n")
    with pytest.raises(RunRecordError) as info:
        MetricsFile(path)
    assert str(info.value) == (
        f"{path} is unreadable (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 6: invalid "
        "start byte); restore it from a copy of the run, or move it out of the run to go on without the rows it held"
    )
    assert read_rows(path, errors="replace") == (["epoch"], [(2, {"epoch": "\ufffd"})])


def test_a_row_without_an_epoch_cell_is_named_by_its_line(tmp_path):
    from train.errors import RunRecordError

    path = tmp_path / "metrics.csv"
    path.write_text("loss,epoch\n0.5,1\n0.4\n")
    with pytest.raises(RunRecordError) as info:
        MetricsFile(path)
    assert str(info.value) == (
        f"{path}, line 3: epoch=None is not a whole number; restore it from a copy of the run, or move it out of "
        "the run to go on without the rows it held"
    )


def test_the_file_holds_exactly_the_rows_appended(tmp_path):
    path = tmp_path / "metrics.csv"
    m = MetricsFile(path, ["epoch", "loss", "note"])
    m.append({"epoch": 1, "loss": 2.0 / 3, "note": "a,b"})
    m.append({"epoch": 2, "loss": None, "note": 5})
    assert path.read_bytes() == b'epoch,loss,note\r\n1,0.666667,"a,b"\r\n2,,5\r\n'


def test_epoch_scalars_go_to_train_and_validation_as_keras_lays_them_out(tmp_path):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from train.run.metrics_files import TensorBoardWriter

    writer = TensorBoardWriter(tmp_path)
    writer.write(3, {"loss": 0.5, "accuracy": 1, "val_loss": 0.25, "mfu": None, "note": "x", "flag": True})
    writer.write(4, {"loss": 0.4})
    writer.close()

    def scalars(folder):
        acc = EventAccumulator(str(tmp_path / folder), size_guidance={"tensors": 0})
        acc.Reload()
        return {
            tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]
        }

    assert scalars("train") == {
        "epoch_loss": [(3, 0.5), (4, pytest.approx(0.4))],
        "epoch_accuracy": [(3, 1.0)],
        "epoch_flag": [(3, 1.0)],
    }
    assert scalars("validation") == {"epoch_loss": [(3, 0.25)]}


def test_the_hparams_session_holds_every_plain_setting_and_each_finite_metric_alone(tmp_path):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from train.run.metrics_files import write_hparams

    logdir = tmp_path / "run-7" / "tensorboard"
    settings = {"lr": 0.5, "epochs": 2, "model": "cnn", "smoke": False, "shape": [1, 2], "none": None}
    write_hparams(logdir, settings, {"acc": 0.75, "inf": float("inf"), "word": "x", "flag": True}, step=9)
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.group_name == "run-7"
    assert sorted(start.hparams) == ["epochs", "lr", "model", "smoke"]
    assert [t for t in acc.Tags()["tensors"] if t.startswith("hparams/")] == ["hparams/acc"]
    (event,) = acc.Tensors("hparams/acc")
    assert (event.step, float(tf.make_ndarray(event.tensor_proto))) == (9, 0.75)
