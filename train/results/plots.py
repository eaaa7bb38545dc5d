"""The pictures of a report and of a comparison, as PNG bytes.

matplotlib is imported inside each function (a bad setting is rejected before it loads), and only
its object API is used (`Figure` + the Agg canvas savefig picks): no pyplot, so no global backend
is chosen and nothing needs a display.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence

import numpy as np

from .run_records import RunRecords

TRAIN, VAL = "#1f77b4", "#d62728"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def plain_text(draw: Callable) -> Callable:
    """Every label drawn as the text it is: class names, run names and metric names come from
    users, and `$\\foo$` (matplotlib's mathtext) or usetex would turn one into TeX that may not
    parse, taking the picture and the report down. Applies while the figure is built and while it
    is drawn (tick labels are made then)."""

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        from matplotlib import rc_context

        with rc_context({"text.parse_math": False, "text.usetex": False}):
            return draw(*args, **kwargs)

    return wrapper


@plain_text
def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


def _xy(records: RunRecords, key: str) -> tuple[list[float], list[float]]:
    pairs = [(r["epoch"], r.get(key)) for r in records.rows]
    pairs = [(e, v) for e, v in pairs if v is not None and math.isfinite(v)]
    return [e for e, _ in pairs], [v for _, v in pairs]


def _marker(x: list) -> str | None:
    """Each point marked while there are few enough (40) to tell apart."""
    return "o" if len(x) <= 40 else None


def _epoch_axis(ax, records: RunRecords) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.grid(True, alpha=0.3)
    for i, r in enumerate(records.resumes):
        # Resumed into epoch r.epoch: the line sits just before that epoch's point.
        ax.axvline(r.epoch - 0.5, color="#555555", linestyle="--", linewidth=1, label="resumed" if i == 0 else None)


def curves_png(records: RunRecords) -> bytes:
    return png_bytes(curves_figure(records))


@plain_text
def curves_figure(records: RunRecords):
    """Loss and accuracy (train vs validation), learning rate, samples/s and GPU memory if any."""
    from matplotlib.figure import Figure

    gpu = any(r.get(k) is not None for r in records.rows for k in ("gpu_memory_used_mb", "gpu_memory_peak_mb"))
    fig = Figure(figsize=(12, 7.2), dpi=90)
    grid = fig.add_gridspec(2, 6, left=0.06, right=0.98, top=0.9, bottom=0.08, wspace=0.9, hspace=0.45)
    done = len(records.rows)
    fig.suptitle(
        f"{records.name}: {records.manifest.get('status', 'unknown')}, "
        f"{done} of {records.planned_epochs or '?'} epochs",
        fontsize=13,
    )
    best = records.best_row()
    for slot, metric in ((grid[0, :3], "loss"), (grid[0, 3:], "accuracy")):
        _metric_panel(fig.add_subplot(slot), records, metric, best)
    bottom = [
        ("learning_rate", "learning rate", None),
        ("samples_per_second", "training samples/s", None),
        ("mfu", "model-FLOP utilisation (of peak)", None),
    ]
    if gpu:
        bottom.append(("gpu_memory_used_mb", "GPU memory (MB)", "gpu_memory_peak_mb"))
    width = 6 // len(bottom)
    for i, (key, title, second) in enumerate(bottom):
        _measure_panel(fig.add_subplot(grid[1, i * width : (i + 1) * width]), records, key, title, second)
    return fig


def _metric_panel(ax, records: RunRecords, metric: str, best: dict | None) -> None:
    """`metric` for training and validation, the best epoch starred when MONITOR is one of them."""
    ax.set_title(metric)
    for key, colour, label in ((metric, TRAIN, "train"), ("val_" + metric, VAL, "validation")):
        x, y = _xy(records, key)
        if x:
            ax.plot(x, y, color=colour, marker=_marker(x), markersize=4, label=label)
    if best is not None and records.monitor in (metric, "val_" + metric):
        ax.plot(
            [best["epoch"]],
            [best[records.monitor]],
            marker="*",
            markersize=16,
            color="#ffbf00",
            markeredgecolor="black",
            linestyle="none",
            label=f"best {records.monitor}",
        )
    _epoch_axis(ax, records)
    if not records.rows:
        ax.text(0.5, 0.5, "no epoch finished yet", ha="center", va="center", transform=ax.transAxes)
    elif ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=9)


def _measure_panel(ax, records: RunRecords, key: str, title: str, second: str | None) -> None:
    """One measured column per epoch (a second one beside it: GPU memory used and peak)."""
    ax.set_title(title)
    x, y = _xy(records, key)
    if x:
        ax.plot(x, y, color=TRAIN, marker=_marker(x), markersize=3, label="used (driver)" if second else None)
    if second:
        x2, y2 = _xy(records, second)
        if x2:
            ax.plot(x2, y2, color=VAL, marker=_marker(x2), markersize=3, label="peak (TensorFlow)")
        ax.legend(loc="best", fontsize=8)
    _plain_numbers(ax, y)
    _epoch_axis(ax, records)


def _plain_numbers(ax, y: list[float]) -> None:
    """Tick labels that are the values themselves: no "1e-3" or "+6e3" offset above the axis,
    which a constant learning rate or a steady samples/s otherwise gets."""
    from matplotlib.ticker import FuncFormatter

    if y and min(y) == max(y):  # a flat line: a range from zero, so the ticks are round numbers
        ax.set_ylim(min(0.0, 2 * y[0]), max(0.0, 2 * y[0]) or 1.0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def confusion_png(matrix: np.ndarray, class_names: Sequence[str]) -> bytes:
    return png_bytes(confusion_figure(matrix, class_names))


@plain_text
def confusion_figure(matrix: np.ndarray, class_names: Sequence[str]):
    """Row-normalised confusion matrix (counts written in when they fit) and per-class accuracy bars
    (red: below the overall accuracy, the dashed line)."""
    from matplotlib.figure import Figure

    n = len(class_names)
    totals = matrix.sum(axis=1, keepdims=True)
    share = np.divide(matrix, totals, out=np.zeros(matrix.shape, float), where=totals > 0)
    side = min(max(4.5, 0.45 * n + 2), 14)
    fig = Figure(figsize=(side + 4.5, side), dpi=90)
    grid = fig.add_gridspec(1, 2, width_ratios=[side, 4], left=0.1, right=0.97, top=0.9, bottom=0.14, wspace=0.35)
    labels = [str(c)[:14] for c in class_names]
    _matrix_panel(fig, fig.add_subplot(grid[0]), matrix, share, labels)
    _accuracy_bars(fig.add_subplot(grid[1]), matrix, share, labels)
    return fig


def _matrix_panel(fig, ax, matrix: np.ndarray, share: np.ndarray, labels: list[str]) -> None:
    n = len(labels)
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_title("confusion matrix (share of each true class)")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_xticks(range(n), labels, rotation=90 if n > 10 or max(map(len, labels)) > 3 else 0, fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    if n <= 15:
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(
                        j,
                        i,
                        str(int(matrix[i, j])),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if share[i, j] > 0.5 else "black",
                    )
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def _accuracy_bars(bars, matrix: np.ndarray, share: np.ndarray, labels: list[str]) -> None:
    from matplotlib.patches import Patch

    n = len(labels)
    acc = np.diag(share)
    # From a round tenth below the worst class: differences of a few points stay visible at 95%+.
    low = max(0.0, math.floor((float(acc.min()) - 0.02) * 10) / 10) if n else 0.0
    overall = float(np.trace(matrix) / max(matrix.sum(), 1))
    bars.barh(range(n), acc, color=[VAL if a < overall else TRAIN for a in acc])
    bars.set_yticks(range(n), labels, fontsize=8)
    bars.invert_yaxis()
    bars.set_xlim(low, 1)
    bars.set_title("per-class accuracy")
    pad = 0.02 * (1 - low)
    for i, a in enumerate(acc):
        inside = a - low > 0.25 * (1 - low)  # the figure on the bar where it fits, else just after it
        bars.text(
            a - pad if inside else max(a, low) + pad,
            i,
            f"{a:.1%}",
            ha="right" if inside else "left",
            va="center",
            fontsize=7,
            color="white" if inside else "black",
        )
    line = bars.axvline(overall, color="black", linestyle="--", linewidth=1, label="overall accuracy")
    below, above = Patch(color=VAL, label="below it"), Patch(color=TRAIN, label="at or above")
    bars.legend(
        handles=[line, below, above], loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3, fontsize=7, frameon=False
    )
    bars.grid(True, axis="x", alpha=0.3)


@plain_text
def grid_png(
    images: np.ndarray,
    true: Sequence[int],
    pred: Sequence[int],
    prob: Sequence[float],
    class_names: Sequence[str],
) -> bytes:
    """The given images in a grid of 8 columns, each titled with its true and predicted class."""
    from matplotlib.figure import Figure

    count, columns = len(images), 8
    rows = max(1, math.ceil(count / columns))
    fig = Figure(figsize=(columns * 1.5, rows * 1.75), dpi=90)
    axes = fig.subplots(rows, columns, squeeze=False)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.9, bottom=0.01, wspace=0.1, hspace=0.55)
    for i, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if i >= count:
            continue
        img = images[i]
        ax.imshow(
            img[..., 0] if img.shape[-1] == 1 else img,
            cmap="gray" if img.shape[-1] == 1 else None,
            vmin=0,
            vmax=255,
            interpolation="nearest",
        )
        ax.set_title(
            f"true {str(class_names[true[i]])[:10]}\npred {str(class_names[pred[i]])[:10]} {prob[i]:.0%}",
            fontsize=9,
            color="#b00000",
        )
    return png_bytes(fig)


def compare_png(runs: Sequence[RunRecords]) -> bytes:
    return png_bytes(compare_figure(runs))


@plain_text
def compare_figure(runs: Sequence[RunRecords]):
    """Overlaid curves of several runs: loss and accuracy by epoch, MONITOR by training time."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.8), dpi=90)
    axes = fig.subplots(1, 3)
    fig.subplots_adjust(left=0.05, right=0.99, top=0.86, bottom=0.22, wspace=0.25)
    monitor = runs[0].monitor
    fig.suptitle("solid: validation, dashed: train; star: the best epoch of each run", fontsize=10)
    for i, rec in enumerate(runs):
        colour = PALETTE[i % len(PALETTE)]
        for ax, metric in zip(axes[:2], ("loss", "accuracy")):
            for key, style in (("val_" + metric, "-"), (metric, "--")):
                x, y = _xy(rec, key)
                if x:
                    label = rec.name if key.startswith("val_") else None
                    ax.plot(x, y, linestyle=style, color=colour, marker=_marker(x), markersize=3, label=label)
        x, y = _xy(rec, rec.monitor)
        if x:
            secs = [rec.seconds_to(e) for e in x]
            axes[2].plot(secs, y, color=colour, marker=_marker(x), markersize=3)
            best = rec.best_row()
            if best is not None:  # where each run reached its best: the time-to-best column of the table
                axes[2].plot(
                    [rec.seconds_to(best["epoch"])],
                    [best[rec.monitor]],
                    marker="*",
                    markersize=14,
                    color=colour,
                    markeredgecolor="black",
                    linestyle="none",
                )
    for ax, title in zip(axes, ("loss", "accuracy", f"{monitor} by training time")):
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("training seconds" if ax is axes[2] else "epoch")
    from matplotlib.ticker import MaxNLocator

    for ax in axes[:2]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9)
    return fig
