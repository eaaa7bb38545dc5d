"""PROFILE / PROFILE_STEPS: bad values refused before TensorFlow; a tiny training with PROFILE=steps
leaves a TensorFlow profile (*.xplane.pb) in RUN/tensorboard, PROFILE=off none; a worker that is not
the chief writes none; a run that ends inside or before the range keeps what was traced or says why
there is none; a profiler that cannot start costs nothing but a warning."""

from __future__ import annotations

import pytest
import test_loop

from train.config import load_settings, profile_steps
from train.errors import ConfigError

# The loop on a one-layer model (6 steps of 64 an epoch) and its captured log, as test_loop builds them.
real_loop, train_log, _log_lines = test_loop.real_loop, test_loop.train_log, test_loop._log_lines


def _profiles(run_dir):
    return sorted((run_dir / "tensorboard").glob("plugins/profile/*/*.xplane.pb"))


@pytest.mark.parametrize(
    "value, expected", [("10:15", (10, 15)), ("0:1", (0, 1)), (" 3 : 40 ", (3, 40)), ("100:200", (100, 200))]
)
def test_profile_steps_are_start_and_stop(value, expected):
    assert profile_steps(value) == expected


@pytest.mark.parametrize("value", ["", "10", "10-15", "15:10", "10:10", "-1:5", "a:b", "10:", ":15", "1:2:3", "1.5:3"])
def test_a_bad_profile_steps_is_one_error_naming_it_and_the_form(value):
    with pytest.raises(ConfigError) as info:
        load_settings({"profile_steps": value}, env_file=None, environ={})
    assert str(info.value) == (
        f"PROFILE_STEPS={value.strip()!r} is not valid: START:STOP, two whole numbers with 0 <= START < STOP, "
        "e.g. 10:15 (steps 10 to 14; the first steps trace and compile, so START is best 10 or more)"
    )


@pytest.mark.parametrize("value", ["on", "true", "epoch", "Steps", ""])
def test_a_bad_profile_mode_is_refused(value):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={"PROFILE": value})
    assert str(info.value) == f"PROFILE={value!r} is not valid: one of off, steps"


def test_profile_steps_writes_a_profile_of_the_range_into_the_tensorboard_folder(real_loop, train_log):
    loop = real_loop(epochs=1, profile="steps", profile_steps="2:4")
    assert loop.run().status == "completed"
    found = _profiles(loop.run_dir)
    assert len(found) == 1 and found[0].stat().st_size > 0
    said = [line for line in _log_lines(train_log) if line.startswith("profile of steps")]
    assert said == [
        f"profile of steps 2-3 written to {found[0].parent} (open it: tensorboard --logdir "
        f"{loop.run_dir / 'tensorboard'}, Profile tab)"
    ]


def test_calls_of_several_steps_end_on_the_ranges_edges_so_the_profile_holds_just_its_steps(real_loop, train_log):
    loop = real_loop(epochs=1, profile="steps", profile_steps="2:4", steps_per_execution=8)
    train, called = loop.steps.train, []
    loop.steps.train = lambda iterator, n, vote: called.append(int(n)) or train(iterator, n, vote)
    assert loop.run().status == "completed"
    assert called == [2, 2, 2]  # 6 steps an epoch: up to the range, the range, the rest
    said = [line for line in _log_lines(train_log) if line.startswith("profile of")]
    assert len(said) == 1 and said[0].startswith("profile of steps 2-3 written to ")


def test_a_worker_that_writes_no_profile_cuts_its_calls_as_the_chief_does(tmp_path):
    """Several workers' all-reduces pair up call by call: their calls must be the same sizes."""
    from train.training.profiling import for_run

    s = load_settings({"profile": "steps", "profile_steps": "10:15"}, env_file=None, environ={})
    chief, worker = for_run(s, tmp_path), for_run(s, None)
    assert worker.logdir is None
    for p in (chief, worker):
        p.done = 8
    assert chief.clip(8) == worker.clip(8) == 2
    off = for_run(load_settings({"profile_steps": "10:15"}, env_file=None, environ={}), tmp_path)
    off.done = 8
    assert off.clip(8) == 8


