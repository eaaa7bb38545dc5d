"""plots: the curves show what the records hold (resumes, the best epoch, GPU memory), as real PNGs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from builders import write_run_records

from train.results import plots
from train.results.run_records import load_records

pytest.importorskip("matplotlib")


def image(png: bytes):
    from PIL import Image

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def test_curves_mark_each_resume_and_the_best_epoch(tmp_path):
    log = (
        "2026-11-30 10:05:03 resuming at epoch 3, step 0 (global step 94)",
        "2026-11-30 10:09:03 resuming at epoch 5, step 7 (global step 195)",
    )
    rec = load_records(write_run_records(tmp_path / "r", log_lines=log))
    fig = plots.curves_figure(rec)
    axes = panels(fig)
    assert set(axes) == {
        "loss",
        "accuracy",
        "learning rate",
        "training samples/s",
        "model-FLOP utilisation (of peak)",
    }  # no GPU: no GPU panel
    for ax in axes.values():
        marks = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"]
        assert marks == [2.5, 4.5]
    acc = {line.get_label(): line for line in axes["accuracy"].lines}
    assert list(acc["validation"].get_ydata()) == pytest.approx([1 - 0.35 / e for e in range(1, 6)])
    assert list(acc["best val_accuracy"].get_xdata()) == [5.0]
    assert "best val_accuracy" not in {line.get_label() for line in axes["loss"].lines}


def test_the_best_star_follows_monitor(tmp_path):
    rec = load_records(write_run_records(tmp_path / "r", {"monitor": "val_loss"}))
    axes = panels(plots.curves_figure(rec))
    star = [line for line in axes["loss"].lines if line.get_label() == "best val_loss"]
    assert list(star[0].get_xdata()) == [5.0] and list(star[0].get_ydata()) == pytest.approx([1.2 / 5])


def test_gpu_memory_gets_a_panel_when_recorded(tmp_path):
    rows = [
        {"epoch": e, "loss": 1 / e, "val_loss": 1 / e, "gpu_memory_used_mb": 900 + e, "gpu_memory_peak_mb": 800.0}
        for e in (1, 2)
    ]
    axes = panels(plots.curves_figure(load_records(write_run_records(tmp_path / "r", metrics=rows))))
    gpu = axes["GPU memory (MB)"]
    assert [list(line.get_ydata()) for line in gpu.lines] == [[901, 902], [800, 800]]


def test_curves_png_is_the_picture_even_before_the_first_epoch(tmp_path):
    rec = load_records(write_run_records(tmp_path / "r", metrics=[]))
    fig = plots.curves_figure(rec)
    assert any(t.get_text() == "no epoch finished yet" for ax in fig.axes for t in ax.texts)
    img = image(plots.curves_png(rec))
    assert img.shape == (648, 1080, 3) and img.std() > 10


def test_confusion_and_grid_pictures():
    matrix = np.array([[8, 2, 0], [1, 9, 0], [0, 0, 10]])
    img = image(plots.confusion_png(matrix, ["cat", "dog", "bird"]))
    assert img.shape[0] > 300 and img.std() > 10
    images = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    grid = image(plots.grid_png(images, [0] * 10, [1] * 10, [0.9] * 10, ["cat", "dog"]))
    assert grid.shape[:2] == (int(2 * 1.75 * 90), int(8 * 1.5 * 90))  # 2 rows of 8


def test_compare_overlays_every_run(tmp_path):
    a = load_records(write_run_records(tmp_path / "a"))
    b = load_records(
        write_run_records(
            tmp_path / "b", metrics=[{"epoch": e, "val_accuracy": 0.5 + e / 10, "epoch_seconds": 4} for e in (1, 2, 3)]
        )
    )
    img = image(plots.compare_png([a, b]))
    assert img.shape == (432, 1350, 3)
    # Each run's colour is in the picture.
    for colour in plots.PALETTE[:2]:
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(img.astype(int) - rgb).sum(axis=2) < 30).sum() > 100, colour


TEX = [r"$\foo$", "$x^2$", r"a_{b}\\", "$", "100% & <b>"]  # mathtext that does not parse, or would typeset


def test_names_with_tex_are_drawn_as_plain_text_in_every_picture(tmp_path):
    matrix = np.array([[8, 2, 0, 0, 1], [1, 9, 0, 0, 0], [0, 0, 10, 0, 0], [0, 0, 0, 5, 0], [1, 0, 0, 0, 7]])
    assert image(plots.confusion_png(matrix, TEX)).std() > 10
    images = np.zeros((5, 8, 8, 1), np.uint8)
    assert image(plots.grid_png(images, [0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [0.5] * 5, TEX)).std() > 10
    a = load_records(write_run_records(tmp_path / r"$\bar$ run", {"monitor": "val_accuracy"}))
    b = load_records(write_run_records(tmp_path / "$y_1$"))
    assert image(plots.curves_png(a)).std() > 10
    assert image(plots.compare_png([a, b])).std() > 10
    fig = plots.curves_figure(a)
    assert fig.texts[0].get_text().startswith(r"$\bar$ run") and not fig.texts[0].get_parse_math()


def test_the_red_bars_are_named_in_a_legend_and_follow_the_overall_line():
    matrix = np.array([[8, 2, 0], [1, 9, 0], [0, 0, 10]])  # 80%, 90%, 100%; overall 90%
    fig = plots.confusion_figure(matrix, ["cat", "dog", "bird"])
    bars = panels(fig)["per-class accuracy"]
    colours = [tuple(round(c, 3) for c in patch.get_facecolor()[:3]) for patch in bars.patches]
    red, blue = (tuple(round(int(c[i : i + 2], 16) / 255, 3) for i in (1, 3, 5)) for c in (plots.VAL, plots.TRAIN))
    assert colours == [red, blue, blue]
    legend = bars.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["overall accuracy", "below it", "at or above"]
    (line,) = [line for line in bars.lines if line.get_linestyle() == "--"]
    assert list(line.get_xdata()) == [0.9, 0.9]


def test_a_constant_learning_rate_is_labelled_with_its_value_not_an_offset(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.curves_figure(load_records(write_run_records(tmp_path / "r")))  # learning rate 0.001 throughout
    FigureCanvasAgg(fig).draw()
    for title in ("learning rate", "training samples/s"):
        ax = panels(fig)[title]
        assert ax.yaxis.get_offset_text().get_text() == "", title
    labels = [t.get_text() for t in panels(fig)["learning rate"].get_yticklabels()]
    assert "0.001" in labels and all("e" not in label for label in labels)
