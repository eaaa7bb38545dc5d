"""Benchmarks: `pytest benchmarks/` (`--bench-quick` or BENCH_QUICK=1: only that they run; `invoke bench` for figures).

Each benchmark compares two things side by side in one run, interleaved (the classic recipe of
benchmarks 1 and 2 in a process of its own: reference.RecipeProcess), and records the figures and the ratio in `benchmark.extra_info`; goals are reported (summarise.py), not asserted.
Quick mode shrinks data and repeats so that every benchmark only proves it runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import common`, `import reference`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `import train`
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import reference  # noqa: E402, F401  (its RECIPE_ENVIRON: the environment before the next line)

from train.setup.hardware import turn_on_onednn  # noqa: E402

# The template's sides run in this process with the CPU kernels a run of the template gets (train() does
# the same before TensorFlow's import); the recipe's own process keeps TensorFlow's choice.
turn_on_onednn()


def pytest_addoption(parser):
    parser.addoption(
        "--bench-quick",
        action="store_true",
        default=False,
        help="tiny data and budgets: check the benchmarks run (same as BENCH_QUICK=1)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "processes: starts TensorFlow processes or servers of its own, each a few seconds of CPU even in quick "
        "mode; CI's quick pass leaves these out (-m 'not processes'), `invoke bench --quick` runs them",
    )


def pytest_benchmark_update_machine_info(config, machine_info):
    """The CPU family the goals are chosen by (common.cpu_family), in the report summarise.py prints, and
    the cores this process may use: the machine's count (cpu.count) says nothing of `taskset -c 0`."""
    import os

    import common

    machine_info["cpu_family"] = common.cpu_family()
    machine_info["usable_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.bench)


@pytest.fixture(scope="session")
def quick(pytestconfig) -> bool:
    return bool(pytestconfig.getoption("--bench-quick")) or os.environ.get("BENCH_QUICK", "") not in ("", "0")


@pytest.fixture(scope="session")
def mnist(quick):
    """(arrays, description) shared by the MNIST benchmarks."""
    import common

    return common.mnist_arrays(quick)


@pytest.fixture(scope="session")
def mnist_npz(mnist, tmp_path_factory) -> Path:
    """The same arrays as a Keras-format .npz for DATASET=npz:<file>."""
    import common

    return common.write_npz(mnist[0], tmp_path_factory.mktemp("data") / "mnist.npz")
