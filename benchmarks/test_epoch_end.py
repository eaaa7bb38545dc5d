"""11. Epoch ends: the template's pipeline, which runs without tf.data's autotuning thread, against
the same pipeline with that thread (as tf.data starts it by default).

Both sides are the default training (`train.train`, seeded, so the same batches and
weights), interleaved; the other side builds its datasets as tf.data does by default. With the
thread, dropping an epoch's iterator waits for the thread's next wake-up (its periods double from
10 ms, so a 5 s epoch ends at 5.1 or 10.2 s). The figure is the ratio of the summed epoch times;
the epochs that took more than 2 s longer than the fastest are counted on each side.
"""

from __future__ import annotations

import contextlib

import common


@contextlib.contextmanager
def _with_autotuning_thread():
    """Build datasets as tf.data would by default: the template's option left out."""
    from train.inputs import images, pipeline

    real = pipeline.released_at_once
    pipeline.released_at_once = images.released_at_once = lambda ds: ds
    try:
        yield
    finally:
        pipeline.released_at_once = images.released_at_once = real


def test_epoch_end_without_the_autotuning_thread(benchmark, mnist_npz, quick, tmp_path):
    from train import train

    s = common.settings(
        dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"), export=False, report="off", seed=42
    )
    s = s.replace(epochs=1 if quick else s.epochs)
    rounds = 1 if quick else 3
    sides = {
        "without the thread (template)": contextlib.nullcontext,
        "with the thread (tf.data's default)": _with_autotuning_thread,
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}

    def run(name: str) -> float:
        with sides[name]():
            result = train(s)
        seconds[name] += [row["epoch_seconds"] for row in result.history]
        return 0.0

    common.once(benchmark, lambda: common.interleave({n: (lambda n=n: run(n)) for n in sides}, rounds))
    fastest = min(min(v) for v in seconds.values())
    without, with_ = (sum(v) for v in seconds.values())
    common.record(
        benchmark,
        "11. epoch ends: summed epoch seconds of the default training, without tf.data's autotuning thread / with it",
        "< 1 (reported)",
        common.ratio(without, with_),
        None,
        epoch_seconds={n: [round(x, 2) for x in v] for n, v in seconds.items()},
        late_epochs={n: sum(x > fastest + 2.0 for x in v) for n, v in seconds.items()},
    )
