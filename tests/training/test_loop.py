"""loop: the pure decisions of the epoch loop (monitor mode, improvement, divergence, OOM, AUTO_BATCH position,
steps per compiled call, progress mode, the typed state), and the loop
itself on a one-layer model and a few hundred generated examples (about a second per test): a stop
saves the step reached, a resumed epoch starts at its saved step, the best weights are the best epoch's,
an out-of-memory step continues from the last checkpoint with half the batch, early stopping, what a
run leaves behind (metrics.csv, TensorBoard, HParams, the manifest, final weights, the log), and what a
worker that is not the chief does (the same steps, nothing written). Faults are injected in-process
(a step that raises ResourceExhaustedError, a stop vote, a full disk, a fixed clock).

Training itself is covered end to end by training/test_fit.py and test_reliability.py.
"""

from __future__ import annotations

import dataclasses
import math
import types
from pathlib import Path

import numpy as np
import pytest

from train.errors import DivergedError, OutOfMemoryError
from train.training.callbacks import Callbacks
from train.training.loop import (
    EpochLoop,
    LoopState,
    _improved,
    at_new_batch_size,
    batch_text,
    check_finite,
    check_room_to_halve,
    monitor_mode,
    position_after_halving,
    progress_verbose,
    start_loop,
    step_at_batch_size,
    steps_until,
)


def _settings(**kw):
    base = {"monitor": "val_accuracy", "monitor_mode": "auto", "learning_rate": 1e-3, "auto_batch": False}
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "monitor, mode, expected",
    [
        ("val_accuracy", "auto", "max"),
        ("accuracy", "auto", "max"),
        ("val_loss", "auto", "min"),
        ("loss", "auto", "min"),
        ("val_loss", "max", "max"),
        ("val_accuracy", "min", "min"),
    ],
)
def test_monitor_mode(monitor, mode, expected):
    assert monitor_mode(_settings(monitor=monitor, monitor_mode=mode)) == expected


def test_improved():
    assert _improved(0.5, None, "max") and _improved(0.6, 0.5, "max") and not _improved(0.5, 0.5, "max")
    assert _improved(0.4, 0.5, "min") and not _improved(0.6, 0.5, "min") and not _improved(0.5, 0.5, "min")
    assert not _improved(None, None, "max")
    assert not _improved(math.nan, None, "max") and not _improved(math.inf, 1.0, "max")


def _loop(**settings):
    from train.run.rundir import RunDir

    return types.SimpleNamespace(
        s=_settings(**settings),
        run_dir=Path("/runs/r1"),
        files=RunDir(Path("/runs/r1")),
        setup=types.SimpleNamespace(workers=1),
        state=LoopState(batch_size=64, epoch=1, step=3),
    )


@pytest.mark.parametrize(
    "key, value, chief, where",
    [
        ("loss", math.nan, True, "/runs/r1/checkpoints"),
        ("val_loss", math.inf, True, "/runs/r1/checkpoints"),
        ("val_loss", -math.inf, False, "the chief run directory"),  # a worker has no run directory of its own
    ],
)
def test_non_finite_loss_is_diverged_naming_what_to_change(key, value, chief, where):
    checkpoints_dir = Path("/runs/r1/checkpoints") if chief else None
    with pytest.raises(DivergedError) as info:
        check_finite({"loss": 0.1, "val_loss": 0.2, key: value}, 1, checkpoints_dir, learning_rate=1e-3)
    assert str(info.value) == (
        f"{key} is {value} in epoch 2: training diverged; the last good checkpoint is kept in {where}. "
        "Lower LEARNING_RATE (now 0.001), check the data for NaN values, or try PRECISION=float32"
    )


def test_a_missing_loss_is_no_divergence():
    """An epoch with only validation left has no training loss; a worker may lack neither."""
    check_finite({"val_loss": 0.2}, 0, Path("/runs/r1/checkpoints"), 1e-3)
    check_finite({"loss": 0.2}, 0, Path("/runs/r1/checkpoints"), 1e-3)


def test_finite_losses_pass():
    check_finite({"loss": 0.1, "val_loss": 0.2, "accuracy": math.nan}, 0, Path("/runs/r1/checkpoints"), 1e-3)


@pytest.mark.parametrize("auto_batch, state", [(False, {}), (True, {"batch_halvings": 3}), (True, {"batch_size": 1})])
def test_out_of_memory_without_room_to_halve_names_the_remedies(auto_batch, state):
    state = dataclasses.replace(LoopState(batch_size=64, epoch=1, step=3), **state)
    with pytest.raises(OutOfMemoryError) as info:
        check_room_to_halve(auto_batch, state, workers=1)
    assert str(info.value) == (
        f"the GPU ran out of memory at batch size {state.batch_size}: lower BATCH_SIZE, use "
        "PRECISION=mixed_float16 or mixed_bfloat16, use a smaller IMAGE_SIZE, or stop other processes on the GPU "
        "(python -m train check lists them)"
    )


def test_each_process_reads_the_slices_of_its_own_replicas(monkeypatch):
    """Two processes with two replicas each: process 0 reads replicas 0-1 of every global batch, process 1 replicas 2-3."""
    from train.inputs import pipeline as data

    monkeypatch.setattr(data, "replica_dataset", lambda *args, **kw: (args, kw))

    class TwoProcesses:
        num_replicas_in_sync = 4

        def distribute_datasets_from_function(self, per_process):
            return [per_process(types.SimpleNamespace(num_input_pipelines=2, input_pipeline_id=i)) for i in (0, 1)]

    loop = types.SimpleNamespace(strategy=TwoProcesses(), spec="spec", s="settings")
    got = EpochLoop._distributed(loop, "train", 3, 64, 5)
    assert got == [
        (("spec", "settings", "train", 3, 64, 5), {"replicas": 4, "first_replica": 0, "local_replicas": 2}),
        (("spec", "settings", "train", 3, 64, 5), {"replicas": 4, "first_replica": 2, "local_replicas": 2}),
    ]
    assert all(type(v) is int for _, kw in got for v in kw.values())  # they bound tf.data ranges
    assert EpochLoop._distributed(loop, "val", 0, 64)[0][0] == ("spec", "settings", "val", 0, 64, 0)


@pytest.mark.parametrize(
    "step, saved_batch, new_batch, expected",
    [
        (0, 64, 32, 0),
        (3, 64, 32, 6),
        (5, 64, 32, 10),
        (7, 32, 16, 14),
        (3, 64, 64, 3),
        (2, 32, 64, 1),
        (3, 5, 2, 7),  # 15 examples in: batch 2 goes back to 14 (one example again), never forward past one
    ],
)
def test_step_at_batch_size_keeps_the_position_in_examples(step, saved_batch, new_batch, expected):
    got = step_at_batch_size(step, saved_batch, new_batch)
    assert got == expected and isinstance(got, int)


@pytest.mark.parametrize(
    "saved, new, expected",
    [
        (LoopState(step=5, batch_size=32, batch_halvings=1), 16, LoopState(step=10, batch_size=16)),
        (
            LoopState(step=5, batch_size=32, epoch=2, global_step=29),
            64,
            LoopState(step=2, batch_size=64, epoch=2, global_step=29),
        ),
        (LoopState(step=5, batch_size=32, batch_halvings=1), 32, LoopState(step=5, batch_size=32, batch_halvings=1)),
    ],
)
def test_a_forced_new_batch_size_is_trained_from_the_same_example(saved, new, expected):
    """--force with a new BATCH_SIZE: the new value trains, AUTO_BATCH's count starts again; unchanged: as saved."""
    assert at_new_batch_size(saved, new) == expected


