"""Sweeps (train/sweep/) are optional: a fork that deletes the folder and its CLI entry still trains,
and neither training nor any other command imports it (or Optuna).

Each test runs Python in a subprocess whose import system refuses train.sweep and optuna, as if they
were gone, and records who asked for them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import PROJECT_ROOT, subprocess_env

BLOCKER = """
import importlib.abc, json, sys, traceback
attempts = []
class NoSweep(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "optuna" or name == "train.sweep" or name.startswith("train.sweep."):
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoSweep())
from train import cli
del cli.OPTIONAL_COMMANDS["sweep"]
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


def test_the_package_and_its_commands_load_without_it():
    out = _run("""
import argparse
from train.training import fit, loop
code = cli.main(["settings", "--format", "table"])
commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
print(json.dumps({"code": code, "sweep": "sweep" in commands, "check": "check" in commands, "attempts": attempts}))
""")
    assert out == {"code": 0, "sweep": False, "check": True, "attempts": []}


@pytest.mark.slow
def test_training_never_reaches_into_sweeps(tmp_path):
    out = _run(
        """
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from helpers import tiny_settings
from train.training.fit import train
result = train(tiny_settings(Path(sys.argv[2]), epochs=1, export=False, report="off"))
print(json.dumps({"status": result.status, "attempts": attempts}))
""",
        str(PROJECT_ROOT / "tests"),
        str(tmp_path),
    )
    assert out == {"status": "completed", "attempts": []}
