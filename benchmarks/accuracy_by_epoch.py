"""Test accuracy at each epoch's end of the default training, per setting and seed (docs/performance.md).

    MNIST_NPZ=/path/to/mnist.npz python benchmarks/accuracy_by_epoch.py learning_rate=0.005,0.008 --seeds 42,7,1

Each value of the one setting named (a Settings field, e.g. learning_rate, batch_size, epochs) trains
the template's defaults with it, once per seed, the way benchmark 2 does (its `_Template`: the run's
model, precision, schedule and pipeline on the training images VAL_SPLIT leaves, the test split
evaluated at each epoch end for the measurement only). One line per run: setting, seed, and per
epoch its training seconds and test accuracy (%). One run after another: the seconds are not a
side-by-side comparison; benchmarks 1 and 2 are.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", help="NAME=V1,V2,... (a Settings field and its values)")
    parser.add_argument("--seeds", default="42,7,1", help="comma-separated seeds (default 42,7,1)")
    args = parser.parse_args(argv)
    name, _, values = args.setting.partition("=")
    npz = os.environ.get("MNIST_NPZ")
    if not (name and values and npz):
        parser.error("give NAME=V1,V2 and MNIST_NPZ (a Keras-format mnist.npz)")

    from train.setup.hardware import turn_on_onednn

    turn_on_onednn()  # as a run does, before TensorFlow's import
    import common
    from test_time_to_accuracy import _Template

    from train.errors import ConfigError

    try:  # each value checked as a run checks it: one line naming the setting, not a traceback
        chosen = [getattr(common.settings(**{name: value}), name) for value in values.split(",")]
    except ConfigError as exc:
        parser.error(str(exc))
    runs_dir = tempfile.mkdtemp(prefix="accuracy-by-epoch-")
    for value in chosen:
        for seed in (int(s) for s in args.seeds.split(",")):
            # The pair a new run takes here first (as benchmark 2), then the one setting measured.
            base = common.as_a_new_run(common.settings(dataset=f"npz:{npz}", runs_dir=runs_dir, seed=seed))
            trainer = _Template(base.replace(**{name: value}))
            for _ in range(trainer.s.epochs):
                trainer.epoch()
            rows = [
                (r["epoch"], round(r["epoch_seconds"], 1), round(r["val_accuracy"] * 100, 2)) for r in trainer.history
            ]
            print(json.dumps({name: value, "seed": seed, "per_epoch": rows}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