@pytest.mark.parametrize(
    "batch, header",
    [
        (64, {"batch_size": 64}),
        (2, {"batch_size": 2}),  # the smallest batch that can still halve
        (64, {}),  # a header from an older version, without batch_size: saved at the batch in use
    ],
)
def test_auto_batch_halves_and_continues_at_the_same_example(monkeypatch, batch, header):
    """Saved at step 3 (3 batches in): half the batch continues at step 6, from the saved state."""
    from train.run import checkpoints

    saved = {"epoch": 1, "step": 3, "global_step": 13, "best": 0.5, "batch_halvings": 0, **header}
    restored = []
    monkeypatch.setattr(checkpoints, "load_latest", lambda d: types.SimpleNamespace(meta=dict(saved), path=d))
    monkeypatch.setattr(checkpoints, "restore", lambda model, loaded: restored.append(loaded.path))
    loop = _loop(auto_batch=True)
    # The failing step: not saved, so redone.
    loop.state = dataclasses.replace(loop.state, batch_size=batch, step=5, global_step=15)
    loop.model, continued, aligned = object(), [], []
    loop._train_epoch = lambda epoch: continued.append((epoch, loop.state.to_dict())) or ({}, 0.0, 0)
    loop._align_schedule = lambda: aligned.append((loop.state.step, loop.state.batch_size))
    EpochLoop._out_of_memory(loop)
    assert restored == [Path("/runs/r1/checkpoints")]
    assert aligned == [(6, batch // 2)]  # the learning-rate schedule learns the new position
    expected = dict(saved, batch_size=batch // 2, step=6, batch_halvings=1)
    assert continued == [(1, dict(expected, workers=1, patience_reference=None, patience_wait=0))]


# --- the loop on a tiny model ----------------------------------------------------------------------


def _tiny_models(asked=None):
    """The one-layer model under every MODEL name; `asked` collects the names asked for."""
    import keras

    def build_model(name, input_shape, num_classes):
        if asked is not None:
            asked.append(name)
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input(input_shape),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(num_classes, activation="softmax"),
            ]
        )

    return types.SimpleNamespace(build_model=build_model)


@pytest.fixture
def real_loop(tmp_path):
    """make(epochs=1, resume_from=None, chief=True, started=now, stop=None, strategy=None, **settings) -> an EpochLoop as
    train() builds it, in a new run directory or resuming `resume_from` (chief=False: a worker, no run
    directory): 384 generated training examples (42 more validate), 6 steps of 64 per epoch; 128 test
    examples. make.asked: the MODEL names built."""
    from helpers import tiny_settings

    from train.inputs import pipeline as data
    from train.run import checkpoints
    from train.run.find import create_run_dir
    from train.setup.devices import DeviceSetup
    from train.training.stop_flag import StopFlag

    # One step a call (STEPS_PER_EXECUTION=1), so that a test can act between any two steps; calls of
    # several steps have their own test.
    s0 = tiny_settings(tmp_path, batch_size=64, export=False, steps_per_execution=1)
    spec = data.load_data(s0)

    def make(epochs=1, resume_from=None, chief=True, started=None, stop=None, strategy=None, **changes):
        s = s0.replace(**changes)
        run_dir = (resume_from or create_run_dir(s0.runs_dir)) if chief else None
        loaded = checkpoints.load_latest(run_dir / "checkpoints") if resume_from else None
        state = LoopState.from_meta(loaded.meta, s.batch_size) if loaded else LoopState(batch_size=s.batch_size)
        return start_loop(
            s,
            run_dir,
            spec,
            DeviceSetup(precision="float32", precision_reason="a tiny test run", strategy=strategy),
            state,
            epochs,
            stop or StopFlag(s.max_minutes, started),
            chief=chief,
            models=_tiny_models(make.asked),
            loaded=loaded,
        )

    make.asked = []
    return make


def _stop_after_steps(loop, steps):
    """Request a stop at the end of training step `steps` (the loop checks before each compiled call)."""
    calls, check = {"n": 0}, loop.stop.check

    def counting_check():
        calls["n"] += 1
        if calls["n"] == steps + 1:
            loop.stop.request("test stop")
        return check()

    loop.stop.check = counting_check


def test_a_stop_saves_the_step_reached_and_a_resume_starts_there(real_loop, monkeypatch, train_log):
    from train.inputs import pipeline as data
    from train.run import checkpoints

    straight = real_loop().run()
    assert straight.status == "completed"

    loop = real_loop()
    _stop_after_steps(loop, 2)
    told = []
    loop.callbacks = Callbacks([types.SimpleNamespace(on_complete=told.append)])
    stopped = loop.run()
    newest = checkpoints.load_latest(loop.run_dir / "checkpoints")
    assert stopped.status == "interrupted" and told == []  # only a run that trained every epoch is complete
    assert (newest.meta["epoch"], newest.meta["step"], newest.meta["global_step"]) == (0, 2, 2)
    assert _ended_because(loop.run_dir) == "stopped (test stop): resumable"
    said = "saved a resumable state at epoch 1 step 2"  # the run's last line gives the command (fit)
    assert _log_lines(train_log)[-2:] == ["checkpoint ckpt-000000002.npz (stop requested: test stop)", said]
    assert stopped.final_weights_sha256 and not (loop.run_dir / "final.weights.h5").exists()

    starts, original = [], data.replica_dataset

    def recording(spec, s, which, epoch, batch, start=0, **kw):
        if which == "train":
            starts.append(start)
        return original(spec, s, which, epoch, batch, start, **kw)

    monkeypatch.setattr(data, "replica_dataset", recording)
    resumed = real_loop(resume_from=loop.run_dir)
    result = resumed.run()
    assert result.status == "completed" and starts == [2] and "epoch 1/1 (from step 2/6)" in _log_lines(train_log)
    assert _ended_because(loop.run_dir) == "all 1 epoch trained"
    assert (resumed.state.epoch, resumed.state.step, resumed.state.global_step) == (1, 0, 6)
    assert int(resumed.model.optimizer.iterations.numpy()) == 6
    again = real_loop(resume_from=loop.run_dir)  # the completed run resumed once more: nothing is left
    assert _log_lines(train_log)[-1] == (
        "all 1 epoch(s) are trained already: nothing to train; the final weights and the test split "
        "are done again (to train more, resume with a larger EPOCHS)"
    )
    assert again.run().status == "completed" and again.state.global_step == 6
    # Compared with a tolerance (no op determinism in this process; bit identity is test_fit's job):
    # one Adam step more or less moves the weights by about LEARNING_RATE, round-off by far less.
    for a, b in zip(result.model.get_weights(), straight.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def _fixed_validation(loop, val_accuracy):
    """Replace validation by a fixed sequence of val_accuracy; returns the model's weights at each epoch's end."""
    scores, weights = iter(val_accuracy), []

    def validate():
        weights.append(loop.model.get_weights())
        return {"val_loss": 1.0, "val_accuracy": next(scores)}

    loop._validate = validate
    return weights


def _ended_because(run_dir: Path) -> str:
    import json

    return json.loads((run_dir / "manifest.json").read_text())["ended_because"]


def test_a_spent_max_minutes_budget_stops_before_the_first_step_with_a_resumable_state(real_loop):
    """MAX_MINUTES counts from the run's start (`started`), not from the loop's."""
    import time

    from train.run import checkpoints

    loop = real_loop(epochs=1, max_minutes=1, started=time.monotonic() - 61)
    result = loop.run()
    assert result.status == "budget" and result.epochs_completed == 0 and result.history == []
    newest = checkpoints.load_latest(loop.run_dir / "checkpoints")
    assert (newest.meta["epoch"], newest.meta["step"], newest.meta["global_step"]) == (0, 0, 0)
    assert _ended_because(loop.run_dir) == "stopped (MAX_MINUTES reached): resumable"


def test_the_stop_flag_given_is_the_one_obeyed(real_loop):
    """train() routes signals to its own StopFlag and hands it to the loop: a stop asked of it stops the loop."""
    from train.training.stop_flag import StopFlag

    stop = StopFlag()
    stop.request("received SIGTERM")
    loop = real_loop(epochs=1, stop=stop)
    result = loop.run()
    assert result.status == "interrupted" and loop.state.global_step == 0
    assert _ended_because(loop.run_dir) == "stopped (received SIGTERM): resumable"


def test_a_mirrored_strategy_trains_its_own_variables(real_loop):
    """The strategy of the device setup builds the model and runs the steps (one CPU replica here)."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    loop = real_loop(epochs=1, strategy=strategy)
    assert loop.strategy is strategy and loop.steps.strategy is strategy
    cosine = real_loop(epochs=1, strategy=strategy, lr_schedule="cosine").schedule
    assert not isinstance(cosine.start, tf.distribute.DistributedValues)  # plain: set once, read by each replica
    result = loop.run()
    assert result.status == "completed" and loop.state.global_step == 6
    assert int(loop.model.optimizer.iterations.numpy()) == 6


def test_jit_compile_reaches_the_compiled_steps(real_loop, monkeypatch):
    import tensorflow as tf

    real, asked = tf.function, []

    def spy(fn=None, **kw):
        asked.append(kw.get("jit_compile"))
        return real(fn, **kw)

    monkeypatch.setattr(tf, "function", spy)
    real_loop(epochs=1, jit_compile=True)
    assert asked.count(True) == 2  # the forward and the forward-backward pass


def test_the_trained_model_is_compiled_with_the_models_loss_and_metrics(real_loop):
    """What the export saves: Keras's own evaluate() on the validation split agrees with the loop's."""
    loop = real_loop(epochs=1)
    row = loop.run().history[-1]
    val = loop.spec._val
    got = loop.model.evaluate(val.x.astype("float32"), val.y, batch_size=64, verbose=0, return_dict=True)
    assert got == pytest.approx({"loss": row["val_loss"], "accuracy": row["val_accuracy"]}, rel=1e-5)


def test_a_cosine_schedule_decays_to_zero_over_all_epochs(real_loop):
    """LR_SCHEDULE=cosine over 2 epochs of 6 steps: half the rate after epoch 1, zero after epoch 2."""
    result = real_loop(epochs=2, lr_schedule="cosine", learning_rate=1e-3).run()
    assert [r["learning_rate"] for r in result.history] == pytest.approx([5e-4, 0.0], abs=1e-9)
    one_step = real_loop(epochs=1, lr_schedule="cosine", learning_rate=1e-3, batch_size=512).run()
    assert one_step.history[-1]["learning_rate"] == pytest.approx(0.0, abs=1e-9)  # a schedule of a single step
    constant = real_loop(epochs=2, learning_rate=1e-3).run()
    assert [r["learning_rate"] for r in constant.history] == pytest.approx([1e-3, 1e-3])


def test_a_diverged_validation_loss_fails_the_run_and_keeps_the_last_good_state(real_loop):
    from train.run import checkpoints

    loop = real_loop(epochs=3)
    scores = iter([{"val_loss": 1.0, "val_accuracy": 0.5}, {"val_loss": math.nan, "val_accuracy": 0.5}])
    loop._validate = lambda: next(scores)
    with pytest.raises(DivergedError) as info:
        loop.run()
    assert str(info.value).startswith(
        "val_loss is nan in epoch 2: training diverged; the last good checkpoint is kept in "
    )
    newest = checkpoints.load_latest(loop.run_dir / "checkpoints")
    assert (newest.meta["epoch"], newest.meta["global_step"]) == (1, 8)  # global step 8 of epoch 2, not its end (12)


@pytest.mark.parametrize("nan_accuracy, fails", [(False, "best.weights.h5"), (True, "final.weights.h5"), (False, None)])
def test_weights_are_written_only_with_room_for_them_and_a_mebibyte(real_loop, monkeypatch, nan_accuracy, fails):
    """Keras's HDF5 writer dies at exit on a full disk, so the room is checked first: the weights' bytes (the
    one-layer model: 3140 float32) and 1 MiB for HDF5's own records. One byte less is a full disk, naming the file."""
    from train.errors import StorageError
    from train.run import files as rundir

    need = 4 * 3140 + 2**20
    free = need - 1 if fails else need
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=free))
    loop = real_loop(epochs=1)
    accuracy = math.nan if nan_accuracy else 0.5  # no improvement: no best weights to write
    loop._validate = lambda: {"val_loss": 1.0, "val_accuracy": accuracy}
    if fails:
        with pytest.raises(StorageError) as info:
            loop.run()
        assert (
            str(info.value)
            == f"cannot write {loop.run_dir / fails}: the disk is full: free space or point RUNS_DIR at a larger volume"
        )
        assert not (loop.run_dir / fails).exists()
    else:
        assert loop.run().status == "completed" and (loop.run_dir / "final.weights.h5").is_file()


