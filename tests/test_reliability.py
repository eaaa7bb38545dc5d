"""The fault matrix: kills, signals, corrupt files, full disks, bad input -> what the user gets.

Most tests run `python -m train fit` in a subprocess (tests/faults.py) and check the exit code, the
message and the files left behind. Figures (kill points tried, bit-identical resumes) are printed;
`pytest -s` shows them.
"""

from __future__ import annotations

import json
import random
import re
import signal

import numpy as np
import pytest
from builders import write_tiny_npz
from faults import (
    fit_flags,
    kill_after_new_checkpoint,
    manifest,
    only_run,
    optimizer_iterations,
    output,
    run_fit,
    start_fit,
    states,
    step_of,
    wait_until,
)
from helpers import fit_here, fit_in_process

pytestmark = pytest.mark.slow

# 5 epochs x 24 steps: long enough on 2 cores for several kills to land mid-training.
GUARANTEE = dict(epochs=5, batch_size=16, checkpoint_every=4, deterministic=True, precision="float32", export=False)
STEPS_PER_EPOCH = 384 // 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_npz(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data):
    """The reference: the same configuration run straight through (in this process: the resumes of
    the killed runs, each in a process of its own, must end on its very weights)."""
    tmp = tmp_path_factory.mktemp("straight")
    assert fit_in_process(tmp, fit_flags(tmp, data, **GUARANTEE)) == 0
    run = only_run(tmp / "runs")
    return run, manifest(run)["final_weights_sha256"]


def _restored_step(text: str) -> int | None:
    m = re.search(r"resuming at epoch \d+, step \d+ \(global step (\d+)\)", text)
    return int(m.group(1)) if m else None


# -- 1. the guarantee ----------------------------------------------------------------------------
# Each kill costs a process start (TensorFlow's import is most of a tiny run): three seeded points,
# one of them usually inside a checkpoint write, show the guarantee; the write itself is killed at
# chosen points in section 3.
KILLS = 3


def test_sigkill_at_seeded_points_then_resume_is_bit_identical(tmp_path, data, uninterrupted):
    """SIGKILL at seeded delays after a new checkpoint appears, resume each time: same final SHA-256."""
    rng = random.Random(20261130)
    flags = fit_flags(tmp_path, data, **GUARANTEE)
    runs = tmp_path / "runs"
    kills, lost, in_write = 0, [], 0
    proc = start_fit(flags, tmp_path)
    while True:
        killed = kills < KILLS and kill_after_new_checkpoint(proc, runs, delay=rng.uniform(0.0, 0.35))
        if not killed:
            assert proc.wait(timeout=180) == 0, output(proc)[-3000:]
            break
        kills += 1
        run = only_run(runs)
        on_disk = states(run)
        in_write += bool(list((run / "checkpoints").glob("*.tmp-*")))
        newest = step_of(max(on_disk))
        proc = start_fit(flags + ["--resume", run.name], tmp_path)
        # Wait for the resume line, then compare what was restored with the newest state on disk.
        wait_until(lambda proc=proc: _restored_step(output(proc)) is not None, proc)
        restored = _restored_step(output(proc))
        assert restored == newest, (restored, on_disk)
        lost.append(newest)
    run = only_run(runs)
    straight_run, straight_sha = uninterrupted
    assert kills == KILLS, f"only {kills} kills landed before the run finished"
    m = manifest(run)
    assert m["status"] == "completed" and len(m["resumed_at"]) == kills
    assert m["final_weights_sha256"] == straight_sha
    # Every step ran exactly once: the optimizer counted epochs x steps, as in the straight run.
    final = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    assert optimizer_iterations(final) == GUARANTEE["epochs"] * STEPS_PER_EPOCH
    # Work lost per kill is at most one interval: checkpoints are never further apart than CHECKPOINT_EVERY
    # within an epoch, and the restored state is always the newest one on disk (checked above).
    print(
        f"\nFIGURES guarantee: {kills} SIGKILL points, resumed from global steps {lost} ({in_write} during a checkpoint write), final sha identical: "
        f"{m['final_weights_sha256'] == straight_sha}"
    )


