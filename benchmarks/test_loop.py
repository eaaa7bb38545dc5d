"""7. The training loop on one device: the project's compiled steps (train.training.steps) vs the `model.fit` they replace.

Same data pipeline order, model, initial weights, precision and STEPS_PER_EXECUTION; epochs
interleaved in one process, the first (tracing) epoch of each left out. The loop under test is
what `EpochLoop._fit` runs: `Steps.train` over `distribute_datasets_from_function` with the
default strategy, `STEPS_PER_EXECUTION` steps per call, the sums read back after each call.
"""

from __future__ import annotations

import time

import common
import pytest

GOAL = 1.0  # "must not cost speed": samples/s of the new loop / model.fit, within noise


def _fit_epoch(model, spec, s, epoch: int) -> float:
    from train.inputs.pipeline import train_dataset

    ds = train_dataset(spec, s, epoch, s.batch_size)
    t0 = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0, shuffle=False)
    return spec.n_train / (time.perf_counter() - t0)


def _steps_epoch(steps, spec, s, epoch: int) -> float:
    import tensorflow as tf

    from train.inputs.pipeline import replica_dataset, steps_per_epoch

    ds = steps.strategy.distribute_datasets_from_function(
        lambda ctx: replica_dataset(spec, s, "train", epoch, s.batch_size)
    )
    total, done, iterator = steps_per_epoch(spec, s.batch_size), 0, None
    t0 = time.perf_counter()
    iterator = iter(ds)
    while done < total:
        n = min(s.steps_per_execution, total - done)
        steps.train(iterator, tf.constant(n), tf.constant(0.0)).numpy()
        done += n
    return spec.n_train / (time.perf_counter() - t0)


@pytest.mark.parametrize("steps_per_execution", [1, 8])
def test_own_steps_vs_model_fit(benchmark, mnist_npz, quick, tmp_path, steps_per_execution):
    import keras

    from train.training.steps import Steps

    s = common.as_a_new_run(
        common.settings(
            dataset=f"npz:{mnist_npz}",
            runs_dir=str(tmp_path / "runs"),
            export=False,
            steps_per_execution=steps_per_execution,
            checkpoint_every=0,
        )
    )
    keras.utils.set_random_seed(s.seed)
    spec, fit_model = common.template_parts(s)
    keras.utils.set_random_seed(s.seed)
    _, own_model = common.template_parts(s)
    own_model.optimizer.build(own_model.trainable_variables)
    steps = Steps(own_model, None, jit_compile=s.jit_compile)
    epochs = {"model.fit": 0, "steps": 0}

    def fit() -> float:
        epochs["model.fit"] += 1
        return _fit_epoch(fit_model, spec, s, epochs["model.fit"])

    def own() -> float:
        epochs["steps"] += 1
        return _steps_epoch(steps, spec, s, epochs["steps"])

    repeats = 3 if quick else 5
    got = common.once(benchmark, lambda: common.interleave({"model.fit": fit, "steps": own}, repeats))
    fit_sps, own_sps = common.median(got["model.fit"][1:]), common.median(got["steps"][1:])
    value = common.ratio(own_sps, fit_sps)
    common.record(
        benchmark,
        f"7. samples/s, one device: own compiled steps / model.fit (STEPS_PER_EXECUTION={steps_per_execution})",
        f">= {GOAL}x within noise",
        value,
        value is not None and value >= GOAL * 0.97,
        n_train=spec.n_train,
        batch_size=s.batch_size,
        model_fit_samples_per_second=fit_sps,
        steps_samples_per_second=own_sps,
        samples_per_second=got,
    )
