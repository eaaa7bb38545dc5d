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
