"""The epoch loop: the project's own compiled steps (train.training.steps), resumable at any saved step.

It owns the model, the datasets, metrics.csv, TensorBoard, the best weights, the resumable states
and the stop flag. Each epoch's data order is a pure function of (SEED, epoch), so re-entering an
epoch at a saved step sees exactly the batches an uninterrupted run would. The same code runs with
no strategy, MirroredStrategy and MultiWorkerMirroredStrategy; with several processes only the
chief (`chief=True`) writes anything, and a stop asked of any process stops all of them at the
same step (the stop vote travels with each step's all-reduce).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import DivergedError, OutOfMemoryError, ResumeMismatchError
from ..inputs.pipeline import steps_per_epoch
from ..models import entry, monitors
from ..run import checkpoints
from ..run.manifest import record_unfinished_epoch, update_manifest
from ..run.metrics_files import MetricsFile, TensorBoardWriter, metric_columns, metric_text, read_back
from ..run.rundir import RunDir
from ..run.train_log import end_progress_line, on_the_console, progress_line
from ..run.weights import save_weights
from . import flops, profiling
from .callbacks import Callbacks
from .early_stopping import Patience, record_ending
from .flops import FlopCount, Peak, mfu
from .stop_flag import TRAINING, StopFlag

log = logging.getLogger("train")
MAX_BATCH_HALVINGS = 3


@dataclass
class LoopState:
    """Where training stands; saved in every checkpoint's header. `batch_size` is the one source
    of the global batch size in use (AUTO_BATCH may have halved BATCH_SIZE)."""

    epoch: int = 0  # epochs completed
    step: int = 0  # steps done in the current epoch, in batches of `batch_size`
    global_step: int = 0
    best: float | None = None
    batch_size: int = 0
    batch_halvings: int = 0
    workers: int = 1  # processes that trained the latest steps (a resume may use another count)
    patience_reference: float | None = None  # early stopping: the last value that counted as an improvement
    patience_wait: int = 0  # early stopping: epochs since

    @classmethod
    def from_meta(cls, meta: dict[str, Any], default_batch: int) -> LoopState:
        """From a checkpoint header (which also lists variables): known keys only."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in meta.items() if k in known}
        values.setdefault("batch_size", default_batch)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Result:
    run_dir: Path | None
    status: str  # completed | interrupted | budget
    epochs_completed: int
    history: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    final_weights_sha256: str | None = None
    export: dict[str, Any] | None = None
    model: Any = field(default=None, repr=False)


def monitor_mode(settings: Settings) -> str:
    if settings.monitor_mode != "auto":
        return settings.monitor_mode
    return "min" if "loss" in settings.monitor else "max"


def _improved(value: float | None, best: float | None, mode: str) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return best is None or (value > best if mode == "max" else value < best)


def step_at_batch_size(step: int, saved_batch: int, new_batch: int) -> int:
    """Where a state saved at `step` (batches of `saved_batch`) stands in batches of `new_batch`.

    The example order does not depend on the batch size, so the position carries over in examples.
    """
    return step * saved_batch // new_batch


def at_new_batch_size(saved: LoopState, new_batch: int) -> LoopState:
    """A resume with another BATCH_SIZE (--force): the state continued in batches of `new_batch`.

    The new value is what config.json says and what trains; the position carries over in examples
    (rounded down to a whole batch: at most new_batch - 1 examples of that epoch are seen twice).
    AUTO_BATCH counts its halvings from the new value again.
    """
    if saved.batch_size == new_batch:
        return saved
    step = step_at_batch_size(saved.step, saved.batch_size, new_batch)
    return dataclasses.replace(saved, batch_size=new_batch, step=step, batch_halvings=0)


