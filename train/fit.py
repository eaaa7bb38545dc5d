"""`train(settings) -> Result`: one reproducible run, from validated settings to an exported model.

The parts are built in a fixed order with one log line each (run dir, devices, data, model,
state); `loop.EpochLoop` then runs the epochs and the export.

A resume is checked in full before the run's record changes: settings and checkpoints
(resume.plan_run), then the data and the restored state. Only then are config.json and a new
segment of manifest.json written, so a refused or failed resume leaves the record as it was.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from .config import Settings
from .errors import StorageError
from .logs import close_logging, setup_logging
from .loop import EpochLoop, Result
from .manifest import close_segment, new_segment, open_segment, record_data, start_manifest
from .resume import RunPlan, check_data, plan_run
from .rundir import clean_stale_temp, write_text
from .stopping import StopFlag

log = logging.getLogger("train")
__all__ = ["Result", "train"]


def train(settings: Settings, resume: str | None = None, force: bool = False, restart: bool = False) -> Result:
    """Run (or, with `resume` / RESUME, continue) one training run; see the module docstring."""
    # SIGTERM/SIGINT are routed to the stop flag from the first moment of the run: a `docker stop`
    # during start-up (TensorFlow import, data loading, model build) must still end with a finished
    # manifest and exit 75, never with the default action's silent death.
    stop = StopFlag(settings.max_minutes)
    with stop.installed():
        plan = plan_run(settings, settings.resume if resume is None else resume, force, restart)
        try:
            return _train(plan, force, stop)
        finally:
            plan.release()


def _train(plan: RunPlan, force: bool, stop: StopFlag) -> Result:
    run_dir, settings = plan.run_dir, plan.settings
    setup_logging(run_dir / "train.log")
    removed = clean_stale_temp(run_dir)
    log.info("run %s: %s%s", run_dir.name, "resuming " if plan.resumed else "", run_dir)
    for p in removed:
        log.info("removed a temp file left by an interrupted write: %s", p.name)
    manifest_path = run_dir / "manifest.json"
    started = stop.started
    status, error = "failed", None
    opened = {"segment": False}
    try:
        if not plan.resumed:  # a new run has no record to lose: its manifest says from the start how it goes
            start_manifest(manifest_path, settings, run_dir.name, new_segment(_epochs(settings), smoke=settings.smoke))
            opened["segment"] = True
        result = _run(plan, force, manifest_path, stop, opened)
        status = result.status
        return result
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        raise
    finally:
        if opened["segment"]:
            _close(run_dir, manifest_path, settings, status, error, time.monotonic() - started)
            from .report import write_final_report  # never raises: a report never changes the run's outcome

            write_final_report(run_dir, status, settings.report)
            log.info("run %s ended: %s", run_dir.name, status)
        elif plan.resumed:
            log.info("run %s: resume not started (%s); its config.json and manifest.json are unchanged",
                     run_dir.name, error or status)
        close_logging()


def _epochs(settings: Settings) -> int:
    return 1 if settings.smoke else settings.epochs


def _close(run_dir: Path, manifest_path: Path, settings: Settings, status: str, error: str | None, seconds: float) -> None:
    from .checkpoints import latest_header

    try:
        # Where the run stands is what its newest state says, however this segment ended.
        header = latest_header(run_dir / "checkpoints") or {}
        best = {"monitor": settings.monitor, "value": header.get("best")}
        close_segment(manifest_path, status, error, seconds, header.get("epoch"), best)
    except (StorageError, ValueError) as exc:  # a full disk, or a manifest damaged meanwhile: keep the first error
        log.error("could not update the manifest: %s", exc)


def _run(plan: RunPlan, force: bool, manifest_path: Path, stop: StopFlag, opened: dict) -> Result:
    settings, run_dir = plan.settings, plan.run_dir
    if stop.check():
        return _stopped_before_training(run_dir, stop)
    from . import checkpoints, data, devices, models

    setup = devices.setup_devices(settings)
    log.info(setup.describe())
    if stop.check():
        return _stopped_before_training(run_dir, stop)
    spec = data.load_data(settings)
    if stop.check():
        return _stopped_before_training(run_dir, stop)
    check_data(plan, spec.fingerprint, spec.source, force)
    epochs = _epochs(settings)
    ckpt_dir = run_dir / "checkpoints"
    loaded = None if plan.restart else checkpoints.load_latest(ckpt_dir)
    state = dict(loaded.meta) if loaded else {"epoch": 0, "step": 0, "global_step": 0, "best": None,
                                               "batch_size": settings.batch_size, "batch_halvings": 0}
    loop = EpochLoop(settings, run_dir, spec, setup, state, epochs, stop.started, stop)
    loop.build_model(models)
    scope = setup.strategy.scope() if setup.strategy is not None else contextlib.nullcontext()
    if loaded:
        with scope:  # optimizer slots must be created where the model's variables live (MirroredStrategy)
            checkpoints.restore(loop.model, loaded)
        log.info("resuming at epoch %d, step %d (global step %d)", state["epoch"] + 1, state["step"], state["global_step"])
    # Everything is checked: from here on the run's record changes.
    if plan.resumed:
        plan.write_config()
        where = f"{loaded.path.name} (epoch {state['epoch']}, step {state['step']})" if loaded else None
        open_segment(manifest_path, plan.manifest, settings,
                     new_segment(epochs, state["epoch"], where, plan.forced, plan.restart, settings.smoke),
                     last_write=_last_write(ckpt_dir))
        opened["segment"] = True
    labels = "\n".join(spec.class_names) + "\n"
    if not (run_dir / "labels.txt").is_file() or (run_dir / "labels.txt").read_text(encoding="utf-8") != labels:
        write_text(run_dir / "labels.txt", labels)
    record_data(manifest_path, precision={"policy": setup.precision, "reason": setup.precision_reason},
                data={"dataset": spec.name, "fingerprint": spec.fingerprint, "source": spec.source,
                      "n_train": spec.n_train, "n_val": spec.n_val, "input_shape": list(spec.input_shape),
                      "class_names": list(spec.class_names)})
    if not loaded:
        with scope:
            # The initial weights as a state: a run killed before its first interval resumes from
            # exactly these, and AUTO_BATCH always has a state to go back to.
            loop.model.optimizer.build(loop.model.trainable_variables)
            loop._save("initial state")
    # A stop requested from here on is seen by the loop before its first step: it saves a state.
    return loop.run()


def _stopped_before_training(run_dir: Path, stop: StopFlag) -> Result:
    """A stop before there is a model: nothing new to save, whatever was saved before is untouched."""
    log.info("stopped before training started (%s): nothing new to save; continue with --resume %s",
             stop.reason, run_dir.name)
    return Result(run_dir, stop.status, 0)


def _last_write(ckpt_dir: Path) -> float | None:
    from .checkpoints import list_states

    states = list_states(ckpt_dir)
    return states[0].stat().st_mtime if states else None
