"""`fit(settings) -> Result`: one reproducible run, from validated settings to a trained model.

The parts are built in a fixed order with one log line each (run dir, devices, data, model,
state); `loop.EpochLoop` then runs the epochs and tells the callbacks (train.training.callbacks) of
the run's moments. What happens around the training (the report's refresh, the export, the extras)
is a callback given by the caller: `train.train` gives the template's own.

A resume is checked in full before the run's record changes: settings and checkpoints
(resume.plan_run), then the data and the restored state. Only then are config.json and a new
segment of manifest.json written, so a refused or failed resume leaves the record as it was.

With several workers (the workers extra, train.workers: TF_CONFIG or WORKERS) every worker first
joins the cluster; the chief (worker 0) alone plans, locks and writes the run directory and reads its
checkpoint, and gives the run id, the loop state and the restored variables to the others through
the device set-up's `group`. The other workers write nothing under RUNS_DIR and log to stdout,
prefixed with their index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .. import extras, models
from ..config import BATCH_PAIR, Settings, as_given, given, knows_given, unused_settings
from ..errors import Interrupted, ModelInterrupted, StorageError, WorkerLostError
from ..inputs import pipeline as data
from ..run import checkpoints
from ..run.checkpoints import latest_header, list_states
from ..run.files import clean_stale_temp, read_json
from ..run.manifest import (
    close_segment,
    dirty_warning,
    new_segment,
    open_segment,
    record_data,
    resume_point,
    start_manifest,
    update_manifest,
)
from ..run.remote import for_run, open_runs_dir
from ..run.resume import RunPlan, check_data, plan_run
from ..run.rundir import RunDir
from ..run.train_log import close_logging, log_to_file_only, setup_logging
from . import flops
from .callbacks import Callbacks
from .early_stopping import record_ending
from .loop import LoopState, Result, at_new_batch_size, log_distribution, start_loop
from .stop_flag import TRAINING, StopFlag

log = logging.getLogger("train")


def fit(
    settings: Settings,
    resume: str | None = None,
    force: bool = False,
    restart: bool = False,
    callbacks: Iterable[Any] = (),
    continue_with: Callable[[str], str] | None = None,
    parts: Callable[[Settings], Iterable[Any]] | None = None,
) -> Result:
    """Run (or, with `resume` / RESUME, continue) one training run; see the module docstring.

    The callbacks (train.training.callbacks) are told the run's moments in this order: `parts(the
    run's settings)`, the template's own (a resume's settings come from its config.json, so they are
    made once the run is found), then each extra the settings turn on (train.extras.callbacks), e.g.
    MLflow or a store's uploads, then `callbacks`.
    `continue_with(run name)`: the command a user pastes to continue a run that stopped with a
    resumable state, said in its last line (default `python -m train fit --resume NAME`).
    """
    continue_with = continue_with or (lambda name: f"python -m train fit --resume {name}")
    # SIGTERM/SIGINT are routed to the stop flag from the first moment of the run: a `docker stop`
    # during start-up (TensorFlow import, data loading, model build) must still end with a finished
    # manifest and exit 75, never with the default action's silent death.
    stop = StopFlag(settings.max_minutes)
    with stop.installed():
        # Several workers (the workers extra): the chief's joined device set-up, another worker's Result
        # once it has trained along with the chief; None for one process (or a template without the extra).
        start = extras.part("workers", "start")
        setup = start.join(settings, stop, _epochs(settings)) if start is not None else None
        if isinstance(setup, Result):
            return setup
        if setup is not None:
            # Every worker trains with its own invocation's settings: on a resume the chief must not
            # take a left-out one from the run's record, where the other workers cannot see it.
            settings = as_given(settings)
        resume = settings.resume if resume is None else resume
        # The console now; train.log, once the run has one, gets these lines first (the chief's, with several workers).
        setup_logging(None, prefix="[worker 0] " if setup is not None else "", hold=True)
        try:
            remote = open_runs_dir(settings)  # a store must answer now, before any training (StorageError)
            if remote is not None and resume:
                remote.bring(resume)  # the run to resume, from the store into the staging copy
            probe = flops.bf16_probe(settings.runs_dir)
            # Several workers keep the defaults: each loads its own settings.
            choose = (lambda given: _choose_batch(given, probe)) if setup is None and _leaves_batch(settings) else None
            plan = plan_run(settings, resume, force, restart, choose)
        except BaseException:
            close_logging()  # no run to give the held lines to: a caller that goes on does not keep holding them
            raise
        if plan.batch is not None:  # a new run took it (RESUME=auto may have continued another instead)
            log.info("batch: %(batch_size)d, learning rate %(learning_rate)g (neither was set: %(reason)s)", plan.batch)
        if plan.settings.runs_dir != settings.runs_dir:  # a run found elsewhere: its own RUNS_DIR caches it
            probe = flops.bf16_probe(plan.settings.runs_dir)
        try:
            own = parts(plan.settings) if parts else ()
            calls = Callbacks([*own, *extras.callbacks(plan.settings), *callbacks])
            return _train(plan, force, stop, setup, calls, continue_with, probe)
        finally:
            plan.release()


RESUMABLE = ("interrupted", "budget")  # the statuses of a run that stopped with its state saved


def _leaves_batch(settings: Settings) -> bool:
    """Neither BATCH_SIZE nor LEARNING_RATE was set (settings made in code hold what they hold)."""
    return knows_given(settings) and not BATCH_PAIR & given(settings)


def _choose_batch(settings: Settings, probe) -> tuple[Settings, dict[str, Any]]:
    """A new run that leaves the pair to the machine takes what it trains best with
    (train.setup.hardware.choose_batch): its settings and the manifest's record of why."""
    from ..errors import first_line
    from ..setup import devices

    try:
        batch, rate, why = devices.batch_choice(settings, probe)
    except Exception as exc:  # devices that cannot be read: setting them up says why, in the run's record
        batch, rate = settings.batch_size, settings.learning_rate
        why = f"the defaults, as the devices could not be read ({type(exc).__name__}: {first_line(exc, None)})"
    record = {"batch_size": batch, "learning_rate": rate, "reason": why}
    return settings.replace(batch_size=batch, learning_rate=rate), record