def test_a_stopped_worker_says_the_chief_saved_the_state(real_loop, train_log):
    from train.training.stop_flag import StopFlag

    stop = StopFlag()
    stop.request("received SIGTERM")
    result = real_loop(epochs=1, chief=False, stop=stop).run()
    assert result.status == "interrupted"
    assert _log_lines(train_log)[-1] == "saved a resumable state at epoch 1 step 0; the chief saved it"


def test_a_resume_drops_the_metrics_rows_of_epochs_it_trains_again(real_loop):
    """A run killed between writing epoch 2's row and saving its state: the resume trains epoch 2
    again and keeps one row per epoch, the first epoch's as it was."""
    loop = real_loop(epochs=1)
    loop.run()
    metrics = loop.run_dir / "metrics.csv"
    first = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*first, first[1].replace("1,", "2,", 1)]) + "\n")  # epoch 2's row, no state
    resumed = real_loop(epochs=2, resume_from=loop.run_dir)
    result = resumed.run()
    lines = metrics.read_text().splitlines()
    assert lines[:2] == first and [line.split(",")[0] for line in lines[1:]] == ["1", "2"]
    assert [int(r["epoch"]) for r in result.history] == [1, 2]


def _log_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "train"]


@pytest.fixture
def train_log(monkeypatch, caplog):
    """The messages of the `train` logger from now on, DEBUG included (a list, filled as they come)."""
    import logging

    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)  # an earlier setup_logging may have cut it
    caplog.set_level(logging.DEBUG, logger="train")
    return caplog


def test_the_log_names_the_model_its_cost_each_epoch_and_each_checkpoint(real_loop, train_log):
    import re

    loop = real_loop(epochs=2, peak_flops="auto")  # the log line of a measured peak
    _fixed_validation(loop, [0.5, 0.4])
    loop.run()
    epoch_end = (
        r"epoch {}/2: accuracy=\d\.\d{{4}}  loss=\d\.\d{{4}}  val_accuracy={}  val_loss=1\.0000  \d+\.\ds  "
        r"\d+ samples/s  \d+\.\d GFLOP/s = MFU \d+\.\d%{}"
    )
    expected = [
        r"model: cnn, 3140 parameters, global batch 64",
        r"cost: 0\.0 MFLOP per training example \(layers not counted: none\); "
        r"peak \d+\.\d GFLOP/s \(measured: 1024x1024 float32 matmul on CPU, x1; "
        r"(measured now \(best of \d probes\), cached in|cached from) \S+peak-flops\S+json.*\)",
        r"checkpoint ckpt-000000000\.npz \(initial state\)",
        r"epoch 1/2",
        r"checkpoint ckpt-000000004\.npz \(every 4 steps\)",
        r"checkpoint ckpt-000000006\.npz \(epoch end\)",
        epoch_end.format(1, r"0\.5000", r"  \(best\)"),
        r"epoch 2/2",
        r"checkpoint ckpt-000000008\.npz \(every 4 steps\)",
        r"checkpoint ckpt-000000012\.npz \(epoch end\)",
        epoch_end.format(2, r"0\.4000", ""),
        r"test \(128 examples\): accuracy=\d\.\d{4} loss=\d\.\d{4} \(best weights, epoch 1\); "
        r"accuracy=\d\.\d{4} loss=\d\.\d{4} \(final weights, epoch 2\)",
    ]
    lines = _log_lines(train_log)
    assert len(lines) == len(expected) and all(re.fullmatch(e, line) for e, line in zip(expected, lines)), lines


def test_best_weights_are_those_of_the_best_epoch_not_the_last(real_loop):
    loop = real_loop(epochs=4)
    weights = _fixed_validation(loop, [0.5, 0.7, 0.6, 0.7])
    result = loop.run()
    assert result.best == 0.7 and [r["val_accuracy"] for r in result.history] == [0.5, 0.7, 0.6, 0.7]
    best = _tiny_models().build_model("", loop.spec.input_shape, loop.spec.num_classes)
    best.load_weights(loop.run_dir / "best.weights.h5")
    for saved, epoch_2, epoch_4 in zip(best.get_weights(), weights[1], weights[3]):
        np.testing.assert_array_equal(saved, epoch_2)  # the first 0.7: a tie is no improvement
        assert not np.array_equal(saved, epoch_4)


