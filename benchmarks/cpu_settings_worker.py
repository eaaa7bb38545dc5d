"""One template training run under one CPU setting, in a process of its own (benchmark 10).

    python benchmarks/cpu_settings_worker.py '{"dataset": "npz:/tmp/mnist.npz", "runs_dir": "/tmp/runs", "epochs": 2}'

TensorFlow sizes its thread pools and reads the oneDNN variables once, when it starts: a setting
measured in a process that already ran TensorFlow would not be the setting. So benchmark 10 starts
this script once per setting and run, with the oneDNN variables in its environment and the rest in
the JSON argument:

- `intra`, `inter`: tf.config.threading intra-/inter-op thread counts, set before any op runs;
- `prefetch`: the depth of every tf.data prefetch (the template's pipelines end with
  prefetch(AUTOTUNE));
- `private_threadpool`, `max_intra_op`: tf.data's own thread pool
  (`tf.data.Options().threading`), added where each pipeline ends;
- `precision`: PRECISION, when a comparison needs another than what `auto` picks;
- `settings`: other template settings by name, e.g. {"jit_compile": true, "steps_per_execution": 1}.

Everything else is `train.train` with default settings, as a user runs it. The last line on
stdout is JSON: each epoch's samples/s, the final validation accuracy, the final weights' hash and
what was actually applied.
"""

from __future__ import annotations

import json
import sys


def _patch_pipelines(prefetch: int | None, private_threadpool: int | None, max_intra_op: int | None) -> dict:
    """Swap the prefetch depth and add the threading options at the end of every pipeline; returns a
    counter of the pipelines changed, so a setting that never reached a pipeline is noticed."""
    import tensorflow as tf

    applied = {"pipelines": 0}
    if prefetch is None and private_threadpool is None and max_intra_op is None:
        return applied
    original = tf.data.Dataset.prefetch

    def prefetch_then_options(self, buffer_size, name=None):
        ds = original(self, buffer_size if prefetch is None else prefetch, name=name)
        options = tf.data.Options()
        if private_threadpool is not None:
            options.threading.private_threadpool_size = private_threadpool
        if max_intra_op is not None:
            options.threading.max_intra_op_parallelism = max_intra_op
        applied["pipelines"] += 1
        return ds.with_options(options)

    tf.data.Dataset.prefetch = prefetch_then_options
    return applied


def run(spec: dict) -> dict:
    from train.setup.hardware import onednn_state, turn_on_onednn

    # As train() does, before TensorFlow's first import (this worker imports it first, to set the
    # threads): an AVX2-only CPU would otherwise measure Eigen's kernels, which no run uses.
    turn_on_onednn()
    import keras
    import tensorflow as tf

    if spec.get("intra") is not None:
        tf.config.threading.set_intra_op_parallelism_threads(int(spec["intra"]))
    if spec.get("inter") is not None:
        tf.config.threading.set_inter_op_parallelism_threads(int(spec["inter"]))
    applied = _patch_pipelines(spec.get("prefetch"), spec.get("private_threadpool"), spec.get("max_intra_op"))

    from train import train
    from train.config import load_settings

    s = load_settings(
        {
            "dataset": spec["dataset"],
            "runs_dir": spec["runs_dir"],
            "epochs": spec["epochs"],
            "precision": spec.get("precision"),
            "export": False,
            "report": "off",
            "progress": "line",
            **spec.get("settings", {}),
        },
        env_file=None,
        environ={},
    )
    result = train(s)
    return {
        "samples_per_second": [row["samples_per_second"] for row in result.history],
        "mfu": [row.get("mfu") for row in result.history],
        "val_accuracy": result.history[-1]["val_accuracy"],
        "precision": keras.mixed_precision.global_policy().name,
        "onednn": onednn_state(),
        "final_weights_sha256": result.final_weights_sha256,
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "pipelines_changed": applied["pipelines"],
    }


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
