"""The epoch loop: one `model.fit` call per epoch, resumable at any saved step.

It owns the model, the datasets, metrics.csv, TensorBoard, the best weights, the resumable states
and the stop flag. Each epoch's data order is a pure function of (SEED, epoch), so re-entering an
epoch at a saved step sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Settings
from .early_stop import Patience, record_ending
from .errors import DivergedError, OutOfMemoryError
from .logs import MetricsFile, TensorBoardWriter, gpu_memory
from .manifest import update_manifest
from .stopping import StopFlag

log = logging.getLogger("train")
MAX_BATCH_HALVINGS = 3


@dataclass
class Result:
    run_dir: Path
    status: str  # completed | interrupted | budget
    epochs_completed: int
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    final_weights_sha256: str | None = None
    export: dict[str, Any] | None = None
    model: Any = field(default=None, repr=False)


def _monitor_mode(settings: Settings) -> str:
    if settings.monitor_mode != "auto":
        return settings.monitor_mode
    return "min" if "loss" in settings.monitor else "max"


def step_at_batch_size(step: int, saved_batch: int, new_batch: int) -> int:
    """Where a state saved at `step` (batches of `saved_batch`) stands in batches of `new_batch`.

    The example order does not depend on the batch size, so the position carries over in examples.
    """
    return step * saved_batch // new_batch


def _improved(value: float | None, best: float | None, mode: str) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return best is None or (value > best if mode == "max" else value < best)


class EpochLoop:
    """The epoch loop and what it owns: model, datasets, metrics, checkpoints, stop flag."""

    def __init__(self, settings, run_dir, spec, setup, state, epochs, started, stop: StopFlag | None = None):
        self.s, self.run_dir, self.spec, self.setup, self.state = settings, run_dir, spec, setup, state
        self.epochs, self.started = epochs, started
        self.mode = _monitor_mode(settings)
        self.patience = Patience(settings.patience, settings.min_delta, self.mode, settings.monitor)
        self.metrics = MetricsFile(run_dir / "metrics.csv")
        self.metrics.truncate_from(state["epoch"] + 1)
        self.history: list[dict[str, Any]] = [dict(r) for r in self.metrics.rows]
        self.stop = stop if stop is not None else StopFlag(settings.max_minutes, started)

    # -- construction -------------------------------------------------------------------------
    def build_model(self, models) -> None:
        import keras

        def make():
            model = models.build_model(self.s.model, self.spec.input_shape, self.spec.num_classes)
            lr: Any = self.s.learning_rate
            if self.s.lr_schedule == "cosine":
                from .data import steps_per_epoch

                total = self.epochs * steps_per_epoch(self.spec, self.state["batch_size"])
                lr = keras.optimizers.schedules.CosineDecay(self.s.learning_rate, decay_steps=max(total, 1))
            model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"], jit_compile=self.s.jit_compile,
                          steps_per_execution=self.s.steps_per_execution)
            return model

        if self.setup.strategy is not None:
            with self.setup.strategy.scope():
                self.model = make()
        else:
            self.model = make()
        log.info("model: %s, %d parameters, global batch %d%s", self.s.model, self.model.count_params(),
                 self.state["batch_size"],
                 f" ({self.state['batch_size'] // self.setup.replicas} per replica x {self.setup.replicas})"
                 if self.setup.replicas > 1 else "")

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> Result:
        from . import checkpoints
        from .data import val_dataset

        tb = TensorBoardWriter(self.run_dir / "tensorboard")
        val_ds = val_dataset(self.spec, self.s, self.state["batch_size"])
        status, ended = "completed", f"all {self.epochs} epochs trained"
        try:
            with self.stop.installed():
                while self.state["epoch"] < self.epochs:
                    epoch = self.state["epoch"]
                    if self.patience.exhausted(self.state):  # also right after a resume: the count was saved
                        ended = self.patience.reason(self.state)
                        log.info("%s", ended)
                        break
                    # A signal during validation or set-up stops here, before another step runs.
                    logs, seconds, steps_run = ({}, 0.0, 0) if self.stop.check() else self._train_epoch(epoch)
                    if self.stop.reason:
                        status, ended = self.stop.status, f"stopped ({self.stop.reason}): resumable"
                        self._save("stop requested: " + self.stop.reason)
                        log.info("saved a resumable state at epoch %d step %d; continue with --resume %s",
                                 epoch + 1, self.state["step"], self.run_dir.name)
                        break
                    val = self.model.evaluate(val_ds, verbose=0, return_dict=True)
                    logs.update({f"val_{k}": float(v) for k, v in val.items()})
                    self._check_finite(logs, epoch)
                    self._end_epoch(epoch, logs, seconds, steps_run, tb)
        finally:
            tb.close()
        record_ending(self.run_dir / "manifest.json", ended)
        final_sha = checkpoints.weights_sha256(self.model)
        result = Result(self.run_dir, status, self.state["epoch"], self.history, self.state.get("best"),
                        final_sha, None, self.model)
        if status == "completed":
            result = self._finish(result)
        return result

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float, int]:
        """Fit the rest of one epoch from the saved step; returns (train logs, seconds, steps run)."""
        from .data import steps_per_epoch, train_dataset

        batch = self.state["batch_size"]
        total = steps_per_epoch(self.spec, batch)
        start = self.state["step"]
        if start >= total:  # saved at the very last step: only validation is left
            return {}, 0.0, 0
        ds = train_dataset(self.spec, self.s, epoch=epoch, batch_size=batch, start_step=start)
        saver = _step_saver(self, start, total)
        log.info("epoch %d/%d%s", epoch + 1, self.epochs, f" (from step {start}/{total})" if start else "")
        t0 = time.perf_counter()
        try:
            history = self._fit(ds, saver)
        except Exception as exc:
            if type(exc).__name__ == "ResourceExhaustedError":
                return self._out_of_memory(epoch, exc)
            raise
        seconds = time.perf_counter() - t0
        logs = {k: float(v[-1]) for k, v in history.history.items()} if history.history else {}
        return logs, seconds, saver.steps_run

    def _fit(self, ds, saver):
        verbose = {"bar": 1, "line": 0}.get(self.s.progress, "auto")
        if verbose == "auto":
            import sys

            verbose = 1 if sys.stdout.isatty() else 0
        return self.model.fit(ds, epochs=1, verbose=verbose, callbacks=[saver], shuffle=False)

    def _out_of_memory(self, epoch: int, exc: Exception):
        remedies = ("lower BATCH_SIZE, use PRECISION=mixed_float16 or mixed_bfloat16, use a smaller IMAGE_SIZE, "
                    "or stop other processes on the GPU (python -m train check lists them)")
        if not self.s.auto_batch or self.state.get("batch_halvings", 0) >= MAX_BATCH_HALVINGS or self.state["batch_size"] < 2:
            raise OutOfMemoryError(f"the GPU ran out of memory at batch size {self.state['batch_size']}: {remedies}") from None
        from . import checkpoints

        old, halvings = self.state["batch_size"], self.state.get("batch_halvings", 0) + 1
        loaded = checkpoints.load_latest(self.run_dir / "checkpoints")  # at least the initial state
        checkpoints.restore(self.model, loaded)
        state = dict(loaded.meta)
        step = step_at_batch_size(state["step"], state.get("batch_size", old), old // 2)
        self.state = dict(state, batch_size=old // 2, step=step, batch_halvings=halvings)
        log.warning("WARNING: out of GPU memory at batch size %d; AUTO_BATCH: continuing from the last checkpoint "
                    "with batch size %d (%d/%d)", old, old // 2, self.state["batch_halvings"], MAX_BATCH_HALVINGS)
        return self._train_epoch(self.state["epoch"])

    def _check_finite(self, logs: dict[str, float], epoch: int) -> None:
        bad = [k for k in ("loss", "val_loss") if k in logs and not math.isfinite(logs[k])]
        if bad:
            raise DivergedError(
                f"{bad[0]} is {logs[bad[0]]} in epoch {epoch + 1}: training diverged; the last good checkpoint "
                f"is kept in {self.run_dir / 'checkpoints'}. Lower LEARNING_RATE (now {self.s.learning_rate}), "
                "check the data for NaN values, or try PRECISION=float32"
            )

    def _end_epoch(self, epoch, logs, seconds, steps_run, tb) -> None:
        import keras

        used, peak = gpu_memory()
        batch = self.state["batch_size"]
        lr = self.model.optimizer.learning_rate
        row = dict(logs, epoch=epoch + 1, learning_rate=float(keras.ops.convert_to_numpy(lr)), batch_size=batch,
                   epoch_seconds=round(seconds, 3), samples_per_second=(steps_run * batch / seconds) if seconds else None,
                   gpu_memory_used_mb=used, gpu_memory_peak_mb=peak)
        self.metrics.append(row)
        self.history.append(row)
        tb.write(epoch, {k: v for k, v in row.items() if k != "epoch"})
        value = logs.get(self.s.monitor)
        if _improved(value, self.state.get("best"), self.mode):
            from .rundir import atomic_write

            self.state["best"] = value
            atomic_write(self.run_dir / "best.weights.h5", self.model.save_weights, size_hint=_weights_bytes(self.model))
        self.patience.update(self.state, value)  # before the save: the count survives a stop
        self.state.update(epoch=epoch + 1, step=0)
        self._save("epoch end")
        log.info("epoch %d/%d: %s  %.1fs  %.0f samples/s%s", epoch + 1, self.epochs,
                 "  ".join(f"{k}={logs[k]:.4f}" for k in sorted(logs)), seconds,
                 row["samples_per_second"] or 0.0, "  (best)" if self.state["best"] == value else "")
        from .report import refresh_after_epoch  # curves for whoever watches the volume; never raises
        refresh_after_epoch(self.run_dir, self.s.report)

    def _save(self, why: str) -> None:
        from . import checkpoints

        path = checkpoints.save_state(self.run_dir / "checkpoints", self.model, self.state, self.s.keep_checkpoints)
        log.debug("checkpoint %s (%s)", path.name, why)

    def _finish(self, result: Result) -> Result:
        from .rundir import atomic_write

        atomic_write(self.run_dir / "final.weights.h5", self.model.save_weights, size_hint=_weights_bytes(self.model))
        update_manifest(self.run_dir / "manifest.json", final_weights_sha256=result.final_weights_sha256,
                        best={"monitor": self.s.monitor, "value": self.state.get("best")},
                        final_metrics=self.history[-1] if self.history else None,
                        epochs_completed=self.state["epoch"])
        if self.s.export:
            from .export import export_run

            result.export = export_run(self.run_dir, model=self.model)
        return result


def _weights_bytes(model) -> int:
    """What a .weights.h5 of the model needs on disk, with room for HDF5's own metadata."""
    return sum(int(v.numpy().nbytes) for v in model.variables) + (1 << 20)


def _step_saver(loop: EpochLoop, start: int, total: int):
    """Keras callback: a resumable state every CHECKPOINT_EVERY steps, and a clean stop on request."""
    import keras

    base = loop.state["global_step"]

    class StepSaver(keras.callbacks.Callback):
        steps_run = 0

        def on_train_batch_end(self, batch, logs=None):
            # With STEPS_PER_EXECUTION > 1 Keras calls this once per execution, with the last step's index.
            self.steps_run = batch + 1
            loop.state.update(step=start + batch + 1, global_step=base + batch + 1)
            if loop.stop.check():
                self.model.stop_training = True
                return
            every = loop.s.checkpoint_every
            if every and loop.state["global_step"] % every == 0 and loop.state["step"] < total:
                loop._save(f"every {every} steps")

    return StepSaver()
