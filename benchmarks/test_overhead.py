"""3. Template overhead: `train.train` (callbacks, logs, metrics, checkpoints) vs a bare model.fit."""

from __future__ import annotations

import time

import common

GOAL = 1.03


def test_fit_loop_overhead(benchmark, mnist_npz, quick, tmp_path):
    """Same settings, model, precision and per-epoch pipelines; export and report off (the bare loop has neither).

    Both sides are timed from settings to trained weights and their test accuracy: the template's
    `train()` call against load_data + build + compile + one `model.fit(validation_data=...)` per
    epoch + save_weights + `model.evaluate` on the test split, as the classic recipe ends."""
    import keras

    from train import train
    from train.inputs.pipeline import final_test_dataset, train_dataset, val_dataset

    # The pair a new run takes here, and the precision auto picks, given to both sides (left unset, train()
    # would choose them from its own probe, which a loaded machine can make disagree with the bare side's).
    s = common.as_a_new_run(
        common.settings(dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"), export=False, report="off")
    )
    s = s.replace(precision=common.resolve_precision(s.precision)[0])
    if quick:
        s = s.replace(epochs=1)
    n = 0

    def template() -> float:
        t0 = time.perf_counter()
        train(s)
        return time.perf_counter() - t0

    def bare() -> float:
        nonlocal n
        n += 1
        t0 = time.perf_counter()
        keras.utils.set_random_seed(s.seed)
        spec, model = common.template_parts(s)
        val = val_dataset(spec, s, s.batch_size)
        for epoch in range(s.epochs):
            model.fit(train_dataset(spec, s, epoch, s.batch_size), validation_data=val, epochs=1, verbose=0)
        model.save_weights(str(tmp_path / f"bare{n}.weights.h5"))
        model.evaluate(final_test_dataset(spec, s.batch_size), verbose=0)
        return time.perf_counter() - t0

    got = common.once(benchmark, lambda: common.interleave({"bare": bare, "template": template}, 1 if quick else 2))
    value = common.ratio(common.median(got["template"]), common.median(got["bare"]))
    common.record(
        benchmark,
        "3. wall time: template fit loop / bare model.fit",
        f"<= {GOAL}x",
        value,
        value is not None and value <= GOAL,
        epochs=s.epochs,
        batch_size=s.batch_size,
        precision=s.precision,
        seconds=got,
    )