def test_profile_off_writes_no_profile(real_loop):
    loop = real_loop(epochs=1, profile="off", profile_steps="2:4")
    loop.run()
    assert _profiles(loop.run_dir) == []


def test_a_range_past_the_end_of_training_keeps_what_was_traced(real_loop):
    loop = real_loop(epochs=1, profile="steps", profile_steps="4:100")  # 6 steps an epoch
    loop.run()
    assert len(_profiles(loop.run_dir)) == 1


def test_a_range_after_the_last_step_says_why_there_is_no_profile(real_loop, train_log):
    loop = real_loop(epochs=1, profile="steps", profile_steps="10:15")
    assert loop.run().status == "completed"
    assert _profiles(loop.run_dir) == []
    assert (
        "WARNING: PROFILE=steps: training ended after 6 steps, before step 10: no profile written; "
        "lower PROFILE_STEPS (now 10:15)"
    ) in _log_lines(train_log)


def test_only_the_chief_profiles(real_loop, tmp_path):
    worker = real_loop(epochs=1, chief=False, profile="steps", profile_steps="1:3")
    assert worker.profiler.logdir is None
    assert worker.run().status == "completed"
    assert list(tmp_path.rglob("*.xplane.pb")) == []


def test_a_profiler_that_cannot_start_is_a_warning_and_training_goes_on(real_loop, train_log, monkeypatch):
    import tensorflow as tf

    def busy(logdir, options=None):
        raise tf.errors.AlreadyExistsError(None, None, "Another profiler is running.")

    monkeypatch.setattr(tf.profiler.experimental, "start", busy)
    loop = real_loop(epochs=1, profile="steps", profile_steps="1:3")
    assert loop.run().status == "completed"
    assert _profiles(loop.run_dir) == []
    assert (
        "WARNING: PROFILE=steps: the profiler did not start (AlreadyExistsError: Another profiler is running.)"
        in _log_lines(train_log)
    )


# Steps 2-4: three calls of one step, or of eight steps a call the two of 2-3 and 4 (CHECKPOINT_EVERY=4 ends one)
@pytest.mark.parametrize("per_call, calls", [(1, 3), (8, 2)])
def test_the_step_summary_reads_the_kinds_of_work_from_a_written_profile(real_loop, per_call, calls):
    """benchmarks/profile_ops.py, the table of docs/performance.md, on the profile of the one-layer model."""
    from helpers import benchmark_script

    profile_ops = benchmark_script("profile_ops")
    loop = real_loop(epochs=1, profile="steps", profile_steps="2:5", steps_per_execution=per_call)
    loop.run()
    summary = profile_ops.summarise(profile_ops.newest_profile(loop.run_dir / "tensorboard"))
    assert (summary["calls"], summary["steps"], summary["threads"] >= 1) == (calls, 3, True)
    kinds = summary["kinds"]
    for kind in ("dense layers (matmul), forward + backward", "optimizer (Adam update, float32)", profile_ops.EXECUTOR):
        median, fastest = kinds[kind]
        assert 0 < fastest <= median
    assert "| kind of work | share of the work | ms a step (median) | fastest step |" in profile_ops.tables(summary)


def test_the_trace_covers_the_whole_compiled_calls_that_hold_the_range(monkeypatch, tmp_path):
    """Under STEPS_PER_EXECUTION=4, PROFILE_STEPS=10:15 traces the calls of steps 8-11, 12-15."""
    import tensorflow as tf

    from train.training.profiling import StepProfiler

    calls = []
    monkeypatch.setattr(tf.profiler.experimental, "start", lambda logdir, options=None: calls.append(("start", done())))
    monkeypatch.setattr(tf.profiler.experimental, "stop", lambda: calls.append(("stop", done())))
    profiler = StepProfiler(tmp_path, 10, 15)
    done = lambda: profiler.done  # noqa: E731
    for _ in range(6):  # 24 steps in calls of 4
        profiler.before(4)
        profiler.after(4)
    profiler.close()
    assert calls == [("start", 8), ("stop", 16)]
