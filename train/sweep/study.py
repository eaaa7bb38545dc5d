"""`run_sweep(spec, settings, url) -> SweepResult`: the trials of one study, each an ordinary run.

A trial is `train.train` in this process with the trial's parameters on top of the
fixed settings; its run directory, manifest (`"sweep": {study, trial, params}`), report and export
are those of any run. Which trials still have to run is read from the study each time, so a rerun
continues it and any number of processes can share it:

- the study's total counts every trial except two kinds: one that was queued again (its retry
  counts instead) and one a process created beyond the total while another did the same (it is
  failed at once, marked `surplus`, and never trains). Trial numbers are unique and ordered, so of
  two processes racing for the last place the lower number wins;
- a trial stopped by SIGTERM saves its run's state, is failed and queued again with the same
  parameters and run (the next sweep resumes that run); a trial whose process died without a word
  stops sending heartbeats and is queued again the same way by whichever process notices first;
- a sweep ends when every counted trial has finished: a process with nothing left to start waits
  for the trials others are running (and retries them if they go silent).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings, redact_uri
from ..errors import (
    ConfigError,
    DivergedError,
    Interrupted,
    ModelError,
    OutOfMemoryError,
    ResumeMismatchError,
    SecondInterrupt,
    TemplateError,
    first_line,
)
from ..run.find import is_run_dir
from ..run.manifest import section, update_manifest
from ..run.metrics_files import metric_text
from ..run.rundir import RunDir, read_json
from ..training.stop_flag import StopFlag
from .space import SweepSpec
from .storage import open_storage, open_study, quiet_heartbeats, storage_lost
from .trials import RUN_ATTR, SURPLUS_ATTR, TrialObserver, best_trial, counted, make_sampler, retry_text, suggest

log = logging.getLogger("train")
# A trial's own bad luck, not the sweep's: it fails, the search goes on.
TRIAL_FAILURES = (DivergedError, OutOfMemoryError, ModelError, ConfigError)


class SweepInterrupted(Interrupted):
    """SIGTERM/SIGINT during a sweep: the running trial's run saved its state and is queued again."""


@dataclass
class SweepResult:
    study: str
    total: int
    finished: int
    best: dict[str, Any] | None
    report: Path | None = None


class _Surplus(Exception):
    pass


class _Stopped(Exception):
    def __init__(self, run_dir: Path | None, reason: str):
        self.run_dir, self.reason = run_dir, reason


SAME_COMMAND = "the same `python -m train sweep` command"  # when the caller does not say which


def run_sweep(
    spec: SweepSpec, settings: Settings, url: str, trials: int | None = None, command: str = SAME_COMMAND
) -> SweepResult:
    """Run the study's remaining trials (see the module docstring); SweepInterrupted on a signal.

    `command`: the sweep command as the user gave it, the one instruction a stop gives (the stopped
    trial's run says it too: the sweep, not `fit --resume`, continues that run)."""
    import optuna

    storage = open_storage(url, spec.heartbeat)
    study = open_study(storage, spec, url, None)
    total = planned_total(spec, trials)  # said once the study is open: a refused storage says only that
    # Its own stream per process: workers started together must not propose the same parameters.
    study.sampler = make_sampler(spec, zlib.crc32(f"{settings.seed}/{len(study.trials)}/{os.getpid()}".encode()))
    shown = redact_uri(url)
    log.info(
        "study %s in %s: %d trial(s) in total, %d counted so far", spec.name, shown, total, len(counted(study.trials))
    )
    stop = StopFlag()
    stop.then = "stopping before another trial starts"  # in a trial, the trial's own flag says what it does
    waited_for: list[int] = []
    quiet_heartbeats()
    then = f"once it answers, run the sweep again ({command}): a trial it cut short is retried on its own run"
    with stop.installed(), storage_lost(url, then):
        while not stop.check():
            with warnings.catch_warnings():  # experimental in Optuna, and what finds a dead process's trial
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
            every = study.get_trials(deepcopy=False)
            count = counted(every)
            waiting = any(t.state == optuna.trial.TrialState.WAITING for t in count)
            if len(count) < total or waiting:
                _one_trial(study, spec, settings, shown, total, stop, command)
                continue
            running = [t.number for t in count if t.state == optuna.trial.TrialState.RUNNING]
            if not running:
                break
            if running != waited_for:
                _say_waiting(running, spec)
                waited_for = running
            # Look again soon: a trial that ends is seen within seconds, not a whole heartbeat later
            # (a dead process's trial still takes the heartbeat's grace to be found stale).
            _wait(stop, min(spec.heartbeat, POLL_SECONDS))
    if stop.reason:
        raise SweepInterrupted(f"study {spec.name}: stopped ({stop.reason}) between trials; to continue it: {command}")
    finished = [t for t in counted(study.get_trials(deepcopy=False)) if t.state.is_finished()]
    result = SweepResult(spec.name, total, len(finished), best_trial(study))
    from .report import write_sweep_report

    result.report = write_sweep_report(study, spec, settings.runs_dir, shown)
    return result


