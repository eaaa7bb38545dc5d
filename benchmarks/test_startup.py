"""5. Fail-fast start-up: a bad setting is rejected before TensorFlow loads; `python -m train check`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import common
import pytest

GOAL_REJECT_S = 1.0
GOAL_CHECK_S = 30.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BATCH_SIZE", "PRECISION")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(common.ROOT))
    return env


def _run(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args], cwd=common.ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    return time.perf_counter() - t0, proc


@pytest.mark.processes
def test_bad_setting_rejected_fast(benchmark, quick):
    """`python -m train fit --batch-size 0` against `python -c 'import tensorflow'` (what it avoids)."""
    bad = ["-X", "importtime", "-m", "train", "fit", "--batch-size", "0"]
    rejects, imports = [], []

    def reject() -> float:
        seconds, proc = _run(bad)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "BATCH_SIZE" in proc.stderr
        assert not re.search(r"\|\s+tensorflow\s*$", proc.stderr, re.M), (
            "TensorFlow was imported before the settings were checked"
        )
        rejects.append(seconds)
        return seconds

    def tf_import() -> float:
        seconds, proc = _run(["-c", "import tensorflow"])
        imports.append(seconds)
        return seconds

    common.once(
        benchmark, lambda: common.interleave({"reject": reject, "import_tensorflow": tf_import}, 1 if quick else 3)
    )
    r, t = common.median(rejects), common.median(imports)
    common.record(
        benchmark,
        "5a. bad setting rejected: wall time / `import tensorflow`",
        f"rejection < {GOAL_REJECT_S}s",
        common.ratio(r, t),
        r < GOAL_REJECT_S,
        reject_seconds=r,
        import_tensorflow_seconds=t,
    )


@pytest.mark.processes
def test_tensorflow_start_without_kerass_matplotlib(benchmark, quick):
    """TensorFlow started the way every `python -m train` starts it (the package imported first, so
    Keras's plotting helpers do not import matplotlib) against a plain `import tensorflow`."""

    def start(code: str):
        def run() -> float:
            seconds, proc = _run(["-c", code])
            assert proc.returncode == 0, proc.stderr[-2000:]
            return seconds

        return run

    runs = {"train_then_tensorflow": start("import train, tensorflow"), "plain_tensorflow": start("import tensorflow")}
    got = common.once(benchmark, lambda: common.interleave(runs, 1 if quick else 5))
    a, b = common.median(got["train_then_tensorflow"]), common.median(got["plain_tensorflow"])
    common.record(
        benchmark,
        "5d. TensorFlow's start in a train process / a plain `import tensorflow`",
        "below 1 (Keras's plotting helpers import no matplotlib)",
        common.ratio(a, b),
        a < b,
        train_then_tensorflow_seconds=a,
        plain_tensorflow_seconds=b,
    )


@pytest.mark.processes
def test_check_on_cpu(benchmark, quick):
    """`python -m train check` end to end (it probes TensorFlow in a subprocess)."""
    seconds_list = []

    def check() -> float:
        seconds, proc = _run(["-m", "train", "check"])
        seconds_list.append((seconds, proc.returncode))
        return seconds

    common.once(benchmark, lambda: [check() for _ in range(1 if quick else 2)])
    seconds = common.median(s for s, _ in seconds_list)
    common.record(
        benchmark,
        "5b. `python -m train check` on CPU, seconds",
        f"< {GOAL_CHECK_S}s",
        None,
        seconds < GOAL_CHECK_S,
        check_seconds=seconds,
        exit_codes=[c for _, c in seconds_list],
    )


@pytest.mark.processes
def test_peak_probe_cost(benchmark, quick):
    """One MFU peak probe (the first run on a machine makes PROBE_ROUNDS), against `import tensorflow`."""
    from train.training.flops import measure_peak_flops

    probes, imports, peaks = [], [], []

    def probe() -> float:
        t0 = time.perf_counter()
        peaks.append(measure_peak_flops("float32"))
        seconds = time.perf_counter() - t0
        probes.append(seconds)
        return seconds

    def tf_import() -> float:
        seconds, _ = _run(["-c", "import tensorflow"])
        imports.append(seconds)
        return seconds

    common.once(
        benchmark, lambda: common.interleave({"probe": probe, "import_tensorflow": tf_import}, 1 if quick else 3)
    )
    p, t = common.median(probes), common.median(imports)
    common.record(
        benchmark,
        "5c. peak FLOP/s probe at start / `import tensorflow`",
        "< 0.25x",
        common.ratio(p, t),
        p < 0.25 * t,
        probe_seconds=p,
        import_tensorflow_seconds=t,
        measured_gflops=common.median(peaks) / 1e9,
    )
