"""`train(settings) -> Result`: one reproducible run, from validated settings to an exported model.

The parts are built in a fixed order with one log line each (run dir, devices, data, model,
state); `loop.EpochLoop` then runs the epochs and the export.
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
from .manifest import now_iso, start_manifest, update_manifest
from .resume import prepare_run_dir
from .rundir import clean_stale_temp, write_text
from .stopping import StopFlag

log = logging.getLogger("train")
__all__ = ["Result", "train"]


def train(settings: Settings, resume: str | None = None, force: bool = False) -> Result:
    """Run (or, with `resume` / RESUME, continue) one training run; see the module docstring."""
    # SIGTERM/SIGINT are routed to the stop flag from the first moment of the run: a `docker stop`
    # during start-up (TensorFlow import, data loading, model build) must still end with a finished
    # manifest and exit 75, never with the default action's silent death.
    stop = StopFlag(settings.max_minutes)
    with stop.installed():
        return _train(settings, resume, force, stop)


def _train(settings: Settings, resume: str | None, force: bool, stop: StopFlag) -> Result:
    run_dir, settings, resumed = prepare_run_dir(settings, settings.resume if resume is None else resume, force)
    setup_logging(run_dir / "train.log")
    removed = clean_stale_temp(run_dir)
    log.info("run %s: %s%s", run_dir.name, "resuming " if resumed else "", run_dir)
    for p in removed:
        log.info("removed a temp file left by an interrupted write: %s", p.name)
    manifest_path = run_dir / "manifest.json"
    started = time.monotonic()
    status, error = "failed", None
    try:
        start_manifest(manifest_path, settings, run_dir.name, resumed)
        result = _run(settings, run_dir, manifest_path, stop)
        status = result.status
        return result
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        raise
    finally:
        try:
            update_manifest(manifest_path, status=status, ended_at=now_iso(), error=error,
                            duration_seconds=round(time.monotonic() - started, 2))
        except StorageError as exc:  # the disk may be why we are failing: say so, keep the first error
            log.error("could not update the manifest: %s", exc)
        from .report import write_final_report  # never raises: a report never changes the run's outcome

        write_final_report(run_dir, status)
        log.info("run %s ended: %s", run_dir.name, status)
        close_logging()


def _run(settings: Settings, run_dir: Path, manifest_path: Path, stop: StopFlag) -> Result:
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
    update_manifest(manifest_path, precision={"policy": setup.precision, "reason": setup.precision_reason},
                    data={"dataset": spec.name, "fingerprint": spec.fingerprint, "source": spec.source,
                          "n_train": spec.n_train, "n_val": spec.n_val, "input_shape": list(spec.input_shape),
                          "class_names": list(spec.class_names)})
    write_text(run_dir / "labels.txt", "\n".join(spec.class_names) + "\n")
    epochs = 1 if settings.smoke else settings.epochs
    ckpt_dir = run_dir / "checkpoints"
    loaded = checkpoints.load_latest(ckpt_dir)
    state = dict(loaded.meta) if loaded else {"epoch": 0, "step": 0, "global_step": 0, "best": None,
                                               "batch_size": settings.batch_size, "batch_halvings": 0}
    loop = EpochLoop(settings, run_dir, spec, setup, state, epochs, stop.started, stop)
    loop.build_model(models)
    scope = setup.strategy.scope() if setup.strategy is not None else contextlib.nullcontext()
    with scope:  # optimizer slots must be created where the model's variables live (MirroredStrategy)
        _restore_or_save_initial(loop, loaded, checkpoints)
    # A stop requested from here on is seen by the loop before its first step: it saves a state.
    return loop.run()


def _stopped_before_training(run_dir: Path, stop: StopFlag) -> Result:
    """A stop before there is a model: nothing new to save, whatever was saved before is untouched."""
    log.info("stopped before training started (%s): nothing new to save; continue with --resume %s",
             stop.reason, run_dir.name)
    return Result(run_dir, stop.status, 0)


def _restore_or_save_initial(loop: EpochLoop, loaded, checkpoints) -> None:
    state = loop.state
    if loaded:
        checkpoints.restore(loop.model, loaded)
        log.info("resuming at epoch %d, step %d (global step %d)", state["epoch"] + 1, state["step"], state["global_step"])
    else:
        # The initial weights as a state: a run killed before its first interval resumes from
        # exactly these, and AUTO_BATCH always has a state to go back to.
        loop.model.optimizer.build(loop.model.trainable_variables)
        loop._save("initial state")
