"""Shared fixtures (generated data under tmp_path, from builders.py), the servers' plugins, and the suite's own rules."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from pathlib import Path

import helpers
import pytest
from builders import write_image_dir, write_npz

# Under pytest-xdist every worker is a TensorFlow process of its own: one intra-op thread each, so
# that N workers on N cores do not each start N threads and fight over them. Set before any test
# imports TensorFlow; the training subprocesses the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

# The tests' own TensorFlow runs the CPU kernels a run's process chooses (train() turns oneDNN on before
# its import where TensorFlow would not): the runs the tests start in subprocesses must train bit for bit
# as the ones they train here, which an AVX2-only CPU would otherwise run on Eigen's kernels.
from train.setup.hardware import turn_on_onednn  # noqa: E402

turn_on_onednn()

# Real servers, each in its own module, started once per session when a test asks for one.
pytest_plugins = ["servers_serve", "servers_pg", "servers_s3"]


# tests/ mirrors train/: a fork that deletes an extra's folder (and its line in train/extras.py) loses
# its tests with it, as the folder of tests whose package folder is gone is not collected.
_here = Path(__file__).parent
collect_ignore = sorted(
    d.name
    for d in _here.iterdir()
    if d.is_dir() and any(d.glob("test_*.py")) and not (_here.parent / "train" / d.name).is_dir()
)


def pytest_configure(config):
    """oneDNN capped below its bfloat16 kernels on an AVX-512 CPU (ONEDNN_MAX_CPU_ISA=AVX2, the stand-in
    for an AVX2-only CPU) crashes TensorFlow on the tests that ask for bfloat16: one line, not a crash."""
    from train.errors import ConfigError
    from train.setup import hardware

    try:
        hardware.check_precision_fits_isa("mixed_bfloat16", [], hardware.cpu_flags(), hardware.onednn_max_isa())
    except ConfigError as e:
        raise pytest.UsageError(
            f"{e.allowed.split(':')[0]}, and some tests ask for bfloat16: unset it for the suite, or set "
            "ONEDNN_MAX_CPU_ISA=AVX512_CORE to run it on float32 kernels without bfloat16's"
        ) from None


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.extra("mlflow")`: a test outside an extra's folder that also needs that extra (a
    core feature shown with one of its settings) is skipped in a template without it."""
    for item in items:
        for mark in item.iter_markers("extra"):
            gone = [name for name in mark.args if not helpers.extra_present(name)]
            if gone:
                extra = "extras are" if len(gone) > 1 else "extra is"
                item.add_marker(pytest.mark.skip(reason=f"the {' and '.join(gone)} {extra} not {helpers.EXTRA_SKIP}"))


@pytest.fixture
def make_npz(tmp_path):
    """make_npz(name="toy.npz", **kw) -> path of a generated Keras-layout .npz under tmp_path."""
    return lambda name="toy.npz", **kw: write_npz(tmp_path / name, **kw)


@pytest.fixture
def make_image_dir(tmp_path):
    """make_image_dir(name="images", **kw) -> a generated class-per-sub-directory image folder."""
    return lambda name="images", **kw: write_image_dir(tmp_path / name, **kw)


@pytest.fixture(scope="session")
def one_epoch_run(tmp_path_factory):
    """A finished one-epoch run of helpers.tiny_settings, trained once for every test that only
    needs such a run to resume, damage or refuse: (its data set, its run directory). Never changed:
    tests take a copy (one_epoch_copy)."""
    from train import train

    tmp = tmp_path_factory.mktemp("one-epoch")
    result = train(helpers.tiny_settings(tmp, epochs=1))
    assert result.status == "completed", result.status
    return tmp / "tiny.npz", result.run_dir


@pytest.fixture
def one_epoch_copy(tmp_path, one_epoch_run):
    """A copy of one_epoch_run in tmp_path/runs, and the settings it was trained with there (its
    RUNS_DIR and DATA_DIR under tmp_path, its data set the shared one, which no test may change)."""
    import shutil

    from train.config import load_settings

    npz, run = one_epoch_run
    shutil.copytree(run.parent, tmp_path / "runs")
    values = {**helpers.tiny_values(tmp_path, npz), "epochs": 1}
    return load_settings(values, env_file=None, environ={}), tmp_path / "runs" / run.name


@pytest.fixture(autouse=True)
def _process_state_as_a_fresh_process_has_it():
    """After each test, what a run trained in-process leaves behind for the next test of this worker,
    as a fresh process has it:
    - the `train` logger: a run leaves its console handler and `propagate` off, and pytest then
      attaches its capture handlers to that logger too, so that a later test turning `propagate`
      back on saw each of its lines twice;
    - Keras's global dtype policy: a run in mixed precision sets it, and a model a later test builds
      would be in bfloat16 (LiteRT then refuses its ops);
    - `threading.excepthook`: a sweep wraps it once per process (heartbeat errors become one warning),
      and a later test of that wrapping would find it done already."""
    excepthook = threading.excepthook
    yield
    threading.excepthook = excepthook
    keras = sys.modules.get("keras")
    if keras is not None:
        keras.mixed_precision.set_global_policy("float32")
    log = logging.getLogger("train")
    for handler in list(log.handlers):
        if not type(handler).__module__.startswith("_pytest"):
            log.removeHandler(handler)
            handler.close()
    log.propagate = True
    log.setLevel(logging.NOTSET)


# The skip reason of a test whose real server is missing (helpers.server_missing): the banner below.
SERVER_MISSING = re.compile(r"no (?P<server>.+?) installed \((?P<how>.*)\)$", re.S)

# REQUIRE_ALL=1 (.ci/run sets it): a skip is a failure, so that the suite cannot pass by skipping
# for a tool or server CI forgot to install. These reasons are the exceptions: what cannot apply on
# a CPU host running as root (a GPU, CUDA in a CPU-only TensorFlow, a file root cannot be kept
# from reading), host-side files that the image leaves out on purpose, inputs a skip reason calls
# optional (the real MNIST), and the extras a fork deleted.
SKIPS_ALLOWED_UNDER_REQUIRE_ALL = ("GPU", "CUDA", "root reads", "not in the image", "(optional:", helpers.EXTRA_SKIP)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("REQUIRE_ALL") == "1" and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report).removeprefix("Skipped: ")
        if not any(allowed in reason for allowed in SKIPS_ALLOWED_UNDER_REQUIRE_ALL):
            report.outcome = "failed"
            report.longrepr = f"skipped under REQUIRE_ALL=1 (install what it needs): {reason}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """A banner per real server whose tests were skipped because it is not installed, naming them and
    how to install it: one `s` among hundreds of dots is easy to miss. (CI sets REQUIRE_ALL=1: they
    fail there.)"""
    missing: dict[tuple[str, str], list[str]] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if found := SERVER_MISSING.search(_skip_reason(report)):
            missing.setdefault((found["server"], found["how"]), []).append(report.nodeid)
    for (server, how), nodeids in missing.items():
        terminalreporter.write_sep("!", f"{len(nodeids)} test(s) SKIPPED: no {server} installed", yellow=True)
        for nodeid in nodeids:
            terminalreporter.write_line(f"  skipped: {nodeid}")
        terminalreporter.write_line(f"run them: {how}; then scripts/test again (REQUIRE_ALL=1 makes them fail instead)")
        terminalreporter.write_sep("!", yellow=True)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)