def planned_total(spec: SweepSpec, trials: int | None = None) -> int:
    """The study's total: `trials` (--trials) or the file's, but never more than the space has points
    when every trial would repeat one: a grid runs each point once, and a space of one point (every
    setting one value) would train the same settings again and again, so it is one trial, said once."""
    total = trials or spec.trials
    points = math.prod(len(p.choices) for p in spec.params) if all(p.choices for p in spec.params) else None
    if points is None or total <= points or (spec.sampler != "grid" and points > 1):
        return total
    if points == 1:
        log.info(
            "study %s: every setting in [space] has one value, so every trial would train the same settings: "
            "1 trial, not %d; list a second value of a setting to search it",
            spec.name,
            total,
        )
    else:
        log.info("study %s: the grid has %d points, so %d trial(s), not %d", spec.name, points, points, total)
    return points


def _say_waiting(running: list[int], spec: SweepSpec) -> None:
    """Other processes' trials, or a process that is gone (killed, or cut off from the database before
    it could tell its result): from here the two look the same until its heartbeat goes stale."""
    log.info(
        "waiting for trial(s) %s, run by other processes (a trial whose process is gone is taken over once "
        "it has sent no heartbeat for %g s)",
        ", ".join(map(str, running)),
        2 * spec.heartbeat,
    )


POLL_SECONDS = 2.0  # how often a sweep with nothing left to start looks at other processes' trials