def _train(
    plan: RunPlan, force: bool, stop: StopFlag, setup, calls: Callbacks, continue_with: Callable[[str], str], probe
) -> Result:
    run_dir, settings = plan.run_dir, plan.settings
    _open_log(plan, setup)
    manifest_path = RunDir(run_dir).manifest
    started = stop.started
    status, error = "failed", None
    identity = _identity(run_dir)
    try:
        if not plan.resumed:  # a new run has no record to lose: its manifest says from the start how it goes
            started_manifest = start_manifest(
                manifest_path,
                settings,
                run_dir.name,
                new_segment(_epochs(settings), smoke=settings.smoke, config_sha256=plan.config_sha256()),
                batch=plan.batch,
            )
            plan.recorded = True
            _warn_dirty(started_manifest)
        calls.start(run_dir)
        with setup.group.errors() if setup is not None else contextlib.nullcontext():
            result = _run(plan, force, manifest_path, stop, setup, calls, probe)
        status = result.status
        if _identity(run_dir) != identity:
            raise _gone(run_dir)
        return result
    except BaseException as exc:
        if isinstance(exc, Exception) and _identity(run_dir) != identity:
            # Whatever failed first (a write, a read), the cause is that the directory is gone.
            gone = exc if getattr(exc, "run_dir_gone", False) else _gone(run_dir)
            error, status = f"StorageError: {gone}", "failed"
            raise gone from (None if gone is exc else exc)
        error = f"{type(exc).__name__}: {exc}"
        # A lost worker leaves the chief's last checkpoint: resumable, so RESUME=auto picks it up.
        # So does a stop that ended the export at the end (its parity check's process got the signal too):
        # the weights are saved, and a resume writes the export again.
        status = "interrupted" if isinstance(exc, (KeyboardInterrupt, WorkerLostError, Interrupted)) else "failed"
        raise
    finally:
        # A stop from here on (the report, the extras, a store's last uploads) cuts their waits short.
        stop.then = "training is over; cutting short what is left of the run's record and uploads"
        if error and status == "failed":
            log_to_file_only(error)
        if plan.recorded and _identity(run_dir) != identity:
            log.error("run %s ended: %s (its directory is gone, so nothing of it was recorded)", run_dir.name, status)
        elif plan.recorded:
            _close(run_dir, manifest_path, settings, status, error, time.monotonic() - started)
            # The report first, then the extras (MLflow uploads the manifest, report and export as
            # artifacts, waiting for its server with a deadline); none of them raises.
            calls.end(status, stop)
            log.info("run %s ended: %s%s", run_dir.name, status, _continued(plan, status, continue_with))
        elif plan.resumed:
            _not_started(run_dir, status, error, _continued(plan, status, continue_with))
        close_logging()
        # After train.log's last line: a RUNS_DIR in a store gets the closed manifest and the whole log
        # (raising StorageError only when nothing else is raised).
        calls.close(stop, error)


