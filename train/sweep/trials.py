"""A trial's parts: its parameters drawn from the space, the sampler, its observer in the epoch loop,
and which trials the study's total counts (see train.sweep.study)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from ..run.manifest import update_manifest
from ..run.metrics_files import metric_text
from ..run.rundir import RunDir
from .space import Param, SweepSpec

log = logging.getLogger("train")
RUN_ATTR = "run"  # a trial's run directory name, set as soon as the run exists
SURPLUS_ATTR = "surplus"


def counted(trials) -> list:
    """The trials the study's total counts (see the module docstring)."""
    replaced = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if not t.user_attrs.get(SURPLUS_ATTR) and t.number not in replaced]


def retry_text(retry_of) -> str:
    """How a retried trial is said in the log and the report: "a retry of trial 3" (its run is trial 3's)."""
    return f"a retry of trial {', '.join(str(n) for n in retry_of)}"


def suggest(trial, p: Param):
    if p.choices is not None:
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.integer:
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)


def make_sampler(spec: SweepSpec, seed: int):
    import optuna

    if spec.sampler == "grid":
        return optuna.samplers.GridSampler(spec.grid(), seed=seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(n_startup_trials=spec.startup_trials, seed=seed)


class TrialObserver:
    """Tells the study where the trial's run is and each epoch's metric; ends the run when pruned."""

    def __init__(self, trial, spec: SweepSpec, info: dict[str, Any], epochs: int):
        self.trial, self.spec, self.info, self.epochs = trial, spec, info, epochs
        self.run_dir: Path | None = None
        self.unreported: list[int] = []  # epochs whose value the study's database did not take

    def on_start(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.trial.set_user_attr(RUN_ATTR, run_dir.name)
        update_manifest(RunDir(run_dir).manifest, sweep=self.info)
        log.info(
            "trial %d of study %s: run %s, %s", self.trial.number, self.spec.name, run_dir.name, self.info["params"]
        )

    def on_epoch_end(self, epoch: int, row: dict[str, Any], state):
        value = row.get(self.spec.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        try:
            self.trial.report(float(value), epoch)
            # After the last epoch there is nothing left to save by stopping: the trial is complete.
            prune = self.spec.pruner != "none" and epoch < self.epochs and self.trial.should_prune()
        except Exception as exc:  # the database stopped answering: the training is not lost for that
            from ..errors import first_line
            from .storage import storage_failure

            if storage_failure(exc) is None:
                raise
            if not self.unreported:
                log.warning(
                    "WARNING: study storage: epoch %d's %s not reported (%s); the trial trains on, unpruned",
                    epoch,
                    self.spec.metric,
                    first_line(str(storage_failure(exc))),
                )
            self.unreported.append(epoch)
            return None
        if prune:
            return "pruned", (
                f"pruned by the {self.spec.pruner} pruner after epoch {epoch}: {self.spec.metric}={metric_text(value)} "
                "is behind the study's other trials at this epoch"
            )
        return None


def best_trial(study) -> dict[str, Any] | None:
    import optuna

    done = [t for t in counted(study.get_trials(deepcopy=False)) if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        return None
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    best = (max if maximize else min)(done, key=lambda t: t.value)
    return {"trial": best.number, "value": best.value, "params": best.params, "run": best.user_attrs.get(RUN_ATTR)}
