"""2. Time to 99.0% MNIST test accuracy: template default vs the reference recipe (real MNIST only)."""

from __future__ import annotations

import time

import common
import pytest
from reference import Recipe

TARGET = 0.990
GOAL = 0.5
BUDGET_EPOCHS = 10  # the classic recipe trains 10 epochs


class _Template:
    """The template's model, precision and pipeline, an epoch at a time (loop overhead: benchmark 3)."""

    def __init__(self, s):
        import keras

        from train.inputs.pipeline import val_dataset

        keras.utils.set_random_seed(s.seed)
        self.s = s
        self.spec, self.model = common.template_parts(s)
        self.val = val_dataset(self.spec, s, s.batch_size)
        self.history: list[dict] = []

    def epoch(self) -> dict:
        from train.inputs.pipeline import train_dataset

        e = len(self.history)
        t0 = time.perf_counter()
        self.model.fit(train_dataset(self.spec, self.s, e, self.s.batch_size), epochs=1, verbose=0)
        seconds = time.perf_counter() - t0
        acc = float(self.model.evaluate(self.val, verbose=0, return_dict=True)["accuracy"])
        self.history.append({"epoch": e + 1, "epoch_seconds": seconds, "val_accuracy": acc})
        return self.history[-1]


def _time_to(history, target: float) -> tuple[float | None, int | None]:
    """Training seconds (evaluation excluded on both sides) until the first epoch at >= target."""
    total = 0.0
    for row in history:
        total += row["epoch_seconds"]
        if row["val_accuracy"] >= target:
            return total, row["epoch"]
    return None, None


def test_time_to_99(benchmark, mnist, mnist_npz, quick, tmp_path):
    arrays, what = mnist
    if common.mnist_path() is None and not quick:
        pytest.skip(
            "needs real MNIST: set MNIST_NPZ to a Keras-format mnist.npz (generated data says nothing about 99%)"
        )
    budget = 1 if quick else BUDGET_EPOCHS
    base = common.settings(dataset=f"npz:{mnist_npz}", runs_dir=str(tmp_path / "runs"))
    contenders = {"reference": lambda: Recipe(arrays), "template": lambda: _Template(base.replace(epochs=budget))}
    # Candidate defaults, measured beside the current ones (a cosine schedule decays over EPOCHS).
    candidates = {
        "template cnn_bn+cosine, 3 epochs": base.replace(model="cnn_bn", lr_schedule="cosine", epochs=3),
        "template cnn+cosine, 4 epochs": base.replace(lr_schedule="cosine", epochs=4),
    }
    for name, s in candidates.items():
        contenders[name] = lambda s=s: _Template(s.replace(epochs=1) if quick else s)
    runners = {name: make() for name, make in contenders.items()}
    limits = {name: (budget if name in ("reference", "template") else r.s.epochs) for name, r in runners.items()}

    def race():  # epoch by epoch, round robin, each until it reaches the target or its budget
        active = list(runners)
        while active:
            for name in list(active):
                row = runners[name].epoch()
                if row["val_accuracy"] >= TARGET or len(runners[name].history) >= limits[name]:
                    active.remove(name)

    common.once(benchmark, race)
    reached = {name: _time_to(r.history, TARGET) for name, r in runners.items()}
    ref_s, tpl_s = reached["reference"][0], reached["template"][0]
    value = common.ratio(tpl_s, ref_s) if ref_s and tpl_s else None
    others = {
        name: {"seconds": sec, "epoch": ep, "ratio": common.ratio(sec, ref_s) if sec and ref_s else None}
        for name, (sec, ep) in reached.items()
    }
    common.record(
        benchmark,
        "2. time to 99.0% test accuracy: template default / reference",
        f"<= {GOAL}x",
        value,
        value is not None and value <= GOAL,
        data=what,
        budget_epochs=budget,
        reached=others,
        histories={
            n: [(r_["epoch"], round(r_["epoch_seconds"], 2), round(r_["val_accuracy"], 4)) for r_ in r.history]
            for n, r in runners.items()
        },
    )
