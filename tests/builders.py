"""What the tests build instead of real data and real runs (imported as `builders`).

- Generated data: `labelled_images` is the one generator, a learnable set for any shape and number
  of classes; `labelled_arrays`, `write_npz` and `write_image_dir` lay it out as the template reads it.
- Fake runs: `write_run` writes a run directory holding exactly the files given (damaged ones
  too); `write_run_records` a finished run's records around it; `peaked_metrics` rows to read back.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

# --- generated data ----------------------------------------------------------------------------


def labelled_images(n: int, shape=(28, 28), classes: int = 4, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): n uint8 images of `shape` (H, W or H, W, C) on noise, class k a bright square at the
    k-th place of a grid over the image, so that a small model learns the set in a few steps."""
    rng = np.random.default_rng(0) if rng is None else rng
    y = rng.integers(0, classes, size=n).astype("uint8")
    x = rng.integers(0, 60, size=(n, *shape), dtype=np.uint8)
    grid = max(2, math.ceil(math.sqrt(classes)))
    offset = [max(1, side // 7) for side in shape[:2]]  # 4 pixels on 28
    pitch = [(side - o) // grid for side, o in zip(shape[:2], offset)]  # 12 on 28 in a 2x2 grid
    for i, k in enumerate(y):
        r, c = divmod(int(k), grid)
        top, left = offset[0] + r * pitch[0], offset[1] + c * pitch[1]
        x[i, top : top + max(1, pitch[0] // 2), left : left + max(1, pitch[1] // 2)] = 255
    return x, y


def labelled_arrays(n_train: int = 426, n_test: int = 128, size: int = 28, classes: int = 4, seed: int = 0, shape=None):
    """A Keras-layout set {x_train, y_train, x_test, y_test} of `labelled_images`.

    By default 426 training examples, of which VAL_SPLIT=0.1 (per class) validates 42 and leaves
    384 to train on: 12 steps of 32, 6 of 64."""
    rng = np.random.default_rng(seed)
    (xtr, ytr), (xte, yte) = (labelled_images(n, shape or (size, size), classes, rng) for n in (n_train, n_test))
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def write_npz(
    path: Path, n_train: int = 600, n_test: int = 300, shape=(28, 28), classes: int = 10, seed: int = 0, **extra
) -> Path:
    """`labelled_arrays` saved as a Keras-layout .npz at `path`; `extra` arrays are added or replace those."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **(labelled_arrays(n_train, n_test, classes=classes, seed=seed, shape=shape) | extra))
    return path


def write_tiny_npz(directory: Path, name: str = "tiny.npz", **kw) -> Path:
    """directory/name holding `labelled_arrays(**kw)`: the tiny set the tests train on (4 classes, 426 + 128)."""
    path = Path(directory) / name
    np.savez(path, **labelled_arrays(**kw))
    return path


def write_image_dir(root: Path, classes: int = 3, per_class: int = 20, size: int = 40, seed: int = 0) -> Path:
    """`root/class_<k>/img_<i>.png|jpg`: PIL-generated images, PNG and JPEG alternating, varied sizes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = size + int(rng.integers(0, 9)), size + int(rng.integers(0, 9))
            pixels = rng.integers(0, 80, (h, w, 3)).astype(np.uint8)
            pixels[..., c % 3] += 150  # each class has its own dominant colour
            ext = "png" if i % 2 == 0 else "jpg"
            Image.fromarray(pixels).save(d / f"img_{i:03d}.{ext}")
    return root


# --- fake runs ---------------------------------------------------------------------------------


def write_run(
    run_dir: Path,
    config: dict | str | None = None,
    manifest: dict | str | None = None,
    metrics: list[dict] | str | None = None,
    checkpoints: list[str] | None = None,
) -> Path:
    """A run directory holding exactly the files given, for tests of what reads runs back.

    A dict is written as JSON, a str as it is (a damaged file), None writes no file; `metrics` rows
    become metrics.csv (an empty list: none); `checkpoints` names state files under checkpoints/
    ([]: the folder only)."""
    import csv
    import json

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, value in (("config.json", config), ("manifest.json", manifest)):
        if value is not None:
            (run_dir / name).write_text(value if isinstance(value, str) else json.dumps(value))
    if isinstance(metrics, str):
        (run_dir / "metrics.csv").write_text(metrics)
    elif metrics:
        columns = list(dict.fromkeys(k for row in metrics for k in row))
        with open(run_dir / "metrics.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(metrics)
    if checkpoints is not None:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        for name in checkpoints:
            (run_dir / "checkpoints" / name).write_bytes(b"a state")
    return run_dir


def write_run_records(
    run_dir: Path,
    config: dict | None = None,
    manifest: dict | None = None,
    metrics: list[dict] | None = None,
    log_lines: tuple[str, ...] = (),
) -> Path:
    """A run directory as a finished run leaves its records (no weights): for the report and compare."""
    from train.config import Settings

    settings = Settings().to_dict()
    settings.update(config or {})
    base = {
        "status": "completed",
        "python": "3.11.7",
        "tensorflow": "2.21.0",
        "keras": "3.15.1",
        "git": {"commit": "0123456789abcdef", "dirty": False, "source": "git"},
        "requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": "ab" * 32},
        "data": {
            "dataset": "mnist",
            "source": "data/mnist.npz",
            "n_train": 60000,
            "n_val": 10000,
            "fingerprint": "cd" * 32,
            "class_names": [str(i) for i in range(10)],
        },
        "precision": {"policy": "mixed_bfloat16", "reason": "CPU has native bfloat16"},
        "gpus": [],
        "resumed_at": [],
        "duration_seconds": 12.5,
    }
    base.update(manifest or {})
    if metrics is None:
        metrics = [
            {
                "epoch": e,
                "loss": 1.0 / e,
                "accuracy": 1 - 0.3 / e,
                "val_loss": 1.2 / e,
                "val_accuracy": 1 - 0.35 / e,
                "learning_rate": 0.001,
                "batch_size": 128,
                "epoch_seconds": 10.0,
                "samples_per_second": 6000.0 + e,
            }
            for e in range(1, 6)
        ]
    run_dir = write_run(run_dir, settings, base, metrics)
    (run_dir / "train.log").write_text("".join(line + "\n" for line in log_lines))
    return run_dir


def peaked_metrics(epochs: int = 5) -> list[dict]:
    """metrics.csv rows whose best epoch is not the last, and not the same for both directions:
    val_accuracy peaks at epoch 3 (0.91, then 0.89, 0.88), val_loss bottoms out at epoch 2 (0.30).
    Each epoch takes 10 s more than the one before (10, 20, 30 ...): time to best tells epochs apart."""
    val_accuracy = [0.70, 0.85, 0.91, 0.89, 0.88, 0.87, 0.86][:epochs]
    val_loss = [0.60, 0.30, 0.35, 0.40, 0.45, 0.50, 0.55][:epochs]
    return [
        {
            "epoch": e,
            "loss": 1.0 / e,
            "accuracy": 1 - 0.3 / e,
            "val_loss": val_loss[e - 1],
            "val_accuracy": val_accuracy[e - 1],
            "learning_rate": 0.001,
            "epoch_seconds": 10.0 * e,
        }
        for e in range(1, epochs + 1)
    ]