def test_an_epoch_that_ties_the_best_is_not_marked_best_in_the_log(real_loop, train_log):
    """The log's "(best)" marks the epochs whose weights went to best.weights.h5: a tie (epoch 4's 0.7)
    keeps epoch 2's, as the report's star and `compare`'s "best at epoch" say."""
    loop = real_loop(epochs=4)
    _fixed_validation(loop, [0.5, 0.7, 0.6, 0.7])
    loop.run()
    ends = [line for line in _log_lines(train_log) if line.startswith("epoch ") and ": " in line]
    assert [line.endswith("(best)") for line in ends] == [True, True, False, False], ends


def test_early_stopping_ends_the_run_after_patience_epochs_without_improvement(real_loop, train_log):
    """PATIENCE=2 on val_accuracy (larger is better): epochs 3 and 4 do not beat epoch 2, so epoch 5 never
    starts, nor after a resume."""
    from train.run import checkpoints

    loop = real_loop(epochs=6, patience=2)
    _fixed_validation(loop, [0.5, 0.7, 0.6, 0.65, 0.9, 0.9])
    result = loop.run()
    assert result.status == "completed" and result.epochs_completed == 4 and result.best == 0.7
    saved = checkpoints.load_latest(loop.run_dir / "checkpoints").meta  # the count survives a stop
    assert (saved["epoch"], saved["patience_reference"], saved["patience_wait"]) == (4, 0.7, 2)
    assert [r["val_accuracy"] for r in result.history] == [0.5, 0.7, 0.6, 0.65]
    reason = (
        "early stopping: val_accuracy has not improved by more than MIN_DELTA=0 for 2 epochs (PATIENCE=2); "
        "best val_accuracy 0.7000, its weights are in best.weights.h5"
    )
    assert _ended_because(loop.run_dir) == reason and _log_lines(train_log)[-2] == reason  # then the test split's line
    resumed = real_loop(epochs=6, resume_from=loop.run_dir, patience=2)
    assert resumed.run().epochs_completed == 4 and _log_lines(train_log)[-2] == reason


def test_a_worker_trains_without_writing_anything(real_loop, tmp_path, capsys):
    """chief=False (another process of a multi-worker run): the same epochs, no run directory, no files,
    no progress bar."""
    before = sorted(tmp_path.rglob("*"))
    loop = real_loop(epochs=2, chief=False, progress="bar")
    capsys.readouterr()
    result = loop.run()
    assert "6/6" not in capsys.readouterr().out
    assert result.status == "completed" and result.run_dir is None and result.epochs_completed == 2
    assert [r["epoch"] for r in result.history] == [1, 2] and loop.state.global_step == 12
    assert loop.peak.flops is None and [r["mfu"] for r in result.history] == [None, None]  # the chief's to record
    assert sorted(tmp_path.rglob("*")) == before


def test_a_models_own_metrics_are_trained_validated_and_recorded(real_loop, monkeypatch):
    """A registered model's metrics (train.models) become columns of metrics.csv, with their val_ twins."""
    from train import models

    def wrong(labels, probs):
        return 1.0 - models.correct(labels, probs)

    metrics = {"accuracy": models.correct, "wrong": wrong}
    monkeypatch.setitem(models.MODELS, "tiny_two_metrics", models.ModelEntry(build=None, doc="", metrics=metrics))
    loop = real_loop(epochs=1, model="tiny_two_metrics", monitor="val_wrong")
    assert real_loop.asked == ["tiny_two_metrics"]
    row = loop.run().history[-1]
    assert row["wrong"] == pytest.approx(1 - row["accuracy"]) and row["val_wrong"] == pytest.approx(
        1 - row["val_accuracy"]
    )
    header = (loop.run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == ["epoch", "loss", "accuracy", "wrong", "val_loss", "val_accuracy", "val_wrong"]
    hparams = _scalars(loop.run_dir / "tensorboard", "hparams/")
    assert {"hparams/wrong", "hparams/val_wrong", "hparams/best_val_wrong"} <= set(hparams)


def test_a_registered_loss_of_reduction_without_a_default_trains(real_loop, monkeypatch):
    """`loss(reduction)` as docs/extending.md writes it, with no default: registered, and the model is
    compiled with it (loss() alone was a TypeError mid-run, after register() had refused it at import)."""
    import keras

    from train import models

    def crossentropy(reduction):
        return keras.losses.SparseCategoricalCrossentropy(reduction=reduction)

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    models.register("tiny_own_loss", models.cnn, "", loss=crossentropy)
    loop = real_loop(epochs=1, model="tiny_own_loss")
    assert loop.model.loss.reduction == "sum_over_batch_size"  # what the exported model is compiled with
    assert math.isfinite(loop.run().history[-1]["loss"])


def _oom_at_call(loop, bad_call: int) -> dict:
    """Make the loop's `bad_call`-th compiled train call run out of memory; returns what was seen:
    the newest checkpoint at that moment, and the model's weights and optimizer step at the next call."""
    import tensorflow as tf

    from train.run import checkpoints

    train, seen = loop.steps.train, {"calls": 0}

    def failing_once(*args):
        seen["calls"] += 1
        if seen["calls"] == bad_call:
            seen["checkpoint"] = checkpoints.load_latest(loop.run_dir / "checkpoints")
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
        if seen["calls"] == bad_call + 1:
            seen["weights"] = [v.numpy() for v in loop.model.variables]
            seen["iterations"] = int(loop.model.optimizer.iterations.numpy())
        return train(*args)

    loop.steps.train = failing_once
    return seen


def test_auto_batch_continues_from_the_checkpoints_weights_with_half_the_batch(real_loop, monkeypatch, caplog):
    """Out of memory in step 6 of batch 64, the state of step 4 saved: training goes on from that
    state's weights and optimizer, in batches of 32 from its example (step 8 of 12), and says so."""
    import logging

    from train.inputs import pipeline as data

    loop = real_loop(epochs=1, auto_batch=True)
    seen = _oom_at_call(loop, 6)
    batches, original = [], data.replica_dataset

    def recording(spec, s, which, epoch, batch, start=0, **kw):
        if which == "train":
            batches.append((batch, start))
        return original(spec, s, which, epoch, batch, start, **kw)

    monkeypatch.setattr(data, "replica_dataset", recording)
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)  # an earlier setup_logging may have cut it
    with caplog.at_level(logging.WARNING, logger="train"):
        result = loop.run()
    assert seen["checkpoint"].meta["global_step"] == 4
    for weights, saved in zip(seen["weights"], seen["checkpoint"].model_arrays, strict=True):
        np.testing.assert_array_equal(weights, saved)
    assert seen["iterations"] == 4
    assert batches == [(64, 0), (32, 8)]
    assert result.status == "completed" and [r["batch_size"] for r in result.history] == [32]
    assert (loop.state.epoch, loop.state.step, loop.state.global_step, loop.state.batch_halvings) == (1, 0, 8, 1)
    assert int(loop.model.optimizer.iterations.numpy()) == 8
    warnings = [r.getMessage() for r in caplog.records if "out of GPU memory" in r.getMessage()]
    assert warnings == [
        "WARNING: out of GPU memory at batch size 64; AUTO_BATCH: continuing from the last checkpoint "
        "with batch size 32 (1/3)"
    ]


def test_a_resume_with_every_epoch_trained_records_the_last_epochs_metrics_as_numbers(real_loop):
    """Killed after the last epoch's checkpoint, before the end of the run: the resume trains
    nothing, and the manifest's final metrics are the last row read back, as numbers."""
    import json

    def as_written(row):  # metrics.csv keeps 6 significant digits; GPU memory is None on a CPU
        return {k: v if v is None or isinstance(v, int) else pytest.approx(v, rel=1e-5) for k, v in row.items()}

    first = real_loop(epochs=1)
    row = first.run().history[-1]
    again = real_loop(epochs=1, resume_from=first.run_dir).run()
    assert again.history == [as_written(row)] and isinstance(again.history[-1]["epoch"], int)
    final = json.loads((first.run_dir / "manifest.json").read_text())["final_metrics"]
    assert final == as_written(row)
    (first.run_dir / "metrics.csv").unlink()  # lost with it: no last row to record, and no error
    assert real_loop(epochs=1, resume_from=first.run_dir).run().status == "completed"
    assert json.loads((first.run_dir / "manifest.json").read_text())["final_metrics"] is None