def _not_started(run_dir: Path, status: str, error: str | None, continued: str) -> None:
    """A resume that failed before it changed the run's record says so; its error has a line of its own."""
    why = "" if error and status == "failed" else f" ({status})"
    log.info(
        "run %s: resume not started%s; its config.json and manifest.json are unchanged%s", run_dir.name, why, continued
    )


def _open_log(plan: RunPlan, setup) -> None:
    """train.log opened, the run named (every worker logs the chief's run id), leftovers of a kill removed."""
    run_dir = plan.run_dir
    setup_logging(RunDir(run_dir).log, prefix="[worker 0] " if setup is not None else "")
    if setup is not None:
        setup.group.share_name(run_dir.name)
    # Temporary files left by a SIGKILL during a write (the export's staging folders are the export's).
    removed = clean_stale_temp(run_dir)
    remote = for_run(run_dir)  # a RUNS_DIR in a store: the run's URL there, and its staging copy here
    where = f"{remote.url}/{run_dir.name} (staged in {run_dir})" if remote is not None else str(run_dir)
    log.info("run %s: %s%s", run_dir.name, "resuming " if plan.resumed else "", where)
    for p in removed:
        log.info("removed a temp file left by an interrupted write: %s", p.name)


def _continued(plan: RunPlan, status: str, continue_with: Callable[[str], str]) -> str:
    """The end of a stopped run's last line: the whole command that continues it, to paste; after a budget
    stop, what budget that command has (the same again: MAX_MINUTES counts from each start)."""
    if status not in RESUMABLE:
        return ""
    minutes = plan.settings.max_minutes
    budget = f" (for another {minutes:g} minutes: MAX_MINUTES counts from each start; set another, or 0 for no limit)"
    return f"; to continue it: {continue_with(plan.run_dir.name)}{budget if status == 'budget' else ''}"


def _warn_dirty(manifest: dict) -> None:
    line = dirty_warning(manifest)
    if line:
        log.warning(line)


def _gone(run_dir: Path) -> StorageError:
    exc = StorageError(
        f"cannot write {run_dir}: the run directory was removed (or replaced) while the run was going, so "
        "nothing more of it can be saved and it cannot be resumed; start a new run, and keep RUNS_DIR out of "
        "clean-up jobs while runs train"
    )
    exc.run_dir_gone = True
    return exc


