"""The best weights on the validation set: confusion matrix, per-class accuracy, the worst mistakes
(the test split is the loop's, evaluated once at the end of training: train.training.test_split).

Everything is rebuilt from the run directory: the settings from config.json, the data through
`data.load_data` (the same split, the same order), the network through the model registry with
best.weights.h5 loaded into it. Only the K most wrong images are kept while predicting, so a large
image set is not held twice in memory.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NoWeightsError
from ..training.test_split import float32_model

log = logging.getLogger("train")
MOST_WRONG = 24


@dataclass
class Evaluation:
    class_names: list[str]
    matrix: np.ndarray  # (classes, classes) counts: rows true, columns predicted
    wrong_images: np.ndarray  # uint8 (k, H, W, C), the most wrong first
    wrong_true: np.ndarray
    wrong_pred: np.ndarray
    wrong_prob: np.ndarray  # probability given to the predicted (wrong) class

    @property
    def n(self) -> int:
        return int(self.matrix.sum())

    @property
    def accuracy(self) -> float:
        return float(np.trace(self.matrix) / max(self.n, 1))

    def per_class(self) -> list[dict]:
        """Per true class: examples, correct, accuracy, and the class it is most often taken for."""
        rows = []
        for i, name in enumerate(self.class_names):
            total, correct = int(self.matrix[i].sum()), int(self.matrix[i, i])
            off = self.matrix[i].copy()
            off[i] = 0
            j = int(off.argmax())
            rows.append(
                {
                    "class": name,
                    "examples": total,
                    "correct": correct,
                    "accuracy": correct / total if total else None,
                    "confused_with": (self.class_names[j], int(off[j])) if off[j] else None,
                }
            )
        return rows


def evaluate_best(run_dir: Path, runs_dir: object = None) -> Evaluation:
    """Predict the validation set with best.weights.h5; NoWeightsError / DataError say what is missing,
    WeightsError that the file is not the one training wrote (its recorded sha256; `runs_dir`: where the
    command found the run, for the command its message gives)."""
    from ..run.rundir import RunDir

    weights = RunDir(run_dir).best_weights
    if not weights.is_file():  # moved aside (a damaged file's fix) or deleted, or no epoch has finished
        done = RunDir(run_dir).read_manifest(missing_ok=True).get("epochs_completed")
        why = (
            f"moved or deleted, though {done} epoch(s) finished: put it back, or a backup of it"
            if done
            else "no epoch finished"
        )
        raise NoWeightsError(f"{weights} is missing: {why}")
    from ..errors import DataError
    from ..inputs import pipeline as data
    from ..run.manifest import section
    from ..run.rundir import read_run_settings
    from ..run.weights import load_weights

    settings = read_run_settings(run_dir)
    class_names = RunDir(run_dir).data_description()[0]  # the run's classes, as every reader takes them
    # The run's log is not the place for a second "data: ..." line, nor for the data's warnings again
    # (files an image folder leaves out, VAL_SPLIT's unseen classes): training said them once.
    with _quiet(log):
        spec = data.load_data(settings)
    if list(spec.class_names) != class_names:
        raise DataError(
            f"{spec.source} now holds other classes ({_few(spec.class_names)}) than run "
            f"{Path(run_dir).name} trained on ({_few(class_names)}): evaluate it on the data it trained on"
        )
    recorded = section(RunDir(run_dir).read_manifest(missing_ok=True), "data").get("fingerprint")
    if isinstance(recorded, str) and recorded and spec.fingerprint != recorded:
        raise DataError(
            f"{spec.source} is not the data run {Path(run_dir).name} trained on (fingerprint "
            f"{spec.fingerprint[:12]}, recorded {recorded[:12]}): its validation part would describe other "
            "examples; put the data it trained on back"
        )
    from .. import models

    model = float32_model(models, settings, spec)
    load_weights(model, run_dir, weights, runs_dir)  # the recorded sha256 first: a replaced file is never evaluated
    return _predict(model, data.val_dataset(spec, settings, settings.batch_size), class_names, MOST_WRONG)


def _few(names, shown: int = 5) -> str:
    more = f", ... ({len(names)} classes)" if len(names) > shown else ""
    return ", ".join(map(str, list(names)[:shown])) + more


def _predict(model, dataset, class_names: list[str], k: int) -> Evaluation:
    classes = len(class_names)
    matrix = np.zeros((classes, classes), np.int64)
    keep_x, keep_t, keep_p, keep_prob, keep_score = [], [], [], [], []
    for x, y in dataset:
        probs = np.asarray(model(x, training=False), dtype=np.float64)
        y = np.asarray(y, dtype=np.int64)
        pred = probs.argmax(axis=1)
        np.add.at(matrix, (y, pred), 1)
        wrong = np.nonzero(pred != y)[0]
        if len(wrong):
            # Most wrong = the least probability left for the true class.
            keep_score.append(probs[wrong, y[wrong]])
            keep_x.append(np.asarray(x, dtype=np.float32)[wrong].round().clip(0, 255).astype(np.uint8))
            keep_t.append(y[wrong])
            keep_p.append(pred[wrong])
            keep_prob.append(probs[wrong, pred[wrong]])
            keep_x, keep_t, keep_p, keep_prob, keep_score = _top(k, keep_x, keep_t, keep_p, keep_prob, keep_score)
    if not keep_x:
        empty = np.zeros((0,), np.int64)
        shape = tuple(model.inputs[0].shape[1:])
        return Evaluation(class_names, matrix, np.zeros((0, *shape), np.uint8), empty, empty, np.zeros((0,)))
    return Evaluation(class_names, matrix, keep_x[0], keep_t[0], keep_p[0], keep_prob[0])


def _top(k, xs, ts, ps, probs, scores):
    """Merge the kept and the new mistakes; keep the k lowest scores (stable: earlier examples first)."""
    x, t, p, prob, score = (np.concatenate(a) for a in (xs, ts, ps, probs, scores))
    order = np.argsort(score, kind="stable")[:k]
    return [x[order]], [t[order]], [p[order]], [prob[order]], [score[order]]


@contextlib.contextmanager
def _quiet(logger: logging.Logger):
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