def test_a_stop_records_the_training_time_of_the_unfinished_epoch_for_time_to_best(real_loop):
    """metrics.csv times only the part of epoch 1 the resumed segment trains; the stopped segment's
    part is in its manifest segment, and time to best adds it."""
    import json

    from train.results.run_records import load_records

    loop = real_loop()
    (loop.run_dir / "config.json").write_text(json.dumps(loop.s.to_dict()))  # as fit writes them
    (loop.run_dir / "manifest.json").write_text(json.dumps({"segments": [{"status": "running"}]}))
    _stop_after_steps(loop, 3)
    assert loop.run().status == "interrupted"
    (segment,) = json.loads((loop.run_dir / "manifest.json").read_text())["segments"]
    part = segment["unfinished_epoch"]
    assert part["epoch"] == 1 and part["train_seconds"] > 0
    assert real_loop(resume_from=loop.run_dir).run().status == "completed"
    records = load_records(loop.run_dir)
    (row,) = records.rows
    assert records.seconds_to(1) == pytest.approx(row["epoch_seconds"] + part["train_seconds"])


def test_a_state_saved_mid_epoch_one_makes_a_resume_without_checkpoints_refuse(real_loop):
    """Stopped in epoch 1 after 3 steps (no epoch finished, no weights, no metrics.csv): the manifest
    records that a state with trained steps was saved, so once the checkpoints are gone, --resume
    refuses instead of training the run again from step 0 (docs/reliability.md); the initial state alone
    (step 0, nothing trained) records nothing."""
    import json
    import shutil

    from train.errors import CheckpointError
    from train.run.resume import plan_run

    loop = real_loop()
    (loop.run_dir / "config.json").write_text(json.dumps(loop.s.to_dict()))  # as fit writes them
    manifest = loop.run_dir / "manifest.json"
    manifest.write_text(json.dumps({"segments": [{"status": "running"}]}))
    loop._save("initial state")  # what start_loop saves for a new run, before any step
    assert "trained_state_saved" not in json.loads(manifest.read_text())
    _stop_after_steps(loop, 3)
    assert loop.run().status == "interrupted"
    assert json.loads(manifest.read_text())["trained_state_saved"] is True
    assert not (loop.run_dir / "metrics.csv").exists() and not list(loop.run_dir.glob("*.weights.h5"))
    shutil.rmtree(loop.run_dir / "checkpoints")
    with pytest.raises(CheckpointError, match="has no checkpoint in .*Pass --restart"):
        plan_run(loop.s, loop.run_dir.name)


def test_a_cosine_schedule_still_spans_all_epochs_after_auto_batch_halves_the_batch(real_loop):
    """Out of memory in step 6 of batch 64: epoch 1 ends halfway down the cosine and epoch 2 at
    zero, though an epoch now takes 12 optimizer steps instead of 6 (counted in steps, the rate
    would be a quarter after epoch 1 and zero two thirds of the way through)."""
    loop = real_loop(epochs=2, auto_batch=True, lr_schedule="cosine", learning_rate=1e-3)
    _oom_at_call(loop, 6)
    result = loop.run()
    assert [r["batch_size"] for r in result.history] == [32, 32]
    assert [r["learning_rate"] for r in result.history] == pytest.approx([5e-4, 0.0], abs=1e-9)


def test_a_resume_with_another_batch_size_keeps_the_cosine_where_training_stands(real_loop):
    """3 epochs: 1 trained in batches of 64 (6 steps), resumed in batches of 32 (12 steps an
    epoch): the rate after epoch 2 is the cosine at two thirds, whatever the optimizer's step count."""
    first = real_loop(epochs=3, lr_schedule="cosine", learning_rate=1e-3)
    _stop_after_steps(first, 6)
    assert first.run().status == "interrupted" and first.state.global_step == 6
    resumed = real_loop(epochs=3, resume_from=first.run_dir, lr_schedule="cosine", learning_rate=1e-3)
    resumed.state = at_new_batch_size(resumed.state, 32)  # as a --force resume with BATCH_SIZE=32 does
    _stop_after_steps(resumed, 12)
    resumed.run()
    third, two_thirds = (1e-3 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in (1, 2))
    rates = [float(r["learning_rate"]) for r in resumed.history]  # epoch 1's row is read back from metrics.csv
    assert rates == pytest.approx([third, two_thirds], rel=1e-5)
    assert int(resumed.model.optimizer.iterations.numpy()) == 18


def test_oom_with_several_workers_is_an_error_even_with_auto_batch():
    with pytest.raises(OutOfMemoryError):
        check_room_to_halve(True, LoopState(batch_size=64, epoch=1, step=3), workers=2)


@pytest.mark.parametrize(
    "saved, old, expected_step",
    [
        (LoopState(step=5, batch_size=32), 32, 10),  # 160 examples in, batches of 16
        (LoopState(step=5, batch_size=16), 16, 10),  # a second halving counts in the saved state's own batches
        (LoopState(step=7, batch_size=9), 9, 15),  # odd batch: whole batches of the new size, never past the position
    ],
)
def test_auto_batch_position_carries_over_in_examples(saved, old, expected_step):
    got = position_after_halving(saved, old, halvings=2)
    assert got.batch_size == old // 2 and got.step == expected_step and got.batch_halvings == 2
    assert type(got.batch_size) is int and type(got.step) is int  # whole batches, as metrics.csv records them
    assert got.step * got.batch_size <= saved.step * saved.batch_size


@pytest.mark.parametrize(
    "left, per_exec, global_step, every, expected",
    [
        (100, 1, 0, 4, 1),
        (100, 8, 0, 0, 8),
        (3, 8, 0, 0, 3),  # never past the epoch's end
        (100, 8, 6, 4, 2),  # stops on the next checkpoint boundary (global step 8)
        (100, 4, 24, 8, 4),
    ],
)
def test_steps_per_call(left, per_exec, global_step, every, expected):
    assert steps_until(left, per_exec, global_step, every) == expected


@pytest.mark.parametrize(
    "batch, replicas, expected", [(64, 1, "64"), (64, 2, "64 (32 per replica x 2)"), (96, 3, "96 (32 per replica x 3)")]
)
def test_the_log_gives_each_replicas_share_of_the_batch(batch, replicas, expected):
    assert batch_text(batch, replicas) == expected


def test_progress_bar_on_a_terminal_one_line_otherwise():
    assert progress_verbose("auto", True) == 1 and progress_verbose("auto", False) == 0
    assert progress_verbose("bar", False) == 1 and progress_verbose("line", True) == 0


def test_state_from_a_checkpoint_header_keeps_known_keys_only():
    meta = {"epoch": 2, "step": 4, "global_step": 28, "best": 0.5, "batch_halvings": 0, "model_variables": [[1]]}
    state = LoopState.from_meta(meta, default_batch=32)
    assert state == LoopState(epoch=2, step=4, global_step=28, best=0.5, batch_size=32)
    assert "model_variables" not in state.to_dict()


def test_every_epoch_records_achieved_flops_and_mfu_against_the_measured_peak(real_loop):
    import json

    loop = real_loop(epochs=1, peak_flops="auto")
    # 28x28 inputs, one Dense(784 -> 4): 2 * 784 * 4 FLOPs forward, three times that to train.
    assert loop.flop_count.train_per_example == 3 * 2 * 784 * 4
    assert loop.peak.flops and loop.peak.source.startswith("measured: 1024x1024 float32 matmul on CPU")
    row = loop.run().history[-1]
    assert row["model_flops_per_second"] == pytest.approx(row["samples_per_second"] * 3 * 2 * 784 * 4)
    assert row["mfu"] == pytest.approx(row["model_flops_per_second"] / loop.peak.flops)
    assert 0 < row["mfu"] < 1
    manifest = json.loads((loop.run_dir / "manifest.json").read_text())
    assert manifest["flops"]["train_per_example"] == 3 * 2 * 784 * 4 and manifest["peak"]["flops"] == loop.peak.flops
    header = (loop.run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"model_flops_per_second", "mfu"} <= set(header)