def _identity(path: Path) -> tuple[int, int] | None:
    """Which directory `path` is (device, inode): a folder made again at the same path is another one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _epochs(settings: Settings) -> int:
    return 1 if settings.smoke else settings.epochs


def _close(
    run_dir: Path, manifest_path: Path, settings: Settings, status: str, error: str | None, seconds: float
) -> None:
    try:
        # Where the run stands is what its newest state says, however this segment ended.
        header = latest_header(RunDir(run_dir).checkpoints) or {}
        best = {"monitor": settings.monitor, "value": header.get("best")}
        close_segment(manifest_path, status, error, seconds, header.get("epoch"), best)
    # A full disk, a manifest damaged or removed meanwhile: log it, and keep the first error.
    except (StorageError, ValueError, OSError) as exc:
        log.error("could not update the manifest: %s", exc)


def _run(
    plan: RunPlan, force: bool, manifest_path: Path, stop: StopFlag, setup, calls: Callbacks, probe: Callable
) -> Result:
    settings, run_dir = plan.settings, plan.run_dir
    several = setup is not None  # joined a cluster: its workers stop together, in the loop
    if several:
        stop.then = TRAINING  # at their first call of steps
    if stop.check() and not several:
        return _stopped_before_training(plan, stop)
    from ..setup import devices

    setup = setup or devices.setup_devices(settings, bf16_speedup=probe, kept=_recorded_precision(plan))
    log.info(setup.describe())
    if stop.check() and not several:
        return _stopped_before_training(plan, stop)
    spec = data.load_data(settings)
    if stop.check() and not several:
        return _stopped_before_training(plan, stop)
    check_data(plan, spec.fingerprint, spec.source, force)
    epochs = _epochs(settings)
    if not plan.resumed:
        _warn_unused(settings)
    loaded = None if plan.restart else checkpoints.load_latest(RunDir(run_dir).checkpoints)
    state = _starting_state(plan, loaded)
    if several:
        setup.group.send_state(spec, state, loaded is not None)
    _adopt_worker_count(state, loaded is not None, setup.workers if several else 1)

    def record(trains: bool) -> None:  # everything is checked: from here on the run's record changes
        _record_start(plan, manifest_path, setup, spec, state, loaded, epochs, trains)

    try:
        loop = start_loop(
            settings,
            run_dir,
            spec,
            setup,
            state,
            epochs,
            stop,
            chief=True,
            models=models,
            loaded=loaded,
            record=record,
        )
    except ModelInterrupted:
        if several:
            raise
        return _stopped_before_training(plan, stop)  # a stop during the factory ends it at once
    calls.train_begin(run_dir)  # only the chief gets here: the record is written
    loop.callbacks = calls
    # A stop requested from here on is seen by the loop before its first step: it saves a state.
    return loop.run()


def _warn_unused(settings: Settings) -> None:
    """A warning line for each setting given to a new run that does not act on it."""
    # The default stays quiet, as a reproduce rerun gives every recorded setting, EPOCHS too.
    if settings.smoke and settings.epochs not in (1, Settings.epochs) and "epochs" in given(settings):
        log.warning(
            "WARNING: EPOCHS=%d is not used: a smoke run trains one epoch (leave SMOKE off to train more)",
            settings.epochs,
        )
    unused = unused_settings(settings.to_dict())
    for name in ("image_size", "channels", "cache"):  # a rerun gives every recorded setting: the defaults stay quiet
        if name in unused and name in given(settings) and getattr(settings, name) != getattr(Settings, name):
            keeps = "holds its arrays in memory" if name == "cache" else "keeps its own images' size"
            log.warning(
                "WARNING: %s=%s is not used: it applies to DATASET=images:<dir> only; %s %s",
                name.upper(),
                getattr(settings, name),
                settings.dataset,
                keeps,
            )


def _recorded_precision(plan: RunPlan) -> tuple[str, str] | None:
    """A resumed run's (policy, reason), which PRECISION=auto keeps where the devices run it natively."""
    recorded = plan.manifest.get("precision") if plan.resumed and not plan.restart else None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("policy"), str):
        return None
    reason = recorded.get("reason")
    return recorded["policy"], reason if isinstance(reason, str) and reason else "no reason recorded"


def _warn_precision_change(plan: RunPlan, setup) -> None:
    """A resume on devices that cannot run the run's own precision natively trains on in another one."""
    before = _recorded_precision(plan)
    if before is not None and before[0] != setup.precision:
        log.warning(
            "WARNING: this run trained in %s until now, and trains on in %s (%s): its metrics may step here; "
            "each segment's precision is in manifest.json",
            before[0],
            setup.precision,
            setup.precision_reason,
        )


def _starting_state(plan: RunPlan, loaded) -> LoopState:
    """Where training starts: the newest state (a resume) or epoch 0, in the BATCH_SIZE of this run."""
    settings = plan.settings
    recorded_batch = (plan.saved_config or {}).get("batch_size", settings.batch_size)  # BATCH_SIZE before this resume
    # A header without batch_size (older versions) was trained with the recorded BATCH_SIZE.
    state = LoopState.from_meta(loaded.meta, recorded_batch) if loaded else LoopState(batch_size=settings.batch_size)
    if loaded and recorded_batch != settings.batch_size:
        # BATCH_SIZE changed with --force: train with the new value, as config.json records it.
        # (An unchanged BATCH_SIZE keeps the checkpoint's, which AUTO_BATCH may have halved.)
        saved_step, saved_batch = state.step, state.batch_size
        state = at_new_batch_size(state, settings.batch_size)
        log.info(
            "BATCH_SIZE %d -> %d (--force): step %d of epoch %d in batches of %d is step %d in batches of %d",
            recorded_batch,
            settings.batch_size,
            saved_step,
            state.epoch + 1,
            saved_batch,
            state.step,
            state.batch_size,
        )
    return state