def position_after_halving(saved: LoopState, old_batch: int, halvings: int) -> LoopState:
    """AUTO_BATCH: the state to continue from with half the batch, from the last saved state
    (whose step counts batches of its own batch size)."""
    return dataclasses.replace(at_new_batch_size(saved, old_batch // 2), batch_halvings=halvings)


def steps_until(n_left: int, per_execution: int, global_step: int, every: int) -> int:
    """Steps for the next compiled call: at most STEPS_PER_EXECUTION, never past the epoch's end,
    and ending on a CHECKPOINT_EVERY boundary so a checkpoint falls where it is due."""
    n = min(per_execution, n_left)
    if every:
        n = min(n, every - global_step % every)
    return max(n, 1)


def batch_text(batch: int, replicas: int) -> str:
    """The global batch as the log gives it, with each replica's share when there are several."""
    return f"{batch} ({batch // replicas} per replica x {replicas})" if replicas > 1 else str(batch)


def log_distribution(setup, state: LoopState) -> None:
    log.info(
        "distribution: %d worker(s), this is worker %d, %d replica(s) in sync, global batch %d, %d per replica",
        setup.workers,
        setup.worker_index,
        setup.replicas,
        state.batch_size,
        state.batch_size // setup.replicas,
    )


def progress_verbose(progress: str, isatty: bool) -> int:
    """1: the Keras progress bar; 0: one line per epoch."""
    return {"bar": 1, "line": 0}.get(progress, 1 if isatty else 0)


def check_finite(logs: dict[str, float], epoch: int, checkpoints_dir: Path | None, learning_rate: float) -> None:
    """DivergedError when an epoch's training or validation loss is NaN or infinite (`epoch` from 0;
    `checkpoints_dir` None: a worker, whose chief keeps the checkpoints)."""
    bad = [k for k in ("loss", "val_loss") if k in logs and not math.isfinite(logs[k])]
    if bad:
        raise DivergedError(
            f"{bad[0]} is {logs[bad[0]]} in epoch {epoch + 1}: training diverged; the last good checkpoint "
            f"is kept in {checkpoints_dir or 'the chief run directory'}. "
            f"Lower LEARNING_RATE (now {learning_rate}), check the data for NaN values, or try PRECISION=float32"
        )


def check_room_to_halve(auto_batch: bool, state: LoopState, workers: int) -> None:
    """OutOfMemoryError naming the remedies, unless AUTO_BATCH may halve the batch once more."""
    remedies = (
        "lower BATCH_SIZE, use PRECISION=mixed_float16 or mixed_bfloat16, use a smaller IMAGE_SIZE, "
        "or stop other processes on the GPU (python -m train check lists them)"
    )
    # With several workers a halving on one would split the group: the error stops it instead.
    if not auto_batch or state.batch_halvings >= MAX_BATCH_HALVINGS or state.batch_size < 2 or workers > 1:
        raise OutOfMemoryError(f"the GPU ran out of memory at batch size {state.batch_size}: {remedies}") from None


class EpochLoop:
    """The epoch loop and what it owns: model, datasets, metrics, checkpoints, stop flag."""

    def __init__(
        self,
        settings,
        run_dir,
        spec,
        setup,
        state: LoopState,
        epochs,
        stop: StopFlag,
        *,
        chief: bool,  # said by every caller: a worker that takes itself for the chief writes over the run
    ):
        self.s, self.run_dir, self.spec, self.setup, self.state = settings, run_dir, spec, setup, state
        self.epochs, self.chief, self.stop = epochs, chief, stop
        self.files = RunDir(run_dir) if run_dir is not None else None  # None: a worker that writes nothing
        self.mode = monitor_mode(settings)
        self.task = entry(settings.model)  # the model's loss and metrics
        self.patience = Patience(settings.patience, settings.min_delta, self.mode, settings.monitor)
        names = tuple(self.task.metrics)
        self.metrics = MetricsFile(self.files.metrics, metric_columns(names)) if chief else None
        self.history: list[dict[str, Any]] = []
        if self.metrics:
            self.metrics.truncate_from(state.epoch + 1)
            self.history = [read_back(r) for r in self.metrics.rows]  # numbers, as this run's own rows
        self.callbacks = Callbacks()  # told each finished epoch (train.training.callbacks); the chief's, set by train
        self.schedule = None  # a schedules.OverTraining when the rate moves (cosine, warm-up), set by build_model
        self.flop_count, self.peak = FlopCount(0), Peak(None, "not measured")  # set by build_model
        self._peak_place, self._peak_raised = None, False  # where the peak was measured; beaten once already
        self._saved_trained = False  # the manifest says a state with trained steps was saved (see _save)
        self.profiler = profiling.for_run(settings, self.files.tensorboard if chief else None)

    @property
    def strategy(self):
        import tensorflow as tf

        return self.setup.strategy or tf.distribute.get_strategy()

    # -- construction -------------------------------------------------------------------------
    def build_model(self, models) -> None:
        from .schedules import OverTraining, needs_schedule
        from .steps import Steps

        self._models = models  # the test split is evaluated with a plain copy built from the same factory
        lr: Any = self.s.learning_rate
        if needs_schedule(self.s.lr_schedule, self.s.lr_warmup_epochs):  # outside the strategy's scope: see schedules
            per_epoch = steps_per_epoch(self.spec, self.state.batch_size)
            lr = self.schedule = OverTraining(
                self.s.learning_rate, self.epochs, per_epoch, self.s.lr_schedule, self.s.lr_warmup_epochs
            )
        with self.strategy.scope():
            model = models.build_model(self.s.model, self.spec.input_shape, self.spec.num_classes)
            # compile() only attaches the optimizer (wrapped in a LossScaleOptimizer under
            # mixed_float16), the loss and the metrics for export; training runs train.training.steps.
            optimizer = self.task.optimizer(lr, self.s)
            loss = self.task.loss(reduction="sum_over_batch_size")  # loss(reduction), as docs/extending.md has it
            model.compile(optimizer=optimizer, loss=loss, metrics=self.task.compiled_metrics())
        self.model = model
        self.steps = Steps(model, self.setup.strategy, jit_compile=self.s.jit_compile, task=self.task)
        replicas = self.strategy.num_replicas_in_sync
        log.info(
            "model: %s, %d parameters, global batch %s",
            self.s.model,
            model.count_params(),
            batch_text(self.state.batch_size, replicas),
        )
        if self.state.batch_size > self.spec.n_train and not self.s.smoke:  # SMOKE's subset is its own
            log.warning(
                "WARNING: BATCH_SIZE=%d is larger than the %d training examples: an epoch is one step of %d; "
                "give a BATCH_SIZE of at most %d",
                self.state.batch_size,
                self.spec.n_train,
                self.spec.n_train,
                self.spec.n_train,
            )
        self._measure_limits(replicas)

    def _measure_limits(self, replicas: int) -> None:
        """The model's FLOPs per example and the devices' peak, for the MFU of every epoch (never fatal)."""
        self.flop_count = flops.count_flops(self.model)
        if not self.chief:
            return  # only the chief records MFU: the probe would hold the other workers up for nothing
        import tensorflow as tf

        tf32 = bool(self.setup.gpus) and tf.config.experimental.tensor_float_32_execution_enabled()
        dtype = flops.compute_dtype(self.setup.precision, tf32)
        where = self.setup.gpus[0] if self.setup.gpus else "CPU"
        cache = flops.machine_cache(self.s.runs_dir)  # one measurement per machine, shared by the runs
        self.peak = flops.peak_for(self.s.peak_flops, cache, where, dtype, replicas)
        self._peak_place = (replicas, cache, where, dtype)  # where a peak that a run beats is measured again
        uncounted = ", ".join(self.flop_count.uncounted_layers) or "none"
        log.info(
            "cost: %.1f MFLOP per training example (layers not counted: %s); peak %.1f GFLOP/s (%s)",
            self.flop_count.train_per_example / 1e6,
            uncounted,
            (self.peak.flops or 0) / 1e9,
            "; ".join(filter(None, (self.peak.source, self.peak.origin))),
        )

    # -- data ---------------------------------------------------------------------------------
    def _distributed(self, which: str, epoch: int, batch: int, start: int = 0):
        from ..inputs.pipeline import replica_dataset

        strategy, replicas = self.strategy, self.strategy.num_replicas_in_sync

        def per_process(ctx):
            local = replicas // ctx.num_input_pipelines
            return replica_dataset(
                self.spec,
                self.s,
                which,
                epoch,
                batch,
                start,
                replicas=replicas,
                first_replica=ctx.input_pipeline_id * local,
                local_replicas=local,
            )

        return strategy.distribute_datasets_from_function(per_process)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> Result:
        if self.chief:  # here, not at build time: a resume that fails its checks must not touch the record
            update_manifest(self.files.manifest, flops=self.flop_count.to_dict(), peak=self.peak.to_dict())
        tb = TensorBoardWriter(self.files.tensorboard) if self.chief else None
        status, ended = "completed", f"all {self.epochs} epoch{'s' if self.epochs != 1 else ''} trained"
        self._align_schedule()  # the optimizer's step is the restored one by now
        try:
            with self.stop.installed():
                self.stop.then = TRAINING  # start-up's "before training starts" no longer holds
                while self.state.epoch < self.epochs:
                    epoch = self.state.epoch
                    # Also right after a resume: the count was saved. Every worker sees the same
                    # (all-reduced) metrics, so all of them stop at the same epoch.
                    if self.patience.exhausted(self.state):
                        ended = self.patience.reason(self.state)
                        log.info("%s", ended)
                        break
                    logs, seconds, steps_run = self._train_epoch(epoch)
                    if self.stop.reason:
                        status, ended = self.stop.status, f"stopped ({self.stop.reason}): resumable"
                        self._save("stop requested: " + self.stop.reason)
                        if self.chief:
                            record_unfinished_epoch(self.files.manifest, epoch + 1, seconds)
                        # The chief's run ends with the command that continues it (train.training.fit).
                        where = "" if self.chief else "; the chief saved it"
                        log.info("saved a resumable state at epoch %d step %d%s", epoch + 1, self.state.step, where)
                        break
                    logs.update(self._validate())
                    check_finite(logs, epoch, self.files.checkpoints if self.files else None, self.s.learning_rate)
                    self._end_epoch(epoch, self._epoch_row(epoch, logs, seconds, steps_run), logs, tb)
                    ending = self.callbacks.epoch_end(epoch + 1, self.history[-1], self.state)
                    if ending:
                        status, ended = ending
                        log.info("%s", ended)
                        break
        finally:
            self.profiler.close()  # a run that ends inside the range keeps the steps traced so far
            if tb:
                tb.close()
        self.profiler.report_missing()
        if self.chief:
            record_ending(self.files.manifest, ended)
            self._write_hparams()
        final_sha = checkpoints.weights_sha256(self.model)
        result = Result(
            self.run_dir, status, self.state.epoch, self.history, self.state.best, final_sha, None, self.model
        )
        if status == "completed" and self.chief:
            # A stop from here on has no call of steps to finish and nothing to save: what is left runs.
            self.stop.then = f"training is over; {_what_is_left(self.s)} still finish"
            result = self._finish(result)
        if self.setup.group is not None:  # several workers (train.workers)
            # The others wait here for the chief's final weights and export, so no worker leaves
            # while the chief still counts on it (the coordination service would report it lost).
            self.setup.group.wait_for_chief()
        return result

    def _train_epoch(self, epoch: int) -> tuple[dict[str, float], float, int]:
        """Train the rest of one epoch from the saved step; returns (train logs, seconds, steps run)."""
        batch = self.state.batch_size
        total = steps_per_epoch(self.spec, batch)
        start = self._epoch_from_step = self.state.step  # after a resume mid-epoch: the epoch line says so
        self._epoch_steps = total
        if start >= total:  # saved at the very last step: only validation is left
            return {}, 0.0, 0
        ds = self._distributed("train", epoch, batch, start)
        saver = StepSaver(self, total)
        log.info("epoch %d/%d%s", epoch + 1, self.epochs, f" (from step {start}/{total})" if start else "")
        t0 = time.perf_counter()
        try:
            logs = self._fit(ds, saver)
        except Exception as exc:
            if type(exc).__name__ == "ResourceExhaustedError":
                return self._out_of_memory()
            raise
        return logs, time.perf_counter() - t0, saver.steps_run

    def _fit(self, ds, saver: StepSaver) -> dict[str, float]:
        """Run the compiled train step over `ds` until the epoch ends or a stop is agreed."""
        import keras
        import tensorflow as tf

        from .steps import Totals

        verbose = progress_verbose(self.s.progress, sys.stdout.isatty()) if self.chief else 0
        # The values passed are running means already: stateful, so the bar shows them as they are.
        names = tuple(self.task.metrics)
        bar = keras.utils.Progbar(saver.total, stateful_metrics=["loss", *names]) if verbose else None
        totals, iterator = Totals(names), iter(ds)
        try:
            while self.state.step < saver.total:
                n = self.profiler.clip(
                    steps_until(
                        saver.total - self.state.step,
                        self.s.steps_per_execution,
                        self.state.global_step,
                        self.s.checkpoint_every,
                    )
                )
                asked = self.stop.check()
                if asked and self.setup.workers == 1:
                    break  # no other worker to tell: stop before another step runs
                self.profiler.before(n)
                out = self.steps.train(iterator, tf.constant(n), tf.constant(1.0 if asked else 0.0)).numpy()
                self.profiler.after(n)
                totals.add(out)
                stopping = out[-1] > 0  # the stop votes
                if stopping and self.stop.reason is None:
                    self.stop.request("another worker was asked to stop")
                saver.after(n, stopping)
                if bar:
                    with on_the_console():
                        bar.update(self.state.step, list(totals.logs().items()))
                        # The bar ends its line only at the epoch's last step: until then a log line
                        # (a stop's, an error's) must start a line of its own.
                        progress_line(self.state.step < saver.total)
                if stopping:
                    break
        finally:
            end_progress_line()
        return totals.logs()

    def _validate(self) -> dict[str, float]:
        import tensorflow as tf

        from .steps import Totals

        batch = self.state.batch_size
        totals = Totals(tuple(self.task.metrics))
        totals.add(
            self.steps.evaluate(
                iter(self._distributed("val", 0, batch)), tf.constant(math.ceil(self.spec.n_val / batch))
            ).numpy()
        )
        return totals.logs("val_")

    def _out_of_memory(self):
        """ResourceExhaustedError in a step: halve the batch from the last checkpoint (AUTO_BATCH), or fail."""
        state = self.state
        check_room_to_halve(self.s.auto_batch, state, self.setup.workers)
        old = state.batch_size
        loaded = checkpoints.load_latest(self.files.checkpoints)  # at least the initial state
        checkpoints.restore(self.model, loaded)
        saved = LoopState.from_meta(loaded.meta, old)  # a header without batch_size (older versions): the batch in use
        self.state = position_after_halving(saved, old, state.batch_halvings + 1)
        self._align_schedule()
        log.warning(
            "WARNING: out of GPU memory at batch size %d; AUTO_BATCH: continuing from the last checkpoint "
            "with batch size %d (%d/%d)",
            old,
            self.state.batch_size,
            self.state.batch_halvings,
            MAX_BATCH_HALVINGS,
        )
        return self._train_epoch(self.state.epoch)

    def _align_schedule(self) -> None:
        """Tell a decaying learning rate where training stands, in epochs of the batch size now in
        use: at every start (a resume may bring another BATCH_SIZE) and after AUTO_BATCH halves it."""
        if self.schedule is None:
            return
        iteration = int(self.model.optimizer.iterations.numpy())
        per_epoch = steps_per_epoch(self.spec, self.state.batch_size)
        self.schedule.begin(self.state.epoch, self.state.step, per_epoch, iteration)

    def _epoch_row(self, epoch: int, logs: dict[str, float], seconds: float, steps_run: int) -> dict[str, Any]:
        """The epoch's row of metrics.csv: its metrics, then the rate, the learning rate and the devices."""
        import keras

        from ..setup.devices import gpu_memory

        used, peak = gpu_memory()
        batch = self.state.batch_size
        # The examples those steps trained: the epoch's last batch holds only what is left of the data
        # (a data set of 81 at batch 512 is one step of 81, not of 512).
        start = self._epoch_from_step * batch
        examples = min(self.spec.n_train, start + steps_run * batch) - start
        speed = (examples / seconds) if seconds else None
        achieved, fraction = mfu(speed, self.flop_count, self.peak.flops)
        if fraction is not None and fraction > 1 and (raised := self._raise_peak(achieved)):
            achieved, fraction = mfu(speed, self.flop_count, raised.flops)
        return dict(
            logs,
            epoch=epoch + 1,
            learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
            batch_size=batch,
            epoch_seconds=round(seconds, 3),
            samples_per_second=speed,
            model_flops_per_second=achieved,
            mfu=fraction,
            gpu_memory_used_mb=used,
            gpu_memory_peak_mb=peak,
        )

    def _end_epoch(self, epoch: int, row: dict[str, Any], logs: dict[str, float], tb) -> None:
        """What an epoch's row leads to: the files, the best weights, the patience count, the state saved."""
        if self.metrics:
            self.metrics.append(row)
        self.history.append(row)
        if tb:
            tb.write(epoch, {k: v for k, v in row.items() if k != "epoch"})
        value = logs.get(self.s.monitor)
        improved = _improved(value, self.state.best, self.mode)  # a tie is no improvement: not "(best)"
        if improved:
            self.state.best = value
            if self.chief:
                save_weights(self.model, self.files.best_weights, epoch + 1, size_hint=_weights_bytes(self.model))
        self.patience.update(self.state, value)  # before the save: the count survives a stop
        self.state.epoch, self.state.step = epoch + 1, 0
        self._save("epoch end")
        achieved, fraction = row["model_flops_per_second"], row["mfu"]
        log.info(
            "epoch %d/%d: %s  %.1fs  %.0f samples/s%s%s%s",
            epoch + 1,
            self.epochs,
            epoch_metrics(logs),
            row["epoch_seconds"],
            row["samples_per_second"] or 0.0,
            f"  {achieved / 1e9:.1f} GFLOP/s = MFU {fraction:.1%}" if fraction is not None else "",
            "  (best)" if improved else "",
            self._resumed_part(),
        )

    def _resumed_part(self) -> str:
        """After a resume mid-epoch, what the epoch's training numbers cover (the validation is whole)."""
        start, total = self._epoch_from_step, self._epoch_steps
        if not start:
            return ""
        if start >= total:
            return "  (resumed after the epoch's last step: validation only)"
        return f"  (resumed mid-epoch: loss, train metrics and speed over steps {start + 1}-{total} only)"

    def _raise_peak(self, achieved: float):
        """A measured peak this epoch beat was measured under load: measure it again, and say so once."""
        if self._peak_place is None:
            return None
        raised = flops.beaten_peak(self.peak, achieved, *self._peak_place, probe=not self._peak_raised)
        if raised is None:
            return None
        if not self._peak_raised:
            log.warning(
                "WARNING: this epoch ran at %.1f GFLOP/s, more than the peak it was divided by (%.1f GFLOP/s, %s): "
                "that peak was measured while the machine was busy; measured again, the peak is now %.1f GFLOP/s",
                achieved / 1e9,
                self.peak.flops / 1e9,
                self.peak.origin or self.peak.source,
                raised.flops / 1e9,
            )
        self.peak, self._peak_raised = raised, True
        update_manifest(self.files.manifest, peak=self.peak.to_dict())  # only the chief measures a peak
        return raised

    def _write_hparams(self) -> None:
        """Settings and final metrics for TensorBoard's HParams view; a failure only warns."""
        from ..run.metrics_files import write_hparams

        final = {k: v for k, v in (self.history[-1] if self.history else {}).items() if k in monitors(self.s.model)}
        try:
            write_hparams(
                self.files.tensorboard,
                self.s.to_dict(),
                {**final, f"best_{self.s.monitor}": self.state.best},
                self.state.epoch,
            )
        except Exception as exc:  # a dashboard must never cost a run
            log.warning("WARNING: TensorBoard HParams not written: %s: %s", type(exc).__name__, exc)

    def _save(self, why: str) -> None:
        if not self.chief:
            return
        path = checkpoints.save_state(self.files.checkpoints, self.model, self.state.to_dict(), self.s.keep_checkpoints)
        log.debug("checkpoint %s (%s)", path.name, why)
        if self.state.global_step > 0 and not self._saved_trained and self.files.manifest.is_file():
            # Once per process: a state holding trained steps exists, so a resume that finds the
            # checkpoints gone refuses (train.run.resume) rather than train the run again from step 0.
            update_manifest(self.files.manifest, trained_state_saved=True)
            self._saved_trained = True

    def _finish(self, result: Result) -> Result:
        save_weights(self.model, self.files.final_weights, self.state.epoch, size_hint=_weights_bytes(self.model))
        update_manifest(
            self.files.manifest,
            final_weights_sha256=result.final_weights_sha256,
            best={"monitor": self.s.monitor, "value": self.state.best},
            final_metrics=self.history[-1] if self.history else None,
            epochs_completed=self.state.epoch,
        )
        self._evaluate_test()
        self.callbacks.complete(result)  # the export among them
        return result

    def _evaluate_test(self) -> None:
        """The test split, once, through the best and the final weights: the chief alone, with a
        plain float32 copy of the model (no collective: the other workers wait for the chief as it is)."""
        from .test_split import evaluate_test, final_test_line

        # One device's share of the batch training last ran (AUTO_BATCH may have halved it): a float32
        # copy on one device at the whole BATCH_SIZE could run out of the memory training fitted in.
        batch = max(1, self.state.batch_size // self.strategy.num_replicas_in_sync)
        test = evaluate_test(self.run_dir, self.s, self.spec, self._models, batch)
        if test is None:
            return
        log.info("%s", final_test_line(test))
        update_manifest(self.files.manifest, test=test)


def _what_is_left(s: Settings) -> str:
    """What a completed training still writes: the final weights, the test split, the export."""
    return "the final weights, the test split and the export" if s.export else "the final weights and the test split"


def _nothing_to_train(s: Settings, trained: int, epochs: int) -> str:
    """What a completed run resumed as it was says: what is done again, and how to train it further."""
    done = f"all {epochs} epoch(s)" if trained == epochs else f"{trained} epochs, more than EPOCHS={epochs},"
    again = _what_is_left(s)
    return (
        f"{done} are trained already: nothing to train; {again} are done again (to train more, {_how_to_train_more(s)})"
    )


def _how_to_train_more(s: Settings) -> str:
    """What trains a completed run further: a resume with a larger EPOCHS where nothing else changes."""
    if s.smoke:
        return "start a run without SMOKE: a smoke run trains one epoch"
    if s.lr_schedule != "constant":  # its decay spans EPOCHS: a larger one changes the rates to come
        return (
            f"start a new run with a larger EPOCHS: LR_SCHEDULE={s.lr_schedule} decays over EPOCHS, so a resume with "
            "a larger one needs --force (force=True in train()) and trains on at rates no run started with it had"
        )
    return "resume with a larger EPOCHS"


def start_loop(
    settings: Settings,
    run_dir: Path | None,
    spec,
    setup,
    state: LoopState,
    epochs: int,
    stop: StopFlag,
    *,
    chief: bool,
    models,
    loaded=None,
    resumed: bool | None = None,
    record: Callable[[bool], None] | None = None,
) -> EpochLoop:
    """The loop with its model built and its starting weights in place, as a run trains it.

    A resume restores `loaded`, the chief's newest state; with several workers the chief's
    variables then reach every worker (a worker has no `loaded` and says `resumed=True`).
    Otherwise the initial weights are saved as the first state. `record(trains)` runs in between: every check has passed and
    nothing of the run is written yet, so a failed restore leaves the run's record as it was; `trains` is
    False when the run has nothing left to train (every epoch done, or early stopping reached).
    """
    resumed = loaded is not None if resumed is None else resumed
    if state.epoch >= epochs and state.step:  # its weights have moved past the end of the last epoch EPOCHS keeps
        raise ResumeMismatchError(
            f"EPOCHS={epochs}: this run stopped inside its epoch {state.epoch + 1} (after {state.step} of its steps), "
            f"so ending it at epoch {epochs} would keep weights of no epoch's end; resume with EPOCHS="
            f"{state.epoch + 1} or more to finish that epoch, or start a new run instead (no --resume, resume=None in "
            "train(); RESUME= empty where RESUME=auto chose this run)"
        )
    loop = EpochLoop(settings, run_dir, spec, setup, state, epochs, stop, chief=chief)
    loop.build_model(models)
    if resumed:
        with loop.strategy.scope():  # optimizer slots must be created where the model's variables live
            if loaded is not None:
                checkpoints.restore(loop.model, loaded)
            else:
                loop.model.optimizer.build(loop.model.trainable_variables)
            if setup.group is not None:
                setup.group.share_variables([*loop.model.variables, *loop.model.optimizer.variables])
        log.info("resuming at epoch %d, step %d (global step %d)", state.epoch + 1, state.step, state.global_step)
        if state.epoch >= epochs:  # a completed run resumed as it was: say so, rather than train nothing in silence
            log.info("%s", _nothing_to_train(settings, state.epoch, epochs))
    if record is not None:
        record(loop.state.epoch < epochs and not loop.patience.exhausted(loop.state))
    if not resumed:
        # The initial weights as a state: a run killed before its first interval resumes from
        # exactly these, and AUTO_BATCH always has a state to go back to (a worker only builds).
        with loop.strategy.scope():
            loop.model.optimizer.build(loop.model.trainable_variables)
            loop._save("initial state")
    return loop


def _weights_bytes(model) -> int:
    """What a .weights.h5 of the model needs on disk, with room for HDF5's own metadata."""
    return sum(int(v.numpy().nbytes) for v in model.variables) + (1 << 20)


class StepSaver:
    """After each compiled call: advance the state, and save a resumable state every CHECKPOINT_EVERY steps."""

    def __init__(self, loop: EpochLoop, total: int):
        self.loop, self.total = loop, total
        self.steps_run = 0

    def after(self, n: int, stopping: bool) -> None:
        state = self.loop.state
        self.steps_run += n
        state.step += n
        state.global_step += n
        if stopping:  # the loop saves once it has left the epoch
            return
        every = self.loop.s.checkpoint_every
        if every and state.global_step % every == 0 and state.step < self.total:
            self.loop._save(f"every {every} steps")


def epoch_metrics(logs: dict[str, float]) -> str:
    """An epoch's metrics in its log line, with the digits compare and the report read back from metrics.csv."""
    return "  ".join(f"{k}={metric_text(logs[k])}" for k in sorted(logs))
