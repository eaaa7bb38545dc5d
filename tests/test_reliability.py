"""The fault matrix (issue 5): kills, signals, corrupt files, full disks, bad input -> what the user gets.

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
from faults import (fit_flags, kill_after_new_checkpoint, manifest, only_run, optimizer_iterations, run_fit,
                    run_python, start_fit, states, step_of, output, wait_until)
from helpers import make_npz

pytestmark = pytest.mark.slow

# 3 epochs x 24 steps: long enough on 2 cores for several kills to land mid-training.
GUARANTEE = dict(epochs=3, batch_size=16, checkpoint_every=4, deterministic=True, precision="float32", export=False)
STEPS_PER_EPOCH = 384 // 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_npz(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data):
    """The reference: the same configuration run straight through."""
    tmp = tmp_path_factory.mktemp("straight")
    rc, out = run_fit(fit_flags(tmp, data, **GUARANTEE), tmp)
    assert rc == 0, out[-3000:]
    run = only_run(tmp / "runs")
    return run, manifest(run)["final_weights_sha256"]


def _restored_step(text: str) -> int | None:
    m = re.search(r"resuming at epoch \d+, step \d+ \(global step (\d+)\)", text)
    return int(m.group(1)) if m else None


# -- 1. the guarantee ----------------------------------------------------------------------------
KILLS = 6


def test_sigkill_at_seeded_points_then_resume_is_bit_identical(tmp_path, data, uninterrupted):
    """SIGKILL at seeded delays after a new checkpoint appears, resume each time: same final SHA-256."""
    rng = random.Random(20261130)
    flags = fit_flags(tmp_path, data, **GUARANTEE)
    runs = tmp_path / "runs"
    kills, lost = 0, []
    proc = start_fit(flags, tmp_path)
    while True:
        killed = kills < KILLS and kill_after_new_checkpoint(proc, runs, delay=rng.uniform(0.0, 0.35))
        if not killed:
            assert proc.wait(timeout=180) == 0, output(proc)[-3000:]
            break
        kills += 1
        run = only_run(runs)
        on_disk = states(run)
        newest = step_of(max(on_disk))
        proc = start_fit(flags + ["--resume", run.name], tmp_path)
        # Wait for the resume line, then compare what was restored with the newest state on disk.
        wait_until(lambda: _restored_step(output(proc)) is not None, proc)
        restored = _restored_step(output(proc))
        assert restored == newest, (restored, on_disk)
        lost.append(newest)
    run = only_run(runs)
    straight_run, straight_sha = uninterrupted
    assert kills >= 5, f"only {kills} kills landed before the run finished"
    m = manifest(run)
    assert m["status"] == "completed" and len(m["resumed_at"]) == kills
    assert m["final_weights_sha256"] == straight_sha
    # Every step ran exactly once: the optimizer counted epochs x steps, as in the straight run.
    final = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    assert optimizer_iterations(final) == GUARANTEE["epochs"] * STEPS_PER_EPOCH
    # Work lost per kill is at most one interval: checkpoints are never further apart than CHECKPOINT_EVERY
    # within an epoch, and the restored state is always the newest one on disk (checked above).
    print(f"\nFIGURES guarantee: {kills} SIGKILL points, resumed from global steps {lost}, final sha identical: "
          f"{m['final_weights_sha256'] == straight_sha}")


# -- 2. SIGTERM ----------------------------------------------------------------------------------
def test_sigterm_saves_at_the_next_step_exits_75_and_resume_runs_every_step_once(tmp_path, data, uninterrupted):
    flags = fit_flags(tmp_path, data, **GUARANTEE)
    proc = start_fit(flags, tmp_path)
    assert kill_after_new_checkpoint(proc, tmp_path / "runs", delay=0.1, sig=signal.SIGTERM)
    assert proc.returncode == 75, output(proc)[-3000:]
    out = output(proc)
    assert "received SIGTERM" in out and "saved a resumable state" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    assert manifest(run)["status"] == "interrupted"
    rc, out = run_fit(flags + ["--resume", run.name], tmp_path)
    assert rc == 0, out[-3000:]
    final = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    assert optimizer_iterations(final) == GUARANTEE["epochs"] * STEPS_PER_EPOCH
    assert manifest(run)["final_weights_sha256"] == uninterrupted[1]


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


def test_kill_during_checkpoint_writes_leaves_a_loadable_state_and_temp_files_are_cleaned(tmp_path, data, uninterrupted):
    import subprocess
    import sys

    from faults import env
    from train.checkpoints import LATEST, read_state

    flags = fit_flags(tmp_path, data, **GUARANTEE)
    runs, loadable, tried = tmp_path / "runs", 0, 0
    for target in random.Random(5).sample(range(2, 7), 4):
        resume = ["--resume", only_run(runs).name] if runs.is_dir() else []
        proc = subprocess.run([sys.executable, "-c", DIE_IN_SAVE, str(target), "fit", *flags, *resume],
                              cwd=tmp_path, capture_output=True, text=True, env=env(), timeout=180)
        assert proc.returncode == 137, proc.stderr[-3000:]
        tried += 1
        ckpts = only_run(runs) / "checkpoints"
        assert list(ckpts.glob("*.tmp-*")), "the dying writer should leave its temp file"
        loadable += read_state(ckpts / (ckpts / LATEST).read_text().strip()) is not None
    rc, out = run_fit(flags + ["--resume", only_run(runs).name], tmp_path)
    assert rc == 0, out[-3000:]
    run = only_run(runs)
    assert "removed a temp file left by an interrupted write" in (run / "train.log").read_text()
    assert not list(run.rglob("*.tmp-*"))
    assert manifest(run)["final_weights_sha256"] == uninterrupted[1]
    assert loadable == tried
    print(f"\nFIGURES checkpoint-write kills: {tried} tried, {loadable} left a loadable checkpoint; "
          "final sha identical: True")


# -- a small finished run (dense16, 1 epoch), copied for the tests that damage it ----------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("small")
    flags = fit_flags(tmp, data, epochs=1, model="faults:dense16", export=False)
    rc, out = run_fit(flags, tmp)
    assert rc == 0, out[-3000:]
    return tmp, only_run(tmp / "runs")


@pytest.fixture
def small_copy(tmp_path, small_run, data):
    import shutil

    src_tmp, run = small_run
    shutil.copytree(src_tmp / "runs", tmp_path / "runs")
    return tmp_path, tmp_path / "runs" / run.name, fit_flags(tmp_path, data, epochs=1, model="faults:dense16",
                                                             export=False)


# -- 4. corrupt latest checkpoint ------------------------------------------------------------------
def test_corrupt_latest_checkpoint_falls_back_with_a_warning_naming_it(small_copy):
    tmp, run, flags = small_copy
    names = states(run)
    assert names == ["ckpt-000000004.npz", "ckpt-000000008.npz", "ckpt-000000012.npz"]
    (run / "checkpoints" / names[-1]).write_bytes(b"garbage" * 100)
    rc, out = run_fit(flags + ["--epochs", "2", "--resume", run.name], tmp)
    assert rc == 0, out[-3000:]
    assert re.search(r"WARNING: checkpoint \S*ckpt-000000012\.npz is unreadable", out)
    assert _restored_step(out) == 8


def test_no_valid_checkpoint_is_an_error_never_a_fresh_start(small_copy):
    tmp, run, flags = small_copy
    for name in states(run):
        p = run / "checkpoints" / name
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])  # truncated
    rc, out = run_fit(flags + ["--epochs", "2", "--resume", run.name], tmp)
    assert rc == 4, out[-3000:]
    assert "CheckpointError: no valid checkpoint" in out and "Traceback" not in out
    assert "epoch 2/2" not in out and len(states(run)) == 3


# -- 8. architecture changed on resume -------------------------------------------------------------
def test_resume_with_a_different_architecture_is_refused_naming_the_layer_and_shapes(small_copy):
    tmp, run, flags = small_copy
    rc, out = run_fit(flags + ["--model", "faults:dense32", "--epochs", "2", "--resume", run.name, "--force"], tmp)
    assert rc == 4, out[-3000:]
    assert re.search(r"CheckpointError: model variable hidden/kernel has shape \(784, 32\) in the model but "
                     r"\(784, 16\) in checkpoint ckpt-000000012\.npz", out), out[-2000:]
    assert "Traceback" not in out


# -- 9. settings changed on resume -----------------------------------------------------------------
def test_changed_settings_are_refused_listing_differences_unless_forced(small_copy):
    tmp, run, flags = small_copy
    rc, out = run_fit(flags + ["--learning-rate", "0.01", "--batch-size", "16", "--resume", run.name], tmp)
    assert rc == 4, out[-3000:]
    assert "ResumeMismatchError" in out and "LEARNING_RATE: 0.001 -> 0.01" in out and "BATCH_SIZE: 32 -> 16" in out
    assert "--force" in out and "Traceback" not in out
    rc, out = run_fit(flags + ["--learning-rate", "0.01", "--epochs", "2", "--resume", run.name, "--force"], tmp)
    assert rc == 0, out[-3000:]
    assert json.loads((run / "config.json").read_text())["learning_rate"] == 0.01


# -- 6. NaN loss ----------------------------------------------------------------------------------
def test_nan_loss_exits_5_keeps_the_last_good_checkpoint_and_says_what_to_change(tmp_path, data):
    from train.checkpoints import load_latest

    flags = fit_flags(tmp_path, data, epochs=1, model="faults:nan_after_10_steps", export=False)
    rc, out = run_fit(flags, tmp_path)
    assert rc == 5, out[-3000:]
    assert "DivergedError" in out and "LEARNING_RATE" in out and "Traceback" not in out
    run = only_run(tmp_path / "runs")
    assert states(run) == ["ckpt-000000004.npz", "ckpt-000000008.npz"]
    loaded = load_latest(run / "checkpoints")
    assert loaded.path.name == "ckpt-000000008.npz"
    assert all(np.isfinite(a).all() for a in loaded.model_arrays)
    assert manifest(run)["status"] == "failed"
