"""MirroredStrategy without GPUs: two logical CPU devices stand in for two GPUs.

The strategy path (model and optimizer built in scope, global batch split per replica, state
saved and restored across replicas) is otherwise only exercised on multi-GPU hosts.
"""

import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT, subprocess_env

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests")
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from train.setup import devices
real = devices.setup_devices
def two_replicas(settings, **probes):
    setup = real(settings, **probes)
    setup.strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    setup.replicas = 2
    return setup
devices.setup_devices = two_replicas
from helpers import tiny_settings
from train import train
s = tiny_settings(Path(tempfile.mkdtemp()), epochs=1)  # the export checked is the resumed run's
first = train(s)
again = train(s.replace(epochs=2, export=True), resume=first.run_dir.name)
log = (first.run_dir / "train.log").read_text()
print("RESUMED", again.status, again.epochs_completed, int(again.model.optimizer.iterations.numpy()),
      "16 per replica x 2" in log, again.export["max_abs_diff"])
r = train(tiny_settings(Path(tempfile.mkdtemp()), epochs=2, lr_schedule="cosine", export=False))
print("COSINE", r.status, *[row["learning_rate"] for row in r.history])
"""


@pytest.fixture(scope="module")
def lines():
    """SCRIPT's lines, by their first word: one fresh Python (two logical CPUs need a process of their
    own) serves both tests, as a TensorFlow start is most of what it costs."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.startswith(("RESUMED", "COSINE"))
    }


def test_two_replicas_train_resume_and_export(lines):
    line = lines["RESUMED"]
    # completed, 2 epochs, 12 steps each of 32 global (384 examples), the split stated in the log
    assert line[1:5] == ["completed", "2", "24", "True"], line
    assert float(line[5]) <= 1e-5


def test_two_replicas_follow_a_cosine_schedule_to_zero(lines):
    """The schedule's position lives in plain variables that every replica's compiled step reads."""
    line = lines["COSINE"]
    assert line[1] == "completed" and [float(v) for v in line[2:]] == pytest.approx([5e-4, 0.0], abs=1e-9)