# -- 2. SIGTERM ----------------------------------------------------------------------------------
def _signal_when(proc, predicate, sig=signal.SIGTERM) -> bool:
    """Send `sig` as soon as `predicate()` holds: an event of the run, never a delay."""
    if not wait_until(predicate, proc) or proc.poll() is not None:
        return False
    proc.send_signal(sig)
    proc.wait(timeout=180)
    return True


def _log_has(runs_dir, text):
    def check():
        logs = list(runs_dir.glob("*/train.log")) if runs_dir.is_dir() else []
        return any(text in p.read_text(errors="replace") for p in logs)

    return check


def _has_state(runs_dir, min_step=0):
    def check():
        from train.run.find import list_run_dirs

        return any(step_of(s) >= min_step for r in list_run_dirs(runs_dir) for s in states(r))

    return check


def _resume_matches_uninterrupted(tmp_path, flags, run, uninterrupted, monkeypatch, capsys):
    """The resume in this process: what the stop left on disk is the test's, not the process that resumes."""
    from train.run.checkpoints import LATEST

    rc, out = fit_here(tmp_path, monkeypatch, capsys, flags + ["--resume", run.name])
    assert rc == 0, out[-3000:]
    final = run / "checkpoints" / (run / "checkpoints" / LATEST).read_text().strip()
    assert optimizer_iterations(final) == GUARANTEE["epochs"] * STEPS_PER_EPOCH
    assert manifest(run)["final_weights_sha256"] == uninterrupted[1]
    return out


# The start-up points: just after the run directory exists (TensorFlow, devices and data still to
# come), and the moment the initial state is on disk (the loop not yet started).
START_UP_POINTS = {
    "run-directory": lambda runs: _log_has(runs, "run "),
    "initial-state": lambda runs: _has_state(runs),
}


@pytest.mark.parametrize("point", START_UP_POINTS)
def test_sigterm_at_any_moment_of_start_up_exits_75_with_the_manifest_finished(
    tmp_path, data, uninterrupted, point, monkeypatch, capsys
):
    flags = fit_flags(tmp_path, data, **GUARANTEE)
    proc = start_fit(flags, tmp_path)
    assert _signal_when(proc, START_UP_POINTS[point](tmp_path / "runs")), output(proc)[-3000:]
    out = output(proc)
    assert proc.returncode == 75, out[-3000:]
    assert "received SIGTERM" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    record = manifest(run)
    assert record["status"] == "interrupted" and record["ended_at"]
    _resume_matches_uninterrupted(tmp_path, flags, run, uninterrupted, monkeypatch, capsys)


def test_sigterm_saves_at_the_next_step_exits_75_and_resume_runs_every_step_once(
    tmp_path, data, uninterrupted, monkeypatch, capsys
):
    from train.run.checkpoints import LATEST, read_state

    flags = fit_flags(tmp_path, data, **GUARANTEE)
    proc = start_fit(flags, tmp_path)
    # Training is under way once the state of global step 8 exists (CHECKPOINT_EVERY=4).
    assert _signal_when(proc, _has_state(tmp_path / "runs", min_step=8)), output(proc)[-3000:]
    out = output(proc)
    assert proc.returncode == 75, out[-3000:]
    assert "received SIGTERM" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    assert manifest(run)["status"] == "interrupted"
    # The newest state is the one saved on the stop, at the step where training stopped.
    saved = re.search(r"saved a resumable state at epoch (\d+) step (\d+)", out)
    assert saved, out[-3000:]
    newest = read_state(run / "checkpoints" / (run / "checkpoints" / LATEST).read_text().strip()).meta
    assert (newest["epoch"] + 1, newest["step"]) == (int(saved.group(1)), int(saved.group(2)))
    assert newest["global_step"] >= 8
    out = _resume_matches_uninterrupted(tmp_path, flags, run, uninterrupted, monkeypatch, capsys)
    # Every step runs once: the resumed segment starts exactly where the stop saved.
    assert _restored_step(out) == newest["global_step"]


