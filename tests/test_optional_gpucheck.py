"""The GPU check (train/gpucheck/) is optional: a fork that deletes the folder and its CLI entry
still trains, and the training loop never reaches into it.

The tests run Python in a subprocess whose import system refuses train.gpucheck, as if the folder
were gone, and records who asked for it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT, subprocess_env

# Prepended to each script: train.gpucheck cannot be imported; every attempt is recorded with the
# files on the importing stack, and train.cli loses its entry as a fork would delete that line.
BLOCKER = """
import importlib.abc, json, sys, traceback
attempts = []
class NoGpuCheck(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "train.gpucheck" or name.startswith("train.gpucheck."):
            attempts.append([f.filename for f in traceback.extract_stack()])
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoGpuCheck())
from train import cli
cli.OPTIONAL_COMMANDS.clear()
"""


def _run(script: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + script, *args],
        cwd=PROJECT_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# One subprocess serves both tests (a TensorFlow start is most of what each costs): the package's
# commands and GPU facts first, then a training. The training test reads every attempt of the
# process, so an import at a module's top (made before the training began) is still its failure.
BOTH = """
import argparse
from pathlib import Path
from train.setup import devices
from train.training import fit, loop
from train.run import manifest
code = cli.main(["settings", "--format", "table"])
commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
package = {"code": code, "gpus": manifest.gpu_facts(), "memory": devices.gpu_memory(),
           "check": "check" in commands, "fit": "fit" in commands}
sys.path.insert(0, sys.argv[1])
from helpers import tiny_settings
from train import train
result = train(tiny_settings(Path(sys.argv[2])))
rows = (result.run_dir / "metrics.csv").read_text().splitlines()
print(json.dumps({"package": package, "training": {"status": result.status, "rows": len(rows) - 1,
                                                   "attempts": attempts}}))
"""


@pytest.fixture(scope="module")
def without_it(tmp_path_factory):
    return _run(BOTH, str(PROJECT_ROOT / "tests"), str(tmp_path_factory.mktemp("run")))


@pytest.mark.slow
def test_the_package_imports_and_records_no_gpus_without_it(without_it):
    out = without_it["package"]
    assert out == {"code": 0, "gpus": [], "memory": [None, None], "check": False, "fit": True}


@pytest.mark.slow
def test_training_never_reaches_into_the_gpu_check(without_it):
    out = without_it["training"]
    assert out["status"] == "completed" and out["rows"] == 2
    # The manifest may ask once per start (and records no GPUs); the epoch loop must never ask.
    from_loop = [
        stack
        for stack in out["attempts"]
        if any(f.endswith(("loop.py", "metrics_files.py", "train_log.py", "devices.py")) for f in stack)
    ]
    assert from_loop == []
