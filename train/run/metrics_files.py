"""metrics.csv (one row per epoch) and TensorBoard scalars, hparams included."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from ..errors import RunRecordError, first_line
from .files import read_regular, write_text

# Columns that measure the machine (time, speed, memory), not what the model computed: a rerun of
# the same run differs in these whatever it reproduces.
MEASURED_COLUMNS = (
    "epoch_seconds",
    "samples_per_second",
    "model_flops_per_second",
    "mfu",
    "gpu_memory_used_mb",
    "gpu_memory_peak_mb",
)
_AFTER = ["learning_rate", "batch_size", *MEASURED_COLUMNS]


def read_rows(path: Path, errors: str = "strict") -> tuple[list[str], list[tuple[int, dict]]]:
    """metrics.csv as written: its header and each row with its line number (a cell beyond the header
    under the key None, a missing one None); ([], []) when there is none. Every reader of the file
    starts here; what a row must hold is the reader's to say (the runs table names a damaged file,
    reproduce refuses the cell). A byte-order mark before the header is skipped."""
    if not path.exists():
        return [], []
    # utf-8-sig: a file saved again by a spreadsheet (Excel's "CSV UTF-8") starts with a byte-order mark,
    # which would make the first column '\ufeffepoch'.
    reader = csv.DictReader(io.StringIO(read_regular(path, encoding="utf-8-sig", errors=errors), newline=""))
    rows = [(reader.line_num, row) for row in reader]
    return list(reader.fieldnames or []), rows


def metric_columns(metrics: tuple[str, ...] = ("accuracy",)) -> list[str]:
    """metrics.csv's columns for a model trained with `metrics` (train.models)."""
    return ["epoch", "loss", *metrics, "val_loss", *(f"val_{m}" for m in metrics), *_AFTER]


METRIC_COLUMNS = metric_columns()  # those of the classifiers


class MetricsFile:
    """metrics.csv, rewritten atomically each epoch (it is small) so it is never half-written."""

    def __init__(self, path: Path, columns: list[str] = METRIC_COLUMNS):
        self.path, self.columns = path, columns
        self.rows: list[dict[str, Any]] = _rows_to_keep(path)

    def truncate_from(self, epoch: int) -> None:
        """Drop rows of epochs that will be trained again after a resume (1-based epoch numbers)."""
        self.rows = [r for r in self.rows if int(r["epoch"]) < epoch]

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append({k: _fmt(row.get(k)) for k in self.columns})
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=self.columns)
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(self.path, buf.getvalue())


def _rows_to_keep(path: Path) -> list[dict[str, Any]]:
    """The rows a resumed run goes on from, each with its epoch; RunRecordError naming the file when it
    cannot be read as metrics.csv (a traceback before: a KeyError, a UnicodeDecodeError), before anything
    of the run's record changed."""
    fix = "restore it from a copy of the run, or move it out of the run to go on without the rows it held"
    try:
        header, rows = read_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RunRecordError(f"{path} is unreadable ({type(exc).__name__}: {first_line(exc)}); {fix}") from None
    if rows and "epoch" not in header:
        raise RunRecordError(f"{path} has no 'epoch' column (its header: {', '.join(header)[:80]}); {fix}")
    for line, row in rows:
        try:
            int(row["epoch"])
        except (TypeError, ValueError):
            raise RunRecordError(f"{path}, line {line}: epoch={row['epoch']!r} is not a whole number; {fix}") from None
    return [row for _, row in rows]


def read_back(row: dict[str, Any]) -> dict[str, Any]:
    """A row of metrics.csv as numbers again, as the loop first had it: epoch and batch size whole,
    the rest float, an empty cell None (a cell that is not a number stays as written)."""

    def number(key: str, text: Any) -> Any:
        if text in ("", None):
            return None
        try:
            return int(text) if key in ("epoch", "batch_size") else float(text)
        except (TypeError, ValueError):
            return text

    return {k: number(k, v) for k, v in row.items()}


def metric_text(value: float) -> str:
    """A metric as the log, compare, the report and `runs` show it: four decimals of the number metrics.csv
    keeps (six significant digits). Rounding the float32 itself rounds a tie the other way from a reader of
    the file: float32 0.90825 (0.9082499...) showed 0.9082 in the log, 0.9083 in compare (from "0.90825")."""
    return f"{float(_fmt(float(value))):.4f}"


def finite(v) -> bool:
    """A number (not a bool) that is neither NaN nor infinite: what a metric, a JSON field or a tracker takes."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_metric(column: str) -> bool:
    """A column the model computed (loss, accuracy, a metric it adds), not the epoch, rate, batch or a measurement."""
    return column != "epoch" and column not in _AFTER


def _fmt(value: Any) -> Any:
    if value is None:
        return ""  # e.g. GPU memory on a CPU: recorded empty, never fatal
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


class TensorBoardWriter:
    """Epoch scalars under tensorboard/train and tensorboard/validation, as Keras's callback lays them out."""

    def __init__(self, logdir: Path):
        import tensorflow as tf

        self._tf = tf
        self._train = tf.summary.create_file_writer(str(logdir / "train"))
        self._val = tf.summary.create_file_writer(str(logdir / "validation"))

    def write(self, epoch: int, logs: dict[str, Any]) -> None:
        for key, value in logs.items():
            if value is None or not isinstance(value, (int, float)):
                continue
            writer, name = (self._val, key[4:]) if key.startswith("val_") else (self._train, key)
            with writer.as_default():
                self._tf.summary.scalar("epoch_" + name, value, step=epoch)
        self._train.flush()
        self._val.flush()

    def close(self) -> None:
        self._train.close()
        self._val.close()


def write_hparams(logdir: Path, settings: dict[str, Any], metrics: dict[str, Any], step: int) -> None:
    """The run's settings and final metrics for TensorBoard's HParams dashboard (one session per run).

    `invoke tensorboard` (pointed at RUNS_DIR) then lists every run in its table and parallel-
    coordinates views. The metrics go in as `hparams/<name>` scalars beside the session summary.
    """
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    values = {k: v for k, v in settings.items() if isinstance(v, (bool, int, float, str))}
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        hp.hparams(values, trial_id=logdir.parent.name)
        for name, value in metrics.items():
            if finite(value):
                tf.summary.scalar(f"hparams/{name}", value, step=step)
    writer.close()
