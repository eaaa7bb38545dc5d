"""The test split, evaluated once at the end of a completed run, through the best and the final weights.

Nothing was chosen on these numbers (best weights, early stopping and sweeps see validation only),
so they are an unbiased estimate of how the model does on new data. The loop runs this on the chief
with a plain float32 copy of the network; the manifest's `test` section holds the result, which
`on_test` and `on_test_summary` read back for the log, the report, `runs` and `compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..run.metrics_files import finite


def float32_model(models, settings, spec):
    """The run's network from `models` (the registry, or what the loop was given), built outside any
    distribution strategy, in float32: a copy that predicts the same on any device and that one
    process can run alone (no collective waits for the other workers)."""
    from ..models import float32_policy

    with float32_policy():
        return models.build_model(settings.model, spec.input_shape, spec.num_classes)


def evaluate_test(run_dir: Path, settings, spec, models, batch: int) -> dict | None:
    """The test split through the best and the final weights, one pass each (one for both when they
    are the same bytes), in batches of `batch`; None when the data set has no test split apart from
    validation (an image folder, or VAL_FROM=test)."""
    if spec.n_test == 0:
        return None
    from ..inputs import pipeline as data
    from ..models import entry
    from ..run.rundir import RunDir
    from ..run.weights import load_weights, records, verify

    files, task = RunDir(run_dir), entry(settings.model)
    model = float32_model(models, settings, spec)
    per_example = compiled_per_example(model, task)  # one trace for both weights files
    out: dict = {"examples": spec.n_test, "split": "test", "weights": {}}
    seen: dict[str, dict] = {}  # by the file's recorded sha256: the best epoch is often the last one
    for which, path in (("best", files.best_weights), ("final", files.final_weights)):
        if not path.is_file():
            continue  # no epoch improved MONITOR (a NaN from the start): no best weights to test
        record = records(run_dir).get(path.name) or {}
        key = record.get("sha256") or which
        numbers = seen.get(key)
        if numbers is not None:
            verify(run_dir, path, runs_dir=settings.runs_dir)  # its bytes are the record's, as a load would check
        else:  # the same bytes give the same numbers: one pass for both files then
            load_weights(model, run_dir, path, settings.runs_dir)
            numbers = seen[key] = mean_metrics(model, data.final_test_dataset(spec, batch), task, per_example)
        out["weights"][which] = {"epoch": record.get("epoch"), **numbers}
    return out


def mean_metrics(model, dataset, task, per_example=None) -> dict[str, float]:
    """Mean loss and metrics of `model` over `dataset`, with the model's own per-example functions
    (`per_example`: those compiled once by `compiled_per_example`, for several passes)."""
    import numpy as np  # here: `runs`, `compare` and the report's table read this module without numpy

    per_example = per_example or compiled_per_example(model, task)
    sums, count, loss = dict.fromkeys(task.metrics, 0.0), 0, 0.0
    for x, y in dataset:
        losses, values = per_example(x, y)
        loss += float(np.sum(np.asarray(losses, np.float64)))  # summed in float64, whatever the batches
        for name, v in values.items():
            sums[name] += float(np.sum(np.asarray(v, np.float64)))
        count += int(np.shape(y)[0])
    if not count:
        return {}  # nothing to average: no numbers rather than a division by zero
    return {"loss": loss / count, **{name: s / count for name, s in sums.items()}}


def compiled_per_example(model, task):
    """(per-example losses, {metric: per-example values}) of a batch, as one compiled function: op by op,
    two passes over a 10,000-example split took 2.4 s on a 2-core Xeon, compiled 1.0 s. It reads the
    model's variables, so weights loaded into them later need no new trace."""
    import tensorflow as tf

    loss_fn = task.loss(reduction=None)

    @tf.function(autograph=False, reduce_retracing=True)
    def per_example(x, y):
        probs = model(x, training=False)
        return loss_fn(y, probs), {name: fn(y, probs) for name, fn in task.metrics.items()}

    return per_example


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
