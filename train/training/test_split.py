"""The test split, evaluated once at the end of a completed run, through the best and the final weights.

Nothing was chosen on these numbers (best weights, early stopping and sweeps see validation only),
so they are an unbiased estimate of how the model does on new data. The loop runs this on the chief
with a plain float32 copy of the network; the manifest's `test` section holds the result, which
`on_test` and `on_test_summary` read back for the log, the report, `runs` and `compare`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def float32_model(models, settings, spec):
    """The run's network from `models` (the registry, or what the loop was given), built outside any
    distribution strategy, in float32: a copy that predicts the same on any device and that one
    process can run alone (no collective waits for the other workers)."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        return models.build_model(settings.model, spec.input_shape, spec.num_classes)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def evaluate_test(run_dir: Path, settings, spec, models) -> dict | None:
    """The test split through the best and the final weights, one pass each; None when the data set
    has no test split apart from validation (an image folder, or VAL_FROM=test)."""
    if spec.n_test == 0:
        return None
    from ..inputs import pipeline as data
    from ..models import entry
    from ..run.rundir import RunDir
    from ..run.weights import load_weights, records

    files, task = RunDir(run_dir), entry(settings.model)
    model = float32_model(models, settings, spec)
    out: dict = {"examples": spec.n_test, "split": "test", "weights": {}}
    for which, path in (("best", files.best_weights), ("final", files.final_weights)):
        if not path.is_file():
            continue  # no epoch improved MONITOR (a NaN from the start): no best weights to test
        load_weights(model, run_dir, path)
        epoch = (records(run_dir).get(path.name) or {}).get("epoch")
        numbers = mean_metrics(model, data.final_test_dataset(spec, settings.batch_size), task)
        out["weights"][which] = {"epoch": epoch, **numbers}
    return out


def mean_metrics(model, dataset, task) -> dict[str, float]:
    """Mean loss and metrics of `model` over `dataset`, with the model's own per-example functions."""
    import numpy as np  # here: `runs`, `compare` and the report's table read this module without numpy

    loss_fn, sums, count, loss = task.loss(reduction=None), dict.fromkeys(task.metrics, 0.0), 0, 0.0
    for x, y in dataset:
        probs = model(x, training=False)
        loss += float(np.sum(np.asarray(loss_fn(y, probs), np.float64)))
        for name, fn in task.metrics.items():
            sums[name] += float(np.sum(np.asarray(fn(y, probs), np.float64)))
        count += int(np.shape(y)[0])
    if not count:
        return {}  # nothing to average: no numbers rather than a division by zero
    return {"loss": loss / count, **{name: s / count for name, s in sums.items()}}


def final_test_line(test: dict) -> str:
    """The log's one line: the best weights' numbers first (what the run delivers), then the final ones."""
    return f"test ({test.get('examples')} examples): {on_test_summary({'test': test}) or 'no weights to test'}"


def on_test(manifest: dict[str, Any], which: str = "best") -> dict[str, Any] | None:
    """The test split's numbers for one weights file ("best" or "final") from the manifest's `test`
    section; None for a run without one (not finished, no test split, or recorded before it)."""
    test = manifest.get("test") if isinstance(manifest, dict) else None
    weights = test.get("weights") if isinstance(test, dict) else None
    got = weights.get(which) if isinstance(weights, dict) else None
    return got if isinstance(got, dict) else None


def on_test_summary(manifest: dict[str, Any]) -> str | None:
    """Both weights files on the test split in one line, e.g. `accuracy=0.9912 loss=0.0310 (best
    weights, epoch 7); accuracy=0.9905 loss=0.0335 (final weights, epoch 10)`; None without a test."""
    parts = []
    for which in ("best", "final"):
        got = dict(on_test(manifest, which) or {})
        if not got:
            continue
        epoch = got.pop("epoch", None)
        # The metrics first, the loss last: accuracy is the number a reader looks for.
        numbers = " ".join(f"{k}={v:.4f}" for k, v in sorted(got.items(), key=lambda kv: kv[0] == "loss") if finite(v))
        parts.append(f"{numbers} ({which} weights, epoch {epoch if epoch is not None else '?'})")
    return "; ".join(parts) or None


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