def test_a_failed_peak_probe_leaves_mfu_empty_and_the_run_going(real_loop, monkeypatch, caplog):
    import logging

    from train.training import flops

    def broken(*_a, **_k):
        raise RuntimeError("no device")

    monkeypatch.setattr(flops, "measure_peak_flops", broken)
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="train"):
        loop = real_loop(epochs=1, peak_flops="auto")
    assert loop.peak.flops is None and loop.peak.source == "unknown: the probe failed"
    assert [r.getMessage() for r in caplog.records if "probe failed" in r.getMessage()] == [
        "WARNING: the peak FLOP/s probe failed (RuntimeError: no device): no MFU for this run"
    ]
    row = loop.run().history[-1]
    assert row["mfu"] is None and row["model_flops_per_second"] is None and row["samples_per_second"]


@pytest.mark.parametrize(
    "precision, gpus, replicas, probe, peak, text",
    [
        (  # the first GPU's datasheet (a T4 has no bfloat16 figure) times the replicas; the probe is recorded beside it
            "mixed_bfloat16",
            ["NVIDIA A100-SXM4-80GB", "Tesla T4"],
            2,
            ("bfloat16", "/GPU:0"),
            (624e12, "datasheet: 312 TFLOP/s bfloat16 per NVIDIA A100-SXM4-80GB, x2", 2e14, 312e12),
            "peak 624000.0 GFLOP/s (datasheet: 312 TFLOP/s bfloat16 per NVIDIA A100-SXM4-80GB, x2)",
        ),
        (  # float32 on an A100 runs on its TF32 tensor cores (TensorFlow's default): that peak, not plain float32's
            "float32",
            ["NVIDIA A100-SXM4-80GB"],
            1,
            ("tfloat32", "/GPU:0"),
            (156e12, "datasheet: 156 TFLOP/s tfloat32 per NVIDIA A100-SXM4-80GB, x1", 2e14, 156e12),
            "peak 156000.0 GFLOP/s (datasheet: 156 TFLOP/s tfloat32 per NVIDIA A100-SXM4-80GB, x1)",
        ),
        (  # a CPU has no TF32: float32 stays float32 whatever TensorFlow's TF32 switch says
            "float32",
            [],
            1,
            ("float32", "/CPU:0"),
            (2e14, "measured: 1024x1024 float32 matmul on CPU, x1", 2e14, None),
            "peak 200000.0 GFLOP/s (measured: 1024x1024 float32 matmul on CPU, x1)",
        ),
        (  # no GPU: the probe, in the training precision, on the CPU
            "mixed_bfloat16",
            [],
            1,
            ("bfloat16", "/CPU:0"),
            (2e14, "measured: 1024x1024 bfloat16 matmul on CPU, x1", 2e14, None),
            "peak 200000.0 GFLOP/s (measured: 1024x1024 bfloat16 matmul on CPU, x1)",
        ),
    ],
)
def test_the_peak_is_the_datasheets_on_a_known_gpu_else_the_probes(
    monkeypatch, train_log, tmp_path, precision, gpus, replicas, probe, peak, text
):
    """The MFU's denominator, and the log line naming the cost, the layers left out of it and the peak's source."""
    from train.training import flops

    probes = []
    monkeypatch.setattr(flops, "measure_peak_flops", lambda dtype, device: probes.append((dtype, device)) or 2e14)
    count = flops.FlopCount(40 * 10**9, ("dense",), ("attention", "rope"))  # a large vision transformer
    monkeypatch.setattr(flops, "count_flops", lambda model: count)
    setup = types.SimpleNamespace(precision=precision, gpus=gpus)
    settings = types.SimpleNamespace(runs_dir=str(tmp_path), peak_flops="auto")
    loop = types.SimpleNamespace(model=None, chief=True, setup=setup, s=settings)
    EpochLoop._measure_limits(loop, replicas=replicas)
    origin = f"measured now (best of {flops.PROBE_ROUNDS} probes), cached in {tmp_path}/.cache/peak-flops/"
    assert probes == [probe] * flops.PROBE_ROUNDS and loop.flop_count == count
    assert loop.peak == flops.Peak(*peak, origin=loop.peak.origin) and loop.peak.origin.startswith(origin)
    assert _log_lines(train_log) == [
        f"cost: 120000.0 MFLOP per training example (layers not counted: attention, rope); {text[:-1]}; "
        f"{loop.peak.origin})"
    ]