def _wait(stop: StopFlag, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.check():
        time.sleep(0.2)


def _one_trial(
    study, spec: SweepSpec, settings: Settings, shown: str, total: int, stop: StopFlag, command: str
) -> None:
    """Start (or resume) one trial through Optuna's own loop, which sends its heartbeats."""
    numbers: list[int] = []
    failed: list[BaseException] = []  # why the trial failed: Optuna keeps it only in a log line it is told not to write

    def objective(trial):
        numbers.append(trial.number)
        try:
            return _objective(trial, study, spec, settings, shown, total, stop, command)
        except TRIAL_FAILURES as exc:
            failed.append(exc)
            raise

    try:
        study.optimize(objective, n_trials=1, catch=TRIAL_FAILURES)
    except _Surplus:
        return
    except _Stopped as stopped:
        frozen = _frozen(study, numbers[-1])
        # Failed (by optimize) first, then queued again: a kill between the two loses nothing but
        # the retry, which the next sweep cannot tell from a finished trial, never a trial run twice.
        _queue_again(study, frozen)
        where = f"its run {stopped.run_dir.name} saved a resumable state; " if stopped.run_dir else ""
        raise SweepInterrupted(
            f"study {spec.name}: trial {frozen.number} stopped ({stopped.reason}); {where}to continue it: {command}"
        ) from None
    except (TemplateError, KeyboardInterrupt) as exc:
        # Not the trial's result (data missing, storage full, a second Ctrl-C): it is queued again, so
        # fixing the cause and rerunning the sweep runs it instead of counting it as failed.
        if numbers:
            _queue_again(study, _frozen(study, numbers[-1]))
        if isinstance(exc, SecondInterrupt):  # the sweep continues the trial's run, never `fit --resume`
            raise SecondInterrupt(
                "Stopped at once (second Ctrl-C): the last saved state is kept; the trial is queued again; "
                f"to continue it: {command}"
            ) from None
        raise
    if numbers:
        t = _frozen(study, numbers[-1])
        log.info(
            "trial %d: %s%s%s",
            t.number,
            t.state.name.lower(),
            f" {spec.metric}={metric_text(t.value)}" if t.value is not None else "",
            f" ({type(failed[-1]).__name__}: {first_line(failed[-1])})" if failed else "",
        )


def _queue_again(study, trial) -> None:
    """The trial queued again with its parameters and run (Optuna's retry, which it marks experimental:
    it is what is asked for here, so its warning with a path into Optuna's source is not shown)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, trial)


def _resumed(run_dir: Path, info: dict, number: int, retry_of: list) -> float | None:
    """A trial's run that exists already: its value when it finished before its process could tell
    the study (counted once, not run again), else None, and it is resumed."""
    files = RunDir(run_dir)
    manifest = read_json(files.manifest) if files.manifest.is_file() else {}
    ended = _ended(manifest)
    if files.manifest.is_file():
        update_manifest(files.manifest, sweep=info)  # a resume's new segment keeps it
    if ended is None:
        again = f" ({retry_text(retry_of)})" if retry_of else ""
        log.info("trial %d%s: resuming run %s", number, again, run_dir.name)
    return ended


def _objective(
    trial,
    study,
    spec: SweepSpec,
    settings: Settings,
    shown: str,
    total: int,
    stop: StopFlag,
    command: str = SAME_COMMAND,
) -> float:
    import optuna

    retry_of = _frozen(study, trial.number).system_attrs.get("retry_history") or []
    if not retry_of:
        before = [t for t in counted(study.get_trials(deepcopy=False)) if t.number < trial.number]
        if len(before) >= total:
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise _Surplus()
    params = {p.name: suggest(trial, p) for p in spec.params}
    info = {"study": spec.name, "trial": trial.number, "params": params, "storage": shown}
    if retry_of:
        info["retry_of"] = list(retry_of)
    run_dir = _own_run(settings, trial.user_attrs.get(RUN_ATTR))
    if run_dir is not None and (ended := _resumed(run_dir, info, trial.number, retry_of)) is not None:
        return ended
    if stop.check():
        raise _Stopped(None, stop.reason)
    trial_settings = settings.replace(
        **params,
        monitor=spec.metric,
        # A resumed run keeps its name: given as it is, it is no RUN_NAME the run does not use.
        run_name=f"{spec.name}-t{trial.number}" if run_dir is None else _run_name(run_dir),
        # Which run a trial trains is the study's to say (RESUME=auto of the compose file must not
        # pick another trial's run), and the study's URL is no setting of the run.
        resume="",
        sweep_storage="",
    )
    observer = TrialObserver(trial, spec, info, 1 if trial_settings.smoke else trial_settings.epochs)
    result = _train_trial(trial_settings, run_dir, observer, command, f"study {spec.name}: trial {trial.number}")
    if result.status == "pruned":
        raise optuna.TrialPruned(f"run {result.run_dir.name}")
    if result.status != "completed":
        raise _Stopped(result.run_dir, result.status)
    if result.best is None or not math.isfinite(result.best):
        raise DivergedError(f"trial {trial.number}: {spec.metric} was never measured as a finite number")
    return float(result.best)


def _train_trial(settings: Settings, run_dir: Path | None, observer, command: str, which: str):
    """`train.train` for one trial. A retried trial whose run was started with other fixed settings
    (or data) is refused in the sweep's words: `sweep` has no --force, and one study's trials share
    their fixed settings, so the fix is the run's own settings again, or a new study."""
    from .. import train

    try:
        return train(settings, resume=str(run_dir or ""), callbacks=[observer], continue_with=lambda _name: command)
    except ResumeMismatchError as exc:
        if run_dir is None:
            raise
        raise ResumeMismatchError(
            f"{which} continues run {run_dir.name}, which was started with other settings or data "
            f"({exc.change}): rerun the sweep with what that run was started with, or search with the "
            "new settings in a new study (--study NAME)",
            exc.change,
        ) from None


def _run_name(run_dir: Path) -> str:
    name = read_json(RunDir(run_dir).config).get("run_name", "")
    return name if isinstance(name, str) else ""


def _frozen(study, number: int):
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _own_run(settings: Settings, name: str | None) -> Path | None:
    if not name:
        return None
    path = Path(settings.runs_dir) / name
    return path if is_run_dir(path) else None


def _ended(manifest: dict):
    import optuna

    if manifest.get("status") == "pruned":
        raise optuna.TrialPruned("its run had been pruned already")
    best = section(manifest, "best").get("value")
    if manifest.get("status") == "completed" and isinstance(best, (int, float)):
        return float(best)
    return None
