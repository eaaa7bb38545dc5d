"""Real `python -m train serve` processes for the serving tests, on 127.0.0.1 and a free port.

`served_run` is one tiny exported run (6x6 gray images, classes cat and dog) made once per session;
`serve_server` one server on it for the whole session. `start_server` starts another one with its
own settings; each is waited for by its readiness endpoint, never a sleep, and stopped at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import PYTHON, exec_in_process, server_process, subprocess_env, tiny_image_model

LABELS = ["cat", "dog"]
SHAPE = (6, 6, 1)
_DEADLINE = 300  # seconds: a safety net for a loaded machine, not a timing assumption


class ServeProcess:
    def __init__(self, target: Path, cwd: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        cmd = [PYTHON, "-m", "train", "serve", str(target), "--port", "0", *args]
        self.proc = server_process(
            cmd,
            cwd=cwd,
            env=subprocess_env(**(env or {})),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()
        found = self.wait_for_line(r"serving on http://127\.0\.0\.1:(\d+)")
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", found).group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def _drain(self) -> None:
        with self.proc.stderr:  # closed once the process ends it: no unclosed file left to the collector
            for line in self.proc.stderr:
                with self._new_line:
                    self.lines.append(line.rstrip("\n"))
                    self._new_line.notify_all()
        with self._new_line:
            self._new_line.notify_all()

    def wait_for_line(self, pattern: str) -> str:
        """The first stderr line matching `pattern`; fails with the output if the process ends first."""
        deadline = time.monotonic() + _DEADLINE
        seen = 0
        with self._new_line:
            while True:
                for line in self.lines[seen:]:
                    if re.search(pattern, line):
                        return line
                seen = len(self.lines)
                if self.proc.poll() is not None and seen == len(self.lines):
                    raise AssertionError(f"serve ended ({self.proc.returncode}) before {pattern!r}:\n" + self.output)
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {pattern!r} within {_DEADLINE}s:\n" + self.output)
                self._new_line.wait(1)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> ServeProcess:
        self.wait_for_line(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ready: ")
        assert get(self.url + "/v2/health/ready")[0] == 200
        return self

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=_DEADLINE)


def request(url: str, body: bytes | None = None, headers: dict | None = None, method: str | None = None):
    """(status, headers, body bytes) of one HTTP request; an error status is returned, not raised."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=_DEADLINE) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get(url: str):
    status, _, body = request(url)
    return status, json.loads(body)


def post_json(url: str, doc) -> tuple[int, dict]:
    status, _, body = request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body)


def make_exported_run(root: Path) -> Path:
    from train.config import Settings
    from train.results import export

    run = root / "20260101-000000-000000-served"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(Settings().to_dict()))
    manifest = {"data": {"input_shape": list(SHAPE), "class_names": LABELS}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    started = subprocess.run
    with pytest.MonkeyPatch.context() as mp:
        # The parity check's reload script runs in this process (the same script): a second TensorFlow
        # start was 2.4 s of the export's 2.7 s, and these tests check what serve does with the export.
        def reload(cmd, **kw):
            if cmd[2:3] != [export._RELOAD]:
                return started(cmd, **kw)  # any other process (the CPU's name for the manifest) as it is
            exec_in_process(cmd, mp)
            return subprocess.CompletedProcess(cmd, 0, "", "")

        mp.setattr(export.subprocess, "run", reload)
        export.export_model(tiny_image_model(seed=1), run, LABELS)
    return run


@pytest.fixture(scope="session")
def served_run(tmp_path_factory) -> Path:
    return make_exported_run(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="session")
def serve_server(served_run):
    server = ServeProcess(served_run, served_run.parent, {"SERVE_MAX_BATCH": "8"}).wait_ready()
    yield server
    server.stop()


@pytest.fixture
def start_server(served_run):
    started: list[ServeProcess] = []

    def start(target: Path | None = None, env: dict | None = None, args: tuple[str, ...] = ()) -> ServeProcess:
        started.append(ServeProcess(target or served_run, served_run.parent, env, args))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def make_gated_run(root: Path, gate: Path) -> Path:
    """A run whose export holds its call on files in `gate`, so a test can catch it mid-call.

    All-zero images (the server's warm-up) wait for gate/warm; an all-255 image writes gate/started,
    then waits for gate/release. Other images pass straight through. No source.json: served with
    the warning for an export that records no weights.
    """
    import tensorflow as tf

    def wait_for(path: Path):
        def missing(i):
            # The pattern depends on the loop counter (an empty suffix), so the loop optimiser cannot
            # hoist the file check out of the loop and spin on its first answer.
            pattern = tf.strings.join([str(path), tf.strings.substr(tf.strings.as_string(i), 0, 0)])
            return tf.equal(tf.size(tf.io.matching_files(pattern)), 0)

        return tf.while_loop(missing, lambda i: i + 1, [tf.constant(0)])[0]

    class Gated(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, *SHAPE], tf.uint8, name="images")])
        def serve(self, images):
            warm = tf.cond(tf.reduce_all(tf.equal(images, 0)), lambda: wait_for(gate / "warm"), lambda: 0)

            def held():
                with tf.control_dependencies([tf.io.write_file(str(gate / "started"), "")]):
                    return wait_for(gate / "release")

            hold = tf.cond(tf.reduce_all(tf.equal(images, 255)), held, lambda: 0)
            with tf.control_dependencies([warm, hold]):
                mean = tf.reduce_mean(tf.cast(images, tf.float32), axis=[1, 2, 3]) / 255.0
                return {"probabilities": tf.nn.softmax(tf.stack([mean, -mean], axis=1))}

    run = root / "20260101-000000-000000-gated"
    (run / "export").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({}))
    (run / "manifest.json").write_text(json.dumps({"data": {"input_shape": list(SHAPE), "class_names": LABELS}}))
    module = Gated()
    tf.saved_model.save(module, str(run / "export" / "savedmodel"), signatures={"serving_default": module.serve})
    return run
