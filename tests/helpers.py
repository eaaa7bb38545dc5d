"""Shared test helpers (imported as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from builders import write_tiny_npz

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def first_fast(*values):
    """Parameters of which only the first runs in the fast tier; the others are `slow` (CI runs them all):
    for a costly test parametrized over equivalent paths (the caches, the points a write fails at)."""
    return [values[0], *(pytest.param(v, marks=pytest.mark.slow) for v in values[1:])]


def benchmark_script(name: str):
    """benchmarks/NAME.py loaded as a module; the test skips where benchmarks/ is absent (the image)."""
    import importlib.util

    import pytest

    where = PROJECT_ROOT / "benchmarks" / f"{name}.py"
    if not where.is_file():
        pytest.skip("benchmarks/ is a host-side folder (not in the image)")
    spec = importlib.util.spec_from_file_location(name, where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PYTHON = sys.executable


def _real_mnist() -> Path | None:
    given = os.environ.get("MNIST_NPZ")
    if given:
        return Path(given)
    beside = PROJECT_ROOT / "data" / "mnist.npz"  # where a default training leaves its download
    return beside if beside.is_file() else None


# The real MNIST for the tests that can use it, never required: MNIST_NPZ or data/mnist.npz.
REAL_MNIST = _real_mnist()
NO_REAL_MNIST = (
    "no real MNIST (optional: set MNIST_NPZ to a Keras-format mnist.npz, or train once to download data/mnist.npz)"
)


def free_local_ports(n: int = 1) -> list[int]:
    """n TCP ports free on 127.0.0.1 right now, distinct (a server or worker binds one a moment later)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def server_process(cmd: list[str], death_signal: int = signal.SIGKILL, **popen) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **popen)` for a server a fixture starts, which must not outlive the tests.

    On Linux the kernel sends it `death_signal` when the process that started it dies, however it dies
    (a segfault, `kill -9` of a pytest worker): prctl(PR_SET_PDEATHSIG), set in the child before the
    exec, after `start_new_session` and `user=` took effect (a change of user would clear it). The
    signal comes when the *thread* that forked exits, not the process: fixtures start their servers
    from the main thread, which lives as long as pytest does. Only that process gets it: a server whose
    work runs in a child of its own passes the signal on (mlflow's SIGTERM), or is given a `user=` here
    rather than a `runuser` in front of it."""
    if sys.platform.startswith("linux"):
        popen["preexec_fn"] = _dies_with(os.getpid(), death_signal)
    return subprocess.Popen(cmd, **popen)


def _dies_with(parent: int, death_signal: int):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls it
    pr_set_pdeathsig = 1

    def set_in_child() -> None:
        if libc.prctl(pr_set_pdeathsig, death_signal, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:  # the parent died before the prctl: no signal would come
            os.kill(os.getpid(), death_signal)

    return set_in_child


def ipv6_loopback() -> bool:
    """Whether ::1 can be bound here (a container or host with IPv6 turned off has none)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


# Why a test of an extra is skipped in a fork that deleted it (allowed under REQUIRE_ALL: tests/conftest.py).
EXTRA_SKIP = "in this template (train/extras.py)"


def each_extra(names) -> list:
    """Parametrize values, one per extra present; in a fork without any, one case that is skipped."""
    return list(names) or [pytest.param(None, marks=pytest.mark.skip(reason=f"no such extra {EXTRA_SKIP}"))]


def extra_present(name: str) -> bool:
    """The extra is registered in train/extras.py and its folder is there (a fork may delete both)."""
    from importlib.util import find_spec

    from train.extras import EXTRAS

    extra = EXTRAS.get(name)
    return extra is not None and (not extra.package or find_spec(extra.package) is not None)


# PYTHONPATH for a pytest run of a copy of tests/conftest.py elsewhere: it imports these helpers.
HELPERS_PATH = f"{Path(__file__).parent}:{PROJECT_ROOT}"


def exec_in_process(cmd: list[str], monkeypatch) -> None:
    """`python -c CODE ARGS...` run in this process (the same code, no second TensorFlow start). The
    Keras that export's reload script refuses to its own process is put back at once."""
    monkeypatch.setattr(sys, "argv", ["-c", *cmd[3:]])
    keras_module = sys.modules.get("keras")
    try:
        exec(cmd[2], {"__name__": "__main__"})
    finally:
        if keras_module is not None:
            sys.modules["keras"] = keras_module


# The README's settings table, between its markers (group 1): generated, never edited by hand.
SETTINGS_TABLE = r"<!-- settings-table:start[^>]*-->\n\n(.*?)\n\n<!-- settings-table:end -->"


def write_generated_settings_files(root: Path) -> None:
    """.env.example and the README's settings table of the template at `root`, as docs/extending.md
    regenerates them: `invoke settings-files` there."""
    cmd = [sys.executable, "-m", "invoke", "settings-files"]
    subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=subprocess_env(PYTHONPATH=str(root)), check=True)


def server_missing(server: str, how: str) -> str:
    """The skip reason of a test that needs a real server this machine lacks; tests/conftest.py's
    banner lists such tests by server, with `how` to install it."""
    return f"no {server} installed ({how})"


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for `python -m train` in a subprocess: quiet TensorFlow, project importable."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in _SETTING_NAMES}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)})
    # Under mutmut the child runs the unmutated code: its trampolines, started in another folder,
    # cannot find mutmut's configuration and would fail every such test in the stats run.
    env.pop("MUTANT_UNDER_TEST", None)
    env.update(extra)
    return env


def _setting_names() -> set[str]:
    from dataclasses import fields

    from train.config import Settings

    return {f.name.upper() for f in fields(Settings)}


_SETTING_NAMES = _setting_names()


def tiny_image_model(seed: int | None = None):
    """A 6x6x1 -> 2-class softmax Keras model, small enough to save, export and hash in a moment."""
    import keras

    if seed is not None:
        keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(6, 6, 1), name="image")
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="probabilities")(x))


def tiny_settings(tmp_path: Path, **changes):
    """A CPU-sized run on generated data, every output under tmp_path."""
    from train.config import load_settings

    values = tiny_values(tmp_path, write_tiny_npz(tmp_path))
    values.update(changes)
    return load_settings(values, env_file=None, environ={})


def tiny_values(tmp_path: Path, npz: Path) -> dict:
    """The settings of a CPU-sized run on `npz`, by field name, every output under tmp_path."""
    return {
        "dataset": f"npz:{npz}",
        "runs_dir": str(tmp_path / "runs"),
        "data_dir": str(tmp_path / "data"),
        "epochs": 2,
        "batch_size": 32,
        # The learning rate of the tests that are not about it: constant, so a step's effect does
        # not depend on how many steps the run has.
        "learning_rate": 1e-3,
        "lr_schedule": "constant",
        "lr_warmup_epochs": 0.0,
        "checkpoint_every": 4,
        "precision": "float32",
        "progress": "line",
        # A given peak: with "auto" every run in a fresh RUNS_DIR measures the machine's peak first
        # (20 large matmuls, over a second on one slow core), which only the peak's own tests need.
        "peak_flops": "1e12",
        # No report.html: drawing it (curves each epoch, at the end a pass over the validation set and
        # its pictures) is as long as the tiny training itself; the tests of reports ask for one.
        "report": "off",
        # No export: its fresh-process parity check starts one more TensorFlow process (about 3 s of
        # CPU) in every run that exports; the tests of exports, serving and predict ask for one.
        "export": False,
    }


class LocalFiles:
    """The files of a directory over HTTP on 127.0.0.1 (a stand-in for a download site: tests
    never reach the internet). `url(name)` is a file's address; `requests` lists the paths asked for."""

    def __init__(self, directory: Path):
        import functools
        import http.server
        import threading

        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):  # quiet; record instead
                outer.requests.append(self.path)

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory))
        )
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str = "") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LocalFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def runtime_check_python() -> str:
    """.venv-runtime-check's Python (LiteRT, ONNX Runtime, numpy; no TensorFlow), made by
    scripts/venv-runtime-check.sh: skipped where it was not made (a failure under REQUIRE_ALL=1, as in CI)."""
    import pytest

    python = PROJECT_ROOT / ".venv-runtime-check" / "bin" / "python"
    if not python.is_file():
        pytest.skip("no .venv-runtime-check: run scripts/venv-runtime-check.sh")
    return str(python)


# -- a throw-away git repository holding the package (reproduce, sweeps) -------------------------
def fit_here(cwd: Path, monkeypatch, capsys, flags: list[str]) -> tuple[int, str]:
    """`python -m train fit FLAGS` through the CLI's edge in this process, from `cwd`: (exit code,
    console). For a run the test only reads, whose faults are in files rather than in the process:
    no TensorFlow start of its own."""
    from train.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    rc = main(["fit", *flags])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def fit_in_process(cwd: Path, flags: list[str]) -> int:
    """fit_here for a fixture or a test without monkeypatch: the working directory is put back after."""
    from train.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        return main(["fit", *flags])


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def clone_of_the_package(dest: Path) -> Path:
    (dest / "requirements").mkdir(parents=True)
    shutil.copytree(PROJECT_ROOT / "train", dest / "train", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("requirements/cpu.lock", "requirements/gpu.lock", "pyproject.toml"):
        shutil.copy(PROJECT_ROOT / name, dest / name)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "snapshot")
    return dest


def train_in(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "train", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env=subprocess_env(PYTHONPATH=str(repo)),
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


# -- report pictures, rendered by a real browser ---------------------------------------------------
def screenshot(page, out, size=(1280, 2600)):
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI installs it")
    profile = out.parent / "chromium-profile"
    profile.mkdir()
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={size[0]},{size[1]}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.is_file(), proc.stderr[-3000:]
    return np.asarray(Image.open(out).convert("RGB")).astype(int)


def near(img, colour: str, tol: int = 40):
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return np.abs(img - rgb).sum(axis=2) < tol


class FixedModel:
    """Stands in for a Keras model: the probabilities are the images' first pixel row (no TensorFlow);
    `batch` makes such images."""

    class _Input:
        shape = (None, 2, 3, 1)

    inputs = [_Input()]

    def __call__(self, x, training=False):
        assert training is False
        return x[:, 0, :, 0] / 255.0


def batch(probs, labels):
    """Images whose first row holds the probabilities the model will return for them."""
    x = np.zeros((len(labels), 2, 3, 1), np.float32)
    x[:, 0, :, 0] = np.asarray(probs) * 255.0
    return x, np.asarray(labels)


def stop_at_check(monkeypatch, n):
    """Request a stop at the n-th stop check of the epoch loop (a step boundary; start-up's checks not counted)."""
    import sys

    from train.training import stop_flag

    original, calls = stop_flag.StopFlag.check, {"n": 0}

    def check(self):
        if sys._getframe(1).f_code.co_filename.endswith("fit.py"):
            return original(self)
        calls["n"] += 1
        if calls["n"] == n:
            self.request("test stop")
        return original(self)

    monkeypatch.setattr(stop_flag.StopFlag, "check", check)
    return lambda: monkeypatch.setattr(stop_flag.StopFlag, "check", original)