def _record_start(
    plan: RunPlan, manifest_path: Path, setup, spec, state: LoopState, loaded, epochs: int, trains: bool = True
) -> None:
    """The record of a start: config.json and a new manifest segment on a resume, the data, the labels, the split."""
    settings = plan.settings
    if plan.resumed:
        where = resume_point(loaded.path.name, state.epoch, state.step) if loaded else None
        segment = new_segment(epochs, state.epoch, where, plan.forced, plan.restart, settings.smoke, trains=trains)
        # The segment first, with the sha256 of the config.json it is about to write: a kill between
        # the two leaves a file the next resume still accepts (train.run.resume.check_config). With
        # nothing to train, config.json stays the settings that trained the weights (what `reproduce`
        # reruns), whatever --force accepted; the segment's forced_changes still name them.
        segment["config_sha256"] = plan.config_sha256(written=trains)
        resumed_manifest = open_segment(manifest_path, plan.manifest, settings, segment, _last_sign_of_life(plan))
        plan.recorded = True
        if trains:  # else the record stays that of the code, devices and settings that trained the weights
            plan.write_config()
            _warn_dirty(resumed_manifest)
            _warn_precision_change(plan, setup)
    record_data(
        manifest_path,
        precision={"policy": setup.precision, "reason": setup.precision_reason, "cpu": setup.cpu},
        data={
            "dataset": spec.name,
            "fingerprint": spec.fingerprint,
            "source": spec.source,
            "n_train": spec.n_train,
            "n_val": spec.n_val,
            "n_test": spec.n_test,
            # What "val" means in metrics.csv: VAL_SPLIT of the training data ("train"), the test
            # split (runs recorded before validation was split off), or the image folder ("images").
            "val_from": spec.val_from,
            "val_split": settings.val_split if spec.val_from != "test" else None,
            "input_shape": list(spec.input_shape),
            "class_names": list(spec.class_names),
        },
    )
    RunDir(plan.run_dir).write_labels()  # a copy of the class names record_data just wrote
    _record_distribution(manifest_path, setup, state)


def _record_distribution(manifest_path: Path, setup, state: LoopState) -> None:
    """The manifest says how the run was split; a resume on another worker count is appended."""
    now = {
        "workers": setup.workers,
        "worker_index": setup.worker_index,
        "replicas": setup.replicas,
        "global_batch": state.batch_size,
        "per_replica_batch": state.batch_size // setup.replicas,
        "from_global_step": state.global_step,
    }
    history = read_json(manifest_path).get("distribution", []) if manifest_path.is_file() else []
    history = history if isinstance(history, list) else []
    update_manifest(manifest_path, distribution=[*history, now])
    log_distribution(setup, state)


def _adopt_worker_count(state: LoopState, resumed: bool, workers: int) -> None:
    if resumed and state.workers != workers:
        # Allowed: the global batch, hence every batch and step, stays the same (the manifest's
        # `distribution` list records the change); only the summation order across replicas differs.
        log.info(
            "resuming with %d worker(s); the saved state was trained by %d (same global batch %d)",
            workers,
            state.workers,
            state.batch_size,
        )
    state.workers = workers


def _stopped_before_training(plan: RunPlan, stop: StopFlag) -> Result:
    """A stop before there is a model: nothing new to save, whatever was saved before is untouched."""
    ended = f"stopped before training started ({stop.reason})"
    log.info("%s: nothing new to save", ended)
    if plan.recorded:  # a resume not yet checked keeps its record as it was
        record_ending(RunDir(plan.run_dir).manifest, f"{ended}: resumable")  # `runs` and the report say why
    return Result(plan.run_dir, stop.status, 0)


def _last_sign_of_life(plan: RunPlan) -> float | None:
    """When the process of the run's last segment was last seen alive (epoch seconds): the end of a
    segment that was killed without recording its own.

    In a bucket, the last renewal of the lease this process took over from it: the files here are
    this machine's downloads, their times say when they arrived, not when they were written (None
    when there was no lease to take over). Else the write time of the run's newest state."""
    lease = plan.lock.lease
    if lease is not None:
        return lease.taken_from
    states = list_states(RunDir(plan.run_dir).checkpoints)
    return states[0].stat().st_mtime if states else None
