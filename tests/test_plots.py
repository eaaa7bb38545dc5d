"""plots: the curves show what the records hold (resumes, the best epoch, GPU memory), as real PNGs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import write_run_records

from train import plots
from train.history import load_records

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
    grid = image(plots.grid_png(images, [0] * 10, [1] * 10, [0.9] * 10, ["cat", "dog"], columns=4))
    assert grid.shape[:2] == (int(3 * 1.75 * 90), int(4 * 1.5 * 90))  # 3 rows of 4


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
