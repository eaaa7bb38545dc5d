"""6. GPU: samples/s (and steps/s, each side at its own batch size) of the template's default vs the reference recipe, with mixed precision, XLA and
steps_per_execution considered. Runs unchanged on a GPU; skips with a reason without one."""

from __future__ import annotations

import common
import pytest

GOAL = 1.0


def test_gpu_steps_per_second(benchmark, mnist, mnist_npz, quick, tmp_path):
    import tensorflow as tf
    from reference import Recipe

    from train.inputs.pipeline import train_dataset

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU visible to TensorFlow (CPU-only build or no device): GPU steps/s not measured")
    arrays, what = mnist
    base = common.settings(dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"))
    variants = {
        "template default": base,
        "template + steps_per_execution=32": base.replace(steps_per_execution=32, checkpoint_every=224),
        "template + XLA": base.replace(jit_compile=True),
        "template float32": base.replace(precision="float32"),
    }
    recipe = Recipe(arrays)
    n_train = len(arrays["y_train"])
    batches = {"reference": 128, **{name: s.batch_size for name, s in variants.items()}}
    # Each side at its own batch size (the recipe's is 128, the template's default 512): samples/s
    # are compared, and steps/s is that over the side's batch.
    runs = {"reference": lambda: common.fit_epoch(recipe.model, recipe.train_ds, n_train)}
    for name, s in variants.items():
        spec, model = common.template_parts(s)
        steps = n_train // s.batch_size
        ds = train_dataset(spec, s, epoch=0, batch_size=s.batch_size).take(steps)
        model.fit(ds.take(4), epochs=1, verbose=0)  # trace / compile outside the timing
        runs[name] = lambda m=model, d=ds, n=steps * s.batch_size: common.fit_epoch(m, d, n)
    recipe.model.fit(recipe.train_ds.take(4), epochs=1, verbose=0)
    got = common.once(benchmark, lambda: common.interleave(runs, 1 if quick else 3))
    samples = {k: common.median(v) for k, v in got.items()}
    sps = {k: v / batches[k] for k, v in samples.items()}
    value = common.ratio(samples["template default"], samples["reference"])
    gpu = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get("device_name")
    common.record(
        benchmark,
        "6. GPU samples/s: template default / reference",
        f">= {GOAL}x",
        value,
        value is not None and value >= GOAL,
        gpu=gpu,
        samples_per_second=samples,
        steps_per_second=sps,
        ratios={k: common.ratio(v, samples["reference"]) for k, v in samples.items()},
        gpu_rows=_rows(sps, batches, gpu, {name: s.precision for name, s in variants.items()}),
    )


def _rows(steps_per_second: dict, batches: dict, gpu: str | None, precisions: dict) -> dict:
    """Model FLOP/s and MFU beside each steps/s: the default CNN's FLOPs per step against the GPU's
    datasheet peak in the precision the variant trains in (measured when the GPU is not listed)."""
    import tensorflow as tf
    from common import resolve_precision

    from train.models import cnn
    from train.training import flops

    count = flops.count_flops(cnn((28, 28, 1), 10))
    out = {}
    for name, sps in steps_per_second.items():
        # The recipe is float32; PRECISION=auto on a GPU: bfloat16 from compute capability 8.0, float16 from 7.0.
        policy = resolve_precision(precisions[name])[0] if name in precisions else "float32"
        dtype = flops.compute_dtype(policy, tf.config.experimental.tensor_float_32_execution_enabled())
        measured = None if flops.datasheet_peak(gpu, dtype) else flops.measure_peak_flops(dtype, "/GPU:0")
        out[name] = common.throughput_row(sps, batches[name], count, gpu, dtype, measured)
    return out