def test_a_terminal_that_hangs_up_mid_training_stops_the_run_as_sigterm_does(tmp_path, data):
    """An SSH connection that drops: the kernel hangs up the run's terminal (SIGHUP, and every later write
    to it fails with EIO). The run died unsaved, its manifest left "running"; now it saves and exits 75."""
    import fcntl
    import os
    import pty
    import select
    import subprocess
    import sys
    import termios
    import threading

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "train", "fit", *fit_flags(tmp_path, data, **GUARANTEE)],
        cwd=tmp_path,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # the pty is its terminal, as a login's is
    )
    os.close(slave)
    shown, done = [], threading.Event()

    def drain():  # the terminal's reader: a full pty would hold the run in its next write
        while not done.is_set():
            if select.select([master], [], [], 0.1)[0]:
                try:
                    shown.append(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        assert wait_until(_has_state(tmp_path / "runs", min_step=8), proc), b"".join(shown)[-3000:]
    finally:
        done.set()
        reader.join()
        os.close(master)  # the terminal goes away
    assert proc.wait(timeout=180) == 75, b"".join(shown)[-3000:]
    run = only_run(tmp_path / "runs")
    assert manifest(run)["status"] == "interrupted"
    log = (run / "train.log").read_text()
    assert "received SIGHUP: finishing the current call of steps, then saving" in log, log[-3000:]
    assert re.search(r"saved a resumable state at epoch \d+ step \d+", log) and "Error" not in log, log[-3000:]


SLOW_STOP_SAVE = """
import sys, time
from train.training import loop
real = loop.EpochLoop._save
def slow_save(self, why):
    if why.startswith("stop requested"):  # a save slower than the user's patience (a large model, a slow disk)
        end = time.monotonic() + 600
        while time.monotonic() < end:
            time.sleep(0.05)
    real(self, why)
loop.EpochLoop._save = slow_save
from train.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_second_ctrl_c_stops_at_once_with_exit_130_and_the_last_state_kept(tmp_path, data):
    import subprocess
    import sys

    from faults import env

    flags = fit_flags(tmp_path, data, **GUARANTEE)
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_STOP_SAVE, "fit", *flags],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env(),
        )
    proc.out_path = tmp_path / "out.txt"
    try:
        assert wait_until(_has_state(tmp_path / "runs", min_step=4), proc), output(proc)[-3000:]
        proc.send_signal(signal.SIGINT)
        assert wait_until(lambda: "received SIGINT" in output(proc), proc), output(proc)[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 130, output(proc)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = output(proc)
    assert text.strip().splitlines()[-1].startswith("Stopped at once (second Ctrl-C)"), text[-3000:]
    assert "Traceback" not in text
    run = only_run(tmp_path / "runs")
    assert manifest(run)["status"] == "interrupted" and states(run)  # the states saved before are kept


# -- 3. kill during a checkpoint write -------------------------------------------------------------
DIE_IN_SAVE = """
import os, sys, numpy as np
target, calls, real = int(sys.argv[1]), [0], np.savez
def dying_savez(path, *args, **arrays):
    calls[0] += 1
    real(path, *args, **arrays)
    if calls[0] == target:  # the writer dies half-way: half a file on disk, no cleanup
        data = open(path, 'rb').read()
        open(path, 'wb').write(data[: len(data) // 2])
        os._exit(137)
np.savez = dying_savez
from train.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_kill_during_checkpoint_writes_leaves_a_loadable_state_and_temp_files_are_cleaned(
    tmp_path, data, uninterrupted, monkeypatch, capsys
):
    import subprocess
    import sys

    from faults import env

    from train.errors import CheckpointError
    from train.run.checkpoints import LATEST, load_latest, read_state

    flags = fit_flags(tmp_path, data, **GUARANTEE)
    runs, loadable, tried = tmp_path / "runs", 0, 0
    for target in random.Random(5).sample(range(2, 7), 2):
        resume = ["--resume", only_run(runs).name] if runs.is_dir() else []
        proc = subprocess.run(
            [sys.executable, "-c", DIE_IN_SAVE, str(target), "fit", *flags, *resume],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env(),
            timeout=180,
        )
        assert proc.returncode == 137, proc.stderr[-3000:]
        tried += 1
        ckpts = only_run(runs) / "checkpoints"
        assert list(ckpts.glob("*.tmp-*")), "the dying writer should leave its temp file"
        try:  # the pointer names a complete state, and it is the newest one (the dying write is not)
            pointed = read_state(ckpts / (ckpts / LATEST).read_text().strip())
        except CheckpointError:
            continue
        loadable += pointed.path == load_latest(ckpts).path
    rc, out = fit_here(tmp_path, monkeypatch, capsys, flags + ["--resume", only_run(runs).name])  # in this process
    assert rc == 0, out[-3000:]
    run = only_run(runs)
    assert "removed a temp file left by an interrupted write" in (run / "train.log").read_text()
    assert not list(run.rglob("*.tmp-*"))
    assert manifest(run)["final_weights_sha256"] == uninterrupted[1]
    assert loadable == tried
    print(
        f"\nFIGURES checkpoint-write kills: {tried} tried, {loadable} left a loadable checkpoint; "
        "final sha identical: True"
    )


# -- a small finished run (dense16, 1 epoch), copied for the tests that damage it ----------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("small")
    assert fit_in_process(tmp, fit_flags(tmp, data, epochs=1, model="faults:dense16", export=False)) == 0
    return tmp, only_run(tmp / "runs")


@pytest.fixture
def small_copy(tmp_path, small_run, data):
    import shutil

    src_tmp, run = small_run
    shutil.copytree(src_tmp / "runs", tmp_path / "runs")
    return (
        tmp_path,
        tmp_path / "runs" / run.name,
        fit_flags(tmp_path, data, epochs=1, model="faults:dense16", export=False),
    )


# -- 4. corrupt latest checkpoint ------------------------------------------------------------------
def test_corrupt_latest_checkpoint_falls_back_with_a_warning_naming_it(small_copy, monkeypatch, capsys):
    tmp, run, flags = small_copy
    names = states(run)
    assert names == ["ckpt-000000004.npz", "ckpt-000000008.npz", "ckpt-000000012.npz"]
    (run / "checkpoints" / names[-1]).write_bytes(b"garbage" * 100)
    rc, out = fit_here(tmp, monkeypatch, capsys, flags + ["--epochs", "2", "--resume", run.name])
    assert rc == 0, out[-3000:]
    assert re.search(r"WARNING: checkpoint \S*ckpt-000000012\.npz is unreadable", out)
    assert _restored_step(out) == 8


def test_no_valid_checkpoint_is_an_error_never_a_fresh_start(small_copy, monkeypatch, capsys):
    tmp, run, flags = small_copy
    for name in states(run):
        p = run / "checkpoints" / name
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])  # truncated
    rc, out = fit_here(tmp, monkeypatch, capsys, flags + ["--epochs", "2", "--resume", run.name])
    assert rc == 4, out[-3000:]
    assert "CheckpointError: no valid checkpoint" in out and "Traceback" not in out
    assert "epoch 2/2" not in out and len(states(run)) == 3


# -- 8. architecture changed on resume -------------------------------------------------------------
def test_resume_with_a_different_architecture_is_refused_naming_the_layer_and_shapes(small_copy, monkeypatch, capsys):
    tmp, run, flags = small_copy
    rc, out = fit_here(
        tmp,
        monkeypatch,
        capsys,
        flags + ["--model", "faults:dense32", "--epochs", "2", "--resume", run.name, "--force"],
    )
    assert rc == 4, out[-3000:]
    assert re.search(
        r"CheckpointError: model variable hidden/kernel has shape \(784, 32\) in the model but "
        r"\(784, 16\) in checkpoint ckpt-000000012\.npz",
        out,
    ), out[-2000:]
    assert "Traceback" not in out


# -- 9. settings changed on resume -----------------------------------------------------------------
def test_changed_settings_are_refused_listing_differences_unless_forced(small_copy, monkeypatch, capsys):
    tmp, run, flags = small_copy
    rc, out = fit_here(
        tmp, monkeypatch, capsys, flags + ["--learning-rate", "0.01", "--batch-size", "16", "--resume", run.name]
    )
    assert rc == 4, out[-3000:]
    assert "ResumeMismatchError" in out and "LEARNING_RATE: 0.001 -> 0.01" in out and "BATCH_SIZE: 32 -> 16" in out
    assert "--force" in out and "Traceback" not in out
    rc, out = fit_here(
        tmp, monkeypatch, capsys, flags + ["--learning-rate", "0.01", "--epochs", "2", "--resume", run.name, "--force"]
    )
    assert rc == 0, out[-3000:]
    assert json.loads((run / "config.json").read_text())["learning_rate"] == 0.01


# -- 6. NaN loss ----------------------------------------------------------------------------------
def test_nan_loss_exits_5_keeps_the_last_good_checkpoint_and_says_what_to_change(tmp_path, data, monkeypatch, capsys):
    from train.run.checkpoints import load_latest

    flags = fit_flags(tmp_path, data, epochs=1, model="faults:nan_after_10_steps", export=False)
    rc, out = fit_here(tmp_path, monkeypatch, capsys, flags)
    assert rc == 5, out[-3000:]
    assert "DivergedError: loss is nan in epoch 1: training diverged" in out, out[-3000:]
    assert "Lower LEARNING_RATE" in out and "PRECISION=float32" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    # The initial state, then one every 4 steps until the loss turned NaN (step 10): none after it.
    assert states(run) == ["ckpt-000000000.npz", "ckpt-000000004.npz", "ckpt-000000008.npz"]
    loaded = load_latest(run / "checkpoints")
    assert loaded.path.name == "ckpt-000000008.npz"
    assert all(np.isfinite(a).all() for a in loaded.model_arrays)
    assert manifest(run)["status"] == "failed"


# -- 7. out of memory (injected ResourceExhaustedError), in-process through the CLI edge ------------
def _oom_after(monkeypatch, good_calls: int, times: int):
    """Make EpochLoop._fit raise ResourceExhaustedError on calls good_calls+1 .. good_calls+times."""
    import tensorflow as tf

    from train.training import loop

    real, calls = loop.EpochLoop._fit, {"n": 0}

    def fake(self, ds, saver):
        calls["n"] += 1
        if good_calls < calls["n"] <= good_calls + times:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
        return real(self, ds, saver)

    monkeypatch.setattr(loop.EpochLoop, "_fit", fake)
    return calls


def _cli(tmp_path, monkeypatch, flags):
    from train.cli import main

    monkeypatch.chdir(tmp_path)
    return main(["fit", *flags])


def test_oom_without_auto_batch_exits_6_with_the_remedies(tmp_path, data, monkeypatch, capsys):
    _oom_after(monkeypatch, good_calls=0, times=1)
    rc = _cli(tmp_path, monkeypatch, fit_flags(tmp_path, data, epochs=1, model="faults:dense16", export=False))
    err = capsys.readouterr().err
    assert rc == 6, err
    assert "OutOfMemoryError" in err and "at batch size 32" in err
    for remedy in ("BATCH_SIZE", "mixed_float16", "IMAGE_SIZE", "other processes on the GPU"):
        assert remedy in err


def test_oom_with_auto_batch_halves_the_batch_from_the_last_checkpoint_at_most_three_times(
    tmp_path, data, monkeypatch, capsys
):
    calls = _oom_after(monkeypatch, good_calls=1, times=1)  # epoch 1 fits, epoch 2 runs out of memory once
    flags = fit_flags(tmp_path, data, epochs=2, model="faults:dense16", export=False, auto_batch=True)
    assert _cli(tmp_path, monkeypatch, flags) == 0, capsys.readouterr().err
    run = only_run(tmp_path / "runs")
    log = (run / "train.log").read_text()
    assert (
        "out of GPU memory at batch size 32; AUTO_BATCH: continuing from the last checkpoint with batch size 16 (1/3)"
        in log
    )
    rows = (run / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert [r.split(",")[header.index("batch_size")] for r in rows[1:]] == ["32", "16"]
    assert calls["n"] == 3
    # A resume with the same BATCH_SIZE keeps the halved batch: only a forced new BATCH_SIZE replaces it.
    assert _cli(tmp_path, monkeypatch, [*flags, "--epochs", "3", "--resume", run.name]) == 0, capsys.readouterr().err
    rows = (run / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[header.index("batch_size")] for r in rows[1:]] == ["32", "16", "16"]
    # Bounded: an OOM that never goes away stops after three halvings (32 -> 16 -> 8 -> 4) with exit 6.
    _oom_after(monkeypatch, good_calls=0, times=100)
    rc = _cli(
        tmp_path,
        monkeypatch,
        fit_flags(tmp_path / "x", data, epochs=1, model="faults:dense16", export=False, auto_batch=True),
    )
    err = capsys.readouterr().err
    assert rc == 6 and "at batch size 4" in err, err


# -- 5. disk full ---------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root / CAP_SYS_ADMIN)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_keeps_the_last_good_checkpoint_and_names_the_path(tmp_path, data, small_disk):
    from train.run.checkpoints import load_latest

    # The CNN's states are ~2.7 MB each: two (the initial state and step 4) fit on a 7 MB disk,
    # the third does not.
    flags = fit_flags(tmp_path, data, epochs=1, runs_dir=small_disk / "runs", export=False)
    rc, out = run_fit(flags, tmp_path)
    assert rc == 7, out[-3000:]
    # Whichever write meets the full disk first (the state at step 8 or best.weights.h5) is named.
    assert re.search(
        r"StorageError: cannot write \S+/(checkpoints/ckpt-000000008\.npz|best\.weights\.h5): "
        r"the disk is full",
        out,
    ), out[-2000:]
    assert "Traceback" not in out
    run = only_run(small_disk / "runs")
    assert not list(run.rglob("*.tmp-*")) and not (run / "final.weights.h5").exists()
    assert states(run) == ["ckpt-000000000.npz", "ckpt-000000004.npz"]
    assert load_latest(run / "checkpoints").path.name == "ckpt-000000004.npz"


# -- 12. unwritable runs directory ----------------------------------------------------------------
NO_TF = """
import sys
from train.cli import main
rc = main(sys.argv[1:])
print('tensorflow imported:', 'tensorflow' in sys.modules)
sys.exit(rc)
"""


def _no_tf(tmp_path, args, **extra_env):
    import subprocess
    import sys

    from faults import env

    return subprocess.run(
        [sys.executable, "-c", NO_TF, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env(**extra_env),
        timeout=120,
    )


def test_runs_dir_under_a_file_is_refused_before_training(tmp_path, data):
    (tmp_path / "afile").write_text("x")
    p = _no_tf(tmp_path, ["fit", *fit_flags(tmp_path, data, runs_dir=tmp_path / "afile" / "runs")])
    assert p.returncode == 7, p.stderr
    assert "StorageError: RUNS_DIR=" in p.stderr and "afile is a file" in p.stderr and "Traceback" not in p.stderr
    assert "tensorflow imported: False" in p.stdout


def test_read_only_runs_dir_is_refused_before_training(tmp_path, data):
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        p = _no_tf(tmp_path, ["fit", *fit_flags(tmp_path, data, runs_dir=ro)])
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
    assert p.returncode == 7, p.stderr
    assert f"StorageError: cannot write {ro}: the file system is read-only" in p.stderr
    assert "tensorflow imported: False" in p.stdout


# -- 10. malformed settings -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, environ, name",
    [
        ([], {"EPOCHS": "abc"}, "EPOCHS"),
        (["--batch-size", "-4"], {}, "BATCH_SIZE"),
        ([], {"PRECISION": "float8"}, "PRECISION"),
        (["--lr-schedule", "linear"], {}, "LR_SCHEDULE"),
    ],
)
def test_malformed_settings_exit_2_before_tensorflow_naming_the_setting(tmp_path, data, args, environ, name):
    p = _no_tf(tmp_path, ["fit", "--dataset", f"npz:{data}", "--runs-dir", str(tmp_path / "runs"), *args], **environ)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"ConfigError: {name}=") and "Traceback" not in p.stderr
    assert "tensorflow imported: False" in p.stdout
    assert not (tmp_path / "runs").exists()


def test_debug_setting_shows_the_traceback_and_keeps_the_exit_code(tmp_path, data):
    for extra in ({"DEBUG": "1"}, {}):
        p = _no_tf(
            tmp_path,
            ["fit", "--dataset", f"npz:{data}", "--epochs", "abc"] + (["--debug"] if not extra else []),
            **extra,
        )
        assert p.returncode == 2 and "Traceback" in p.stderr and "ConfigError: EPOCHS=" in p.stderr, p.stderr


# -- 11. corrupt or truncated data ----------------------------------------------------------------
def test_corrupt_data_is_refused_before_training_naming_the_file(tmp_path, data):
    import subprocess
    import sys

    from faults import env

    blob = data.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(blob[: len(blob) // 2])
    flipped = tmp_path / "flipped.npz"
    mid = bytearray(blob)
    mid[len(mid) // 3] ^= 0xFF  # inside x_train's bytes: only a full read (CRC) notices
    flipped.write_bytes(bytes(mid))
    empty = tmp_path / "empty"
    empty.mkdir()
    images = tmp_path / "images"
    from PIL import Image

    for c in ("a", "b"):
        (images / c).mkdir(parents=True)
        for i in range(10):  # VAL_SPLIT=0.1 leaves one validation image per class
            Image.fromarray(np.full((16, 16, 3), 20 * i, np.uint8)).save(images / c / f"{i}.png")
    (images / "b" / "2.png").write_text("not an image")
    cases = {
        "truncated.npz": f"npz:{truncated}",
        "flipped.npz": f"npz:{flipped}",
        "empty": f"images:{empty}",
        "2.png": f"images:{images}",
    }
    code = (
        "import sys, json\nfrom train.cli import main\nout = {}\n"
        "for name, ds in json.loads(sys.argv[1]).items():\n"
        "    out[name] = main(['fit', '--dataset', ds, *sys.argv[2:]])\n"
        "    print('RC', name, out[name], file=sys.stderr, flush=True)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases), *fit_flags(tmp_path, data, image_size=16)[2:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env(),
        timeout=180,
    )
    err = p.stderr
    for name in cases:
        assert f"RC {name} 3" in err, err[-3000:]
        assert re.search(rf"DataError: \S*{re.escape(name)}", err), (name, err[-3000:])
    assert "Traceback" not in err and "epoch 1/" not in err
    assert not list((tmp_path / "runs").glob("*/checkpoints/ckpt-*"))