def _scalars(logdir: Path, prefix: str = "epoch_") -> dict[str, list[tuple[int, float]]]:
    """The scalars TensorBoard shows for one event directory, tags starting with `prefix`: tag -> [(step, value)]."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
        if tag.startswith(prefix)
    }


def test_a_completed_run_leaves_its_final_weights_records_and_export(real_loop, monkeypatch):
    """The end of a run: final.weights.h5, the manifest's summary, the export, TensorBoard's epoch
    scalars, an MLflow row and a report refresh per epoch, and only KEEP_CHECKPOINTS states."""
    import json

    from train.results import export, report
    from train.run import checkpoints
    from train.setup import devices

    exported, refreshed, tracked = [], [], []
    memory = iter([(100.0, 150.0), (110.0, 160.0), (120.0, 170.0)])
    monkeypatch.setattr(devices, "gpu_memory", lambda: next(memory))  # (MB in use, peak MB) at each epoch's end
    monkeypatch.setattr(
        export, "export_run", lambda run_dir, model, **formats: exported.append((run_dir, model)) or {"format": "x"}
    )
    monkeypatch.setattr(report, "refresh_after_epoch", lambda run_dir, mode: refreshed.append((run_dir, mode)))
    loop = real_loop(epochs=3, export=True, report="quick", keep_checkpoints=2)
    refresh = report.ReportCallback("quick")
    refresh.on_start(loop.run_dir)
    tracker = types.SimpleNamespace(
        on_epoch_end=lambda epoch, row, state: tracked.append((dict(row), state.global_step))
    )
    loop.callbacks = Callbacks([refresh, export.ExportCallback(loop.s), tracker])
    result = loop.run()

    assert result.status == "completed" and result.export == {"format": "x"}
    assert (result.run_dir, result.model, result.epochs_completed) == (loop.run_dir, loop.model, 3)
    assert result.history == loop.history and len(result.history) == 3
    assert [(r["gpu_memory_used_mb"], r["gpu_memory_peak_mb"]) for r in result.history] == [
        (100.0, 150.0),
        (110.0, 160.0),
        (120.0, 170.0),
    ]
    assert result.best == max(r["val_accuracy"] for r in result.history)
    assert exported == [(loop.run_dir, loop.model)] and refreshed == [(loop.run_dir, "quick")] * 3
    assert tracked == [(row, 6 * epoch) for epoch, row in enumerate(result.history, start=1)]
    final = _tiny_models().build_model("", loop.spec.input_shape, loop.spec.num_classes)
    final.load_weights(loop.run_dir / "final.weights.h5")
    for saved, trained in zip(final.get_weights(), result.model.get_weights(), strict=True):
        np.testing.assert_array_equal(saved, trained)
    manifest = json.loads((loop.run_dir / "manifest.json").read_text())
    assert result.final_weights_sha256 == checkpoints.weights_sha256(result.model) == manifest["final_weights_sha256"]
    assert manifest["best"] == {"monitor": "val_accuracy", "value": result.best} and manifest["epochs_completed"] == 3
    assert manifest["final_metrics"] == json.loads(json.dumps(result.history[-1]))
    # The test split, once, through each weights file: the final weights' numbers are the trained model's own
    test = manifest["test"]
    best_epoch = 1 + [r["val_accuracy"] for r in result.history].index(result.best)
    assert (test["split"], test["examples"], test["weights"]["best"]["epoch"]) == ("test", 128, best_epoch)
    probs = result.model.predict(loop.spec._test.x.astype("float32"), verbose=0)
    final = test["weights"]["final"]
    right = float((probs.argmax(1) == loop.spec._test.y).mean())
    assert final["epoch"] == 3 and final["accuracy"] == pytest.approx(right)
    assert final["loss"] == pytest.approx(float(-np.log(probs[np.arange(128), loop.spec._test.y]).mean()), rel=1e-4)
    assert sorted(p.name for p in checkpoints.list_states(loop.run_dir / "checkpoints")) == [
        "ckpt-000000016.npz",
        "ckpt-000000018.npz",
    ]
    train, val = _scalars(loop.run_dir / "tensorboard" / "train"), _scalars(loop.run_dir / "tensorboard" / "validation")
    for name in ("loss", "accuracy", "learning_rate", "batch_size", "samples_per_second"):
        assert train[f"epoch_{name}"] == [(e, pytest.approx(r[name])) for e, r in enumerate(result.history)]
    for name in ("loss", "accuracy"):
        assert val[f"epoch_{name}"] == [(e, pytest.approx(r[f"val_{name}"])) for e, r in enumerate(result.history)]
    assert "epoch_epoch" not in train


def test_epoch_time_speed_and_mfu_come_from_the_clock_around_training(real_loop, monkeypatch, train_log):
    """seconds = the time the epoch's training took (validation not included); samples/s = examples / seconds;
    model FLOP/s = samples/s x FLOPs per example (18816 here); MFU = that / the peak (set to 100 GFLOP/s)."""
    from train.training import flops
    from train.training import loop as loop_module

    ticks = iter([100.0, 100.00384, 200.0, 200.00192])  # 384 examples in 3.84 ms, then in 1.92 ms
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    loop = real_loop(epochs=2)
    loop.peak = flops.Peak(1e11, "a test peak")
    _fixed_validation(loop, [0.5, 0.4])
    rows = loop.run().history
    assert [r["epoch_seconds"] for r in rows] == [0.004, 0.002]
    assert [r["samples_per_second"] for r in rows] == [pytest.approx(1e5), pytest.approx(2e5)]
    assert [r["model_flops_per_second"] for r in rows] == [pytest.approx(1.8816e9), pytest.approx(3.7632e9)]
    assert [r["mfu"] for r in rows] == [pytest.approx(0.018816), pytest.approx(0.037632)]
    ends = [line for line in _log_lines(train_log) if line.startswith("epoch ") and ": " in line]
    assert ends[0].endswith("  0.0s  100000 samples/s  1.9 GFLOP/s = MFU 1.9%  (best)"), ends
    assert ends[1].endswith("val_accuracy=0.4000  val_loss=1.0000  0.0s  200000 samples/s  3.8 GFLOP/s = MFU 3.8%"), (
        ends
    )


def test_samples_per_second_counts_the_examples_of_the_epochs_short_last_batch(real_loop, monkeypatch):
    """384 examples at batch 100: four steps, the last of 84 examples; the rate counts 384, not 400 (a
    tiny data set at a large batch would otherwise pass the machine's peak, and raise its cached figure)."""
    from train.training import loop as loop_module

    ticks = iter([100.0, 100.00384, 200.0, 200.00184])  # the first epoch whole, the second from its third step
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    loop = real_loop(epochs=1, batch_size=100)
    _fixed_validation(loop, [0.5])
    assert loop.run().history[0]["samples_per_second"] == pytest.approx(1e5)
    resumed = real_loop(epochs=2, batch_size=100)
    resumed.state.epoch, resumed.state.step, resumed.state.global_step = 1, 2, 6
    _fixed_validation(resumed, [0.5])
    row = resumed.run().history[-1]  # steps 3-4 of the second epoch: 100 + 84 examples in 1.84 ms
    assert row["samples_per_second"] == pytest.approx(1e5)


def test_the_test_split_runs_in_the_batch_training_last_ran(real_loop, monkeypatch):
    """AUTO_BATCH halved BATCH_SIZE 64 to 32 (the device ran out of memory): the float32 copy that
    evaluates the test split takes 32 too, not the 64 that did not fit."""
    from train.inputs import pipeline

    asked, real = [], pipeline.final_test_dataset
    monkeypatch.setattr(pipeline, "final_test_dataset", lambda spec, batch: asked.append(batch) or real(spec, batch))
    loop = real_loop(epochs=1)
    loop.state.batch_size, loop.state.batch_halvings = 32, 1
    loop.run()
    assert asked == [32] and loop.s.batch_size == 64


def test_a_state_saved_after_the_last_step_only_validates(real_loop, train_log):
    """Stopped after the epoch's last step, before validation: the resume trains nothing and ends the epoch."""
    loop = real_loop(epochs=1)
    loop.state.step, loop.state.global_step = 6, 6
    row = loop.run().history[0]
    assert "loss" not in row and "val_loss" in row and row["samples_per_second"] is None
    assert not any(line.startswith("epoch 1/1 (") or line == "epoch 1/1" for line in _log_lines(train_log))
    assert _log_lines(train_log)[-2].endswith(
        "  0.0s  0 samples/s  (best)  (resumed after the epoch's last step: validation only)"
    )  # nothing trained: no speed, no MFU
    assert (loop.state.epoch, loop.state.step, loop.state.global_step) == (1, 0, 6)


@pytest.mark.parametrize(
    "every, sizes, saves",
    [
        (4, [4, 2, 2, 4], [(4, "every 4 steps"), (6, "epoch end"), (8, "every 4 steps"), (12, "epoch end")]),
        (0, [4, 2, 4, 2], [(6, "epoch end"), (12, "epoch end")]),  # CHECKPOINT_EVERY=0: epoch ends only
        # not a multiple of STEPS_PER_EXECUTION: a call stops short at each boundary
        (5, [4, 1, 1, 4, 2], [(5, "every 5 steps"), (6, "epoch end"), (10, "every 5 steps"), (12, "epoch end")]),
    ],
)
def test_steps_per_execution_runs_that_many_steps_a_call_and_still_meets_every_checkpoint(
    real_loop, train_log, every, sizes, saves
):
    """STEPS_PER_EXECUTION=4, 6 steps an epoch: a call never crosses the epoch's end or a CHECKPOINT_EVERY boundary."""
    loop = real_loop(epochs=2, steps_per_execution=4, checkpoint_every=every)
    train, called = loop.steps.train, []

    def recording(iterator, n, vote):
        called.append(int(n))
        return train(iterator, n, vote)

    loop.steps.train = recording
    train_log.clear()  # from here: the run's own saves
    loop.run()
    assert called == sizes and loop.state.global_step == 12
    saved = [line for line in _log_lines(train_log) if line.startswith("checkpoint ")]
    assert saved == [f"checkpoint ckpt-{step:09d}.npz ({why})" for step, why in saves]


def test_a_stop_voted_by_another_worker_stops_this_one_after_the_same_step(real_loop, train_log):
    """The vote arrives with step 4, a CHECKPOINT_EVERY boundary: one save, the stop's, once the loop has left the epoch."""
    from train.run import checkpoints

    loop = real_loop(epochs=1)
    train, calls = loop.steps.train, {"n": 0}

    def voted_at_step_4(iterator, n, vote):
        calls["n"] += 1
        out = train(iterator, n, vote).numpy()
        if calls["n"] == 4:
            out[-1] = 1.0  # the all-reduced stop votes: one worker asked
        return types.SimpleNamespace(numpy=lambda: out)

    loop.steps.train = voted_at_step_4
    result = loop.run()
    newest = checkpoints.load_latest(loop.run_dir / "checkpoints")
    assert result.status == "interrupted" and calls["n"] == 4
    assert (newest.meta["epoch"], newest.meta["step"], newest.meta["global_step"]) == (0, 4, 4)
    assert _ended_because(loop.run_dir) == "stopped (another worker was asked to stop): resumable"
    saves = [line for line in _log_lines(train_log) if line.startswith("checkpoint ckpt-000000004")]
    assert saves == ["checkpoint ckpt-000000004.npz (stop requested: another worker was asked to stop)"]


@pytest.mark.parametrize("workers, waits", [(1, 0), (2, 1)])
def test_with_several_workers_each_waits_for_the_chiefs_end(real_loop, workers, waits):
    """No worker leaves while the chief still counts on it (its final weights and export); alone, nobody waits."""
    calls = []
    loop = real_loop(epochs=1)
    loop.setup.workers = workers
    if workers > 1:  # the workers extra's group (train.workers.start.Group)
        loop.setup.group = types.SimpleNamespace(wait_for_chief=lambda: calls.append("wait"))
    assert loop.run().status == "completed" and calls == ["wait"] * waits


def test_with_several_workers_a_stop_travels_with_the_next_steps_vote(real_loop, train_log):
    """Asked after step 2: a lone process stops at once; one of several runs step 3 carrying its vote, so every
    worker stops after the same step."""
    from train.run import checkpoints

    loop = real_loop(epochs=1)
    loop.setup.workers = 2
    train, votes = loop.steps.train, []

    def recording(iterator, n, vote):
        votes.append(float(vote))
        return train(iterator, n, vote)

    loop.steps.train = recording
    _stop_after_steps(loop, 2)
    assert loop.run().status == "interrupted" and votes == [0.0, 0.0, 1.0]
    newest = checkpoints.load_latest(loop.run_dir / "checkpoints")
    assert (newest.meta["step"], newest.meta["global_step"]) == (3, 3)
    assert "another worker was asked to stop" not in " ".join(_log_lines(train_log))  # its own request stands


def test_the_progress_bar_shows_the_epochs_running_means_at_every_step(real_loop, capsys, monkeypatch):
    """PROGRESS=bar: after step k the bar shows the mean loss over steps 1..k, as the epoch line will."""
    import re

    import keras

    init = keras.utils.Progbar.__init__
    monkeypatch.setattr(keras.utils.Progbar, "__init__", lambda self, *a, **kw: init(self, *a, **kw, interval=0))
    loop = real_loop(epochs=1, progress="bar")
    train, sums, means = loop.steps.train, [0.0, 0.0], []

    def recording(iterator, n, vote):
        out = train(iterator, n, vote)
        values = out.numpy()  # [loss sum, accuracy sum, examples, stop votes]
        sums[0], sums[1] = sums[0] + values[0], sums[1] + values[-2]
        means.append(sums[0] / sums[1])
        return out

    loop.steps.train = recording
    capsys.readouterr()
    row = loop.run().history[-1]
    shown = re.findall(r"(\d)/6\D.*? - loss: (\d\.\d{4})", capsys.readouterr().out)
    assert shown == [(str(k), f"{m:.4f}") for k, m in enumerate(means, start=1)]
    assert shown[-1][1] == f"{row['loss']:.4f}"


def test_the_lines_of_a_stop_mid_epoch_start_lines_of_their_own_after_the_progress_bar(real_loop, capsys, monkeypatch):
    import keras

    from train.run.train_log import setup_logging

    init = keras.utils.Progbar.__init__
    monkeypatch.setattr(keras.utils.Progbar, "__init__", lambda self, *a, **kw: init(self, *a, **kw, interval=0))
    loop = real_loop(epochs=1, progress="bar")
    _stop_after_steps(loop, 2)  # the stop's own line comes while the bar's line is open
    capsys.readouterr()
    setup_logging(None)  # the console of a run, on the captured stdout
    assert loop.run().status == "interrupted"
    lines = capsys.readouterr().out.replace("\r", "\n").splitlines()
    bars = [i for i, line in enumerate(lines) if "2/6" in line]
    stop = next(i for i, line in enumerate(lines) if "test stop: finishing the current call" in line)
    saved = next(i for i, line in enumerate(lines) if "saved a resumable state at epoch 1 step 2" in line)
    assert bars and max(bars) < stop < saved, lines
    assert not any("/6" in lines[i] for i in (stop, saved)), lines


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_auto_shows_the_bar_on_a_terminal_only(real_loop, capsys, monkeypatch, terminal):
    import sys

    loop = real_loop(epochs=1, progress="auto")
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    loop.run()
    assert ("6/6" in capsys.readouterr().out) is terminal


def test_the_end_of_a_run_writes_its_hparams_session(real_loop, train_log):
    """TensorBoard's HParams view: the settings, and the last epoch's monitors and the best value at the last epoch."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    loop = real_loop(epochs=3)
    result = loop.run()
    last = result.history[-1]
    hparams = _scalars(loop.run_dir / "tensorboard", "hparams/")
    assert hparams == {
        **{f"hparams/{m}": [(3, pytest.approx(last[m]))] for m in ("val_accuracy", "val_loss", "accuracy", "loss")},
        "hparams/best_val_accuracy": [(3, pytest.approx(result.best))],
    }
    acc = EventAccumulator(str(loop.run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    session = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert session.hparams["batch_size"].number_value == 64 and session.hparams["model"].string_value == "cnn"
    assert not [line for line in _log_lines(train_log) if "HParams" in line]


def test_hparams_that_cannot_be_written_only_warn(real_loop, monkeypatch, train_log):
    from train.run import metrics_files

    def full(*_a):
        raise OSError("No space left on device")

    monkeypatch.setattr(metrics_files, "write_hparams", full)
    result = real_loop(epochs=1).run()
    assert result.status == "completed"
    assert "WARNING: TensorBoard HParams not written: OSError: No space left on device" in _log_lines(train_log)


def test_a_run_stopped_before_its_first_epoch_writes_hparams_without_metrics(real_loop, train_log):
    from train.training.stop_flag import StopFlag

    stop = StopFlag()
    stop.request("received SIGTERM")
    loop = real_loop(epochs=1, stop=stop)
    loop.run()
    assert not [line for line in _log_lines(train_log) if "HParams" in line]
    assert _scalars(loop.run_dir / "tensorboard", "hparams/") == {}


def test_an_epoch_faster_than_a_peak_measured_under_load_raises_the_peak_and_says_so_once(
    real_loop, monkeypatch, train_log
):
    """MFU is a fraction of the peak: it never passes 1. Here the machine looked 1,000x slower than it
    is when the peak was measured (a busy probe), so the first epoch beats it."""
    import json

    from train.training import flops

    monkeypatch.setattr(flops, "measure_peak_flops", lambda dtype, device: 1e6)  # 1 MFLOP/s: absurdly busy
    loop = real_loop(epochs=2, peak_flops="auto")
    assert loop.peak.flops == 1e6
    result = loop.run()

    assert [r["mfu"] for r in result.history][0] == pytest.approx(1.0)
    assert all(r["mfu"] <= 1.0 + 1e-12 for r in result.history)
    raised = [line for line in _log_lines(train_log) if "more than the peak it was divided by" in line]
    assert len(raised) == 1 and "measured while the machine was busy" in raised[0]
    peak = json.loads((loop.run_dir / "manifest.json").read_text())["peak"]
    assert peak["origin"].startswith("raised at") and peak["flops"] >= result.history[0]["model_flops_per_second"]


def test_a_batch_larger_than_the_training_set_is_said_once_with_the_largest_that_fits(real_loop, caplog):
    caplog.set_level("WARNING", logger="train")
    real_loop(batch_size=1024)  # 384 training examples
    (line,) = [r.getMessage() for r in caplog.records if "BATCH_SIZE" in r.getMessage()]
    assert line == (
        "WARNING: BATCH_SIZE=1024 is larger than the 384 training examples: an epoch is one step of 384; "
        "give a BATCH_SIZE of at most 384"
    )


def test_a_completed_run_is_told_how_to_train_more_as_its_schedule_allows(tmp_path):
    from helpers import tiny_settings

    from train.training.loop import _how_to_train_more, _nothing_to_train

    cosine = tiny_settings(tmp_path, lr_schedule="cosine")
    said = _how_to_train_more(cosine)
    assert said.startswith("start a new run with a larger EPOCHS: LR_SCHEDULE=cosine decays over EPOCHS")
    assert _how_to_train_more(cosine.replace(lr_schedule="constant")) == "resume with a larger EPOCHS"
    assert _how_to_train_more(cosine.replace(smoke=True)).startswith("start a run without SMOKE")
    said = _nothing_to_train(cosine.replace(export=False, lr_schedule="constant"), 2, 1)
    assert said == (
        "2 epochs, more than EPOCHS=1, are trained already: nothing to train; the final weights and the test split "
        "are done again (to train more, resume with a larger EPOCHS)"
    )
