"""MLflow tracking: the setting, what is logged, and runs against a real `mlflow server` on 127.0.0.1.

The server tests need the full `mlflow` package, which never enters requirements/cpu.lock nor the image:
scripts/venv-mlflow-server.sh installs it into .venv-mlflow-server (.ci/run does, and sets
REQUIRE_ALL=1 so that there they fail instead of skipping). MLFLOW_SERVER may name
another `mlflow` executable.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import (
    HELPERS_PATH,
    PROJECT_ROOT,
    free_local_ports,
    server_missing,
    server_process,
    subprocess_env,
    tiny_settings,
)

from train.config import load_settings
from train.errors import ConfigError
from train.tracking import mlflow_run as tracking

# --- the setting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "https://mlflow.example.org/tracking/",
        "http://mlflow:5000",
        "databricks",
        "databricks://profile",
    ],
)
def test_tracking_servers_the_client_can_reach_are_accepted(uri):
    assert load_settings({"mlflow_tracking_uri": uri}, env_file=None, environ={}).mlflow_tracking_uri == uri


@pytest.mark.parametrize(
    "uri",
    [
        "127.0.0.1:5000",
        "http://",
        "ftp://host/x",
        "http://host :5000",
        "http://[::1:5000",
        "file:///tmp/mlruns",
        "sqlite:///mlflow.db",
        "./mlruns",
    ],
)
def test_a_tracking_uri_mlflow_cannot_use_is_a_config_error_naming_it(uri):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={"MLFLOW_TRACKING_URI": uri})
    assert info.value.name == "MLFLOW_TRACKING_URI" and "http://host:5000" in str(info.value)


SECRET = "Zq7SecretValue"
_TOKEN, _LOGIN = "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"


@pytest.mark.parametrize(
    ("uri", "instead"),
    [
        (f"http://me:{SECRET}@host:5000", _LOGIN),
        (f"http://{SECRET}@host:5000", _LOGIN),  # a user part alone: often a token
        (f"https://{SECRET}:@host", _LOGIN),
        (f"ftp://bob:{SECRET}@host", _LOGIN),  # also when the URI is wrong for other reasons
        (f"http:bob:{SECRET}@host", _LOGIN),
        (f"http://bob%3A{SECRET}%40host:5000", _LOGIN),  # percent-encoded : and @
        (f"http://[::1:5000@{SECRET}@h", _LOGIN),  # does not even parse
        (f"databricks://{SECRET}@profile", _LOGIN),
        (f"http://host:5000/?token={SECRET}", _TOKEN),
        (f"http://host:5000/?Access_Token={SECRET}", _TOKEN),
        (f"http://host:5000/?%74oken={SECRET}", _TOKEN),  # percent-encoded name
        (f"http://host:5000/mlflow?x=1&API%5FKEY={SECRET}", _TOKEN),
        (f"https://host/?X-Amz-Signature={SECRET}&X-Amz-Credential={SECRET}", _TOKEN),
        (f"http://host/?auth={SECRET}", _TOKEN),
        (f"http://host/?client_secret={SECRET}", _TOKEN),
        (f"http://host/?PassWord={SECRET}", _LOGIN),
        (f"http://host/#access_token={SECRET}", _TOKEN),
        (f"http://host/?{SECRET}", _TOKEN),  # a bare value: refused too (any query breaks the client)
        (f"http://host:5000/?page={SECRET}", _TOKEN),
        (f" http://me:{SECRET}@host ", _LOGIN),
    ],
)
def test_a_credential_in_the_tracking_uri_is_refused_naming_the_variable_and_never_repeated(uri, instead):
    with pytest.raises(ConfigError) as info:
        load_settings({}, env_file=None, environ={"MLFLOW_TRACKING_URI": uri})
    message = str(info.value)
    assert info.value.name == "MLFLOW_TRACKING_URI" and instead in message and "\n" not in message
    assert SECRET.lower() not in message.lower() and SECRET not in repr(info.value.value)
    assert "***" in message  # the URI is shown, with the hidden parts marked


def test_the_error_says_which_part_of_the_uri_is_a_credential():
    def problem(uri):
        with pytest.raises(ConfigError) as info:
            load_settings({"mlflow_tracking_uri": uri}, env_file=None, environ={})
        return str(info.value)

    assert "the part before the @ (a user name or a token)" in problem("http://tok@h:5000")
    assert "the part before the @ (a user and password)" in problem("http://u:p@h:5000")
    assert "query parameter named like 'token'" in problem("http://h/?my_TOKEN=1")
    assert "named like 'signature'" in problem("http://h/?sig=1")
    assert "query (?...) or fragment (#...)" in problem("http://h/?page=2")


def test_a_tracking_uri_with_an_at_sign_in_its_path_only_is_a_path():
    uri = "https://host/users/me@example.org/mlflow"
    assert load_settings({"mlflow_tracking_uri": uri}, env_file=None, environ={}).mlflow_tracking_uri == uri


def test_a_credential_uri_saved_by_an_older_version_never_makes_the_run_unreadable():
    from train.config import Settings, settings_from_dict

    saved = {**Settings().to_dict(), "mlflow_tracking_uri": f"http://host/?token={SECRET}"}
    assert settings_from_dict(saved).mlflow_tracking_uri == ""  # resume uses the current MLFLOW_TRACKING_URI
    assert settings_from_dict({**saved, "mlflow_tracking_uri": "http://h:5000"}).mlflow_tracking_uri == "http://h:5000"


def _files_and_output_holding(root: Path, output: str, secrets: list[str]) -> list[str]:
    """Every file under `root` (and the console output) that holds one of `secrets`, as bytes."""
    found = [f"output: {s}" for s in secrets if s in output]
    for path in (p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return found


@pytest.mark.slow
def test_a_credential_in_the_uri_is_refused_at_the_cli_and_lands_nowhere(tmp_path):
    from builders import write_tiny_npz
    from faults import fit_flags, run_fit

    uri = f"http://127.0.0.1:9/?token={SECRET}"
    rc, out = run_fit(
        fit_flags(tmp_path, write_tiny_npz(tmp_path), epochs=1), tmp_path, extra_env={"MLFLOW_TRACKING_URI": uri}
    )
    assert rc == 2, out[-3000:]
    (line,) = [line for line in out.splitlines() if "MLFLOW_TRACKING_URI" in line]
    assert line.startswith("ConfigError: MLFLOW_TRACKING_URI='http://127.0.0.1:9/?***'") and _TOKEN in line
    assert _files_and_output_holding(tmp_path / "runs", out, [SECRET]) == []


def test_an_empty_experiment_name_is_refused():
    with pytest.raises(ConfigError, match="MLFLOW_EXPERIMENT"):
        load_settings({"mlflow_tracking_uri": "http://h:5000", "mlflow_experiment": " "}, env_file=None, environ={})


def test_the_tracking_settings_may_change_on_resume():
    from train.config import RESUME_FREE

    assert {"mlflow_tracking_uri", "mlflow_experiment"} <= RESUME_FREE


# --- what is logged ----------------------------------------------------------------------------


def test_tags_name_commit_lock_data_and_image():
    manifest = {
        "run_id": "r1",
        "git": {"commit": "abc123", "dirty": True, "source": "git"},
        "requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": "ff" * 32},
        "data": {"fingerprint": "cd" * 32, "dataset": "mnist"},
    }
    tags = tracking.tags_from_manifest(manifest)
    assert tags["commit"] == "abc123 (uncommitted changes)" and tags["mlflow.source.git.commit"] == "abc123"
    assert tags["lock_sha256"] == "ff" * 32 and tags["lock"] == "requirements/cpu.lock"
    assert tags["data_fingerprint"] == "cd" * 32 and tags["image"] == "none (a git checkout)"
    in_image = {**manifest, "git": {"commit": "0123456789abcdef", "source": "/app/BUILD_COMMIT"}}
    assert tracking.tags_from_manifest(in_image)["image"] == "tf-train-template:cpu-ffffffffffff-01234567"
    assert tracking.tags_from_manifest({})["commit"] == "unknown"


def test_params_are_the_settings_without_where_tracking_goes():
    params = tracking.params_from_settings(
        {"batch_size": 32, "smoke": False, "mlflow_tracking_uri": "http://h", "mlflow_experiment": "x"}
    )
    assert params == {"batch_size": "32", "smoke": "False"}


def test_epoch_metrics_leave_out_empty_and_non_finite_values():
    row = {"epoch": 2, "loss": 0.5, "val_loss": float("nan"), "mfu": None, "gpu_memory_used_mb": "", "ok": True}
    assert tracking.epoch_metrics(row) == {"epoch": 2.0, "loss": 0.5}


@pytest.fixture
def train_log_propagates(monkeypatch):
    """caplog sees the `train` logger even after a training in this process turned propagation off."""
    monkeypatch.setattr(logging.getLogger("train"), "propagate", True)


class Down:
    """An MLflow client whose every call fails at once."""

    def __getattr__(self, name):
        def fail(*a, **k):
            raise ConnectionError("connection refused\nmore detail")

        return fail


class Held:
    """An MLflow client whose every call waits until `release` is set: a server that never answers."""

    def __init__(self):
        self.entered, self.release, self.calls = threading.Event(), threading.Event(), []

    def __getattr__(self, name):
        def wait(*a, **k):
            self.calls.append(name)
            self.entered.set()
            self.release.wait(600)

        return wait


def _tracker(run_dir: Path, client, run_id: str = "run") -> tracking.Tracker:
    return tracking.Tracker(run_dir, "http://127.0.0.1:9", lambda: tracking.Opened(client, run_id, "0"))


def _run_files(run_dir: Path) -> None:
    for name in ("manifest.json", "config.json", "report.html"):
        (run_dir / name).write_text("{}")


def test_errors_while_logging_are_one_warning_each_and_never_raise(tmp_path, caplog, train_log_propagates):
    _run_files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="train"):  # before the tracker's thread says where it logs
        tracker = _tracker(tmp_path, Down())
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
        tracker.finish("completed")
    lines = [r.getMessage() for r in caplog.records]
    # After one failed upload the others are not tried: each would wait out its retries.
    assert lines == [
        f"WARNING: MLflow: {what} not logged (ConnectionError: connection refused); training goes on"
        for what in ("epoch 1 metrics", "manifest.json", "run status")
    ]
    assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"] == {
        "run_id": "run",
        "experiment_id": "0",
        "tracking_uri": "http://127.0.0.1:9",
        "tracking": "on",
    }


def test_the_training_thread_never_waits_for_a_server_that_does_not_answer(
    tmp_path, caplog, train_log_propagates, monkeypatch
):
    _run_files(tmp_path)
    client = Held()
    with caplog.at_level(logging.WARNING, logger="train"):  # before the tracker's thread says where it logs
        tracker = _tracker(tmp_path, client)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 12)
        assert client.entered.wait(60)  # the tracking thread is inside the call, held by the server ...
        for epoch in range(2, tracking.QUEUE_SIZE + 4):  # ... and the training goes on: every epoch returns
            tracker.log_epoch({"epoch": epoch, "loss": 1.0}, 12 * epoch)
        # The deadline only decides how long finish waits for a server that never answers.
        monkeypatch.setattr(tracking, "STOP_FLUSH_SECONDS", 0.5)
        tracker.finish("interrupted")
    assert client.calls == ["log_batch"]  # the one call in progress; nothing else reached the client
    lines = [r.getMessage() for r in caplog.records]
    past_queue = range(tracking.QUEUE_SIZE + 2, tracking.QUEUE_SIZE + 4)  # the queue holds QUEUE_SIZE calls
    assert lines == [
        *(
            f"WARNING: MLflow: epoch {e} metrics not sent: {tracking.QUEUE_SIZE} calls already wait for the server "
            "at http://127.0.0.1:9; training goes on"
            for e in past_queue
        ),
        f"WARNING: MLflow: not sent within 0 s (no answer from http://127.0.0.1:9): metrics of epochs "
        f"1-{tracking.QUEUE_SIZE + 3}, manifest.json, config.json, report.html, run status; the run directory "
        "has all of it",
    ]
    client.release.set()  # the server answers at last: the tracker, closed, says and sends nothing more
    tracker._thread.join(60)
    assert not tracker._thread.is_alive() and client.calls == ["log_batch"]
    assert len(caplog.records) == len(lines)


def test_a_stop_during_the_final_flush_cuts_its_wait_to_the_stop_deadline(tmp_path, monkeypatch):
    from train.training.stop_flag import StopFlag

    client, stop = Held(), StopFlag()
    tracker = _tracker(tmp_path, client)
    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(tracking, "STOP_FLUSH_SECONDS", 0.5)
    threading.Timer(0.2, stop.request, ("received SIGTERM",)).start()  # arrives while finish waits
    tracker.finish("completed", stop)  # returns: without the stop it would wait an hour
    client.release.set()


def test_the_stop_deadline_fits_in_the_compose_grace_period():
    grace = _compose_file()["services"]["train"]["stop_grace_period"]
    seconds = int(grace[:-1]) * {"s": 1, "m": 60}[grace[-1]]
    # The rest of the grace period is for the step in progress, the checkpoint and the report.
    assert tracking.STOP_FLUSH_SECONDS <= seconds / 2 < tracking.FLUSH_SECONDS + seconds


def test_what_was_not_sent_is_named_briefly():
    names = ["the MLflow run's start", "epoch 1 metrics", "epoch 2 metrics", "epoch 5 metrics", "manifest.json"]
    assert tracking._names(names) == "the MLflow run's start, metrics of epochs 1-2, 5, manifest.json"
    assert tracking._names(["epoch 3 metrics", "run status"]) == "metrics of epoch 3, run status"


def test_a_closed_port_is_unreachable_at_once():
    (port,) = free_local_ports(1)
    with pytest.raises(tracking.TrackingUnavailable, match=f"127.0.0.1:{port}/health cannot be reached"):
        tracking.check_reachable(f"http://127.0.0.1:{port}")
    tracking.check_reachable("databricks")  # no /health there: checked by use


def test_a_closed_port_at_the_start_is_tried_again_then_tracking_is_off_and_the_manifest_says_why(
    tmp_path, caplog, train_log_propagates
):
    (port,) = free_local_ports(1)
    uri = f"http://127.0.0.1:{port}"
    (tmp_path / "manifest.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = tracking.start(uri, "Default", tmp_path, {"epochs": 1})
        assert tracker._started.wait(60)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 1)
        tracker.finish("completed")
    first, last = [r.getMessage() for r in caplog.records]
    assert first.startswith(f"WARNING: MLflow: {uri}/health cannot be reached (") and first.endswith(
        f"(MLFLOW_TRACKING_URI={uri}): the run is started in MLflow once it answers, tried at each epoch's end; "
        "training goes on"
    )
    assert last.startswith(f"WARNING: MLflow tracking off for this run: the server never answered ({uri}/health")
    recorded = json.loads((tmp_path / "manifest.json").read_text())["mlflow"]
    assert set(recorded) == {"tracking", "reason"} and recorded["tracking"] == "off"
    assert recorded["reason"].startswith(f"http://127.0.0.1:{port}/health cannot be reached")


def _refused_at_first(times: int):
    """check_reachable for a server down for the start's first `times` tries, then answering."""
    answers = iter([False] * times)

    def reachable(uri):
        if not next(answers, True):
            raise tracking.TrackingUnavailable(f"{uri}/health cannot be reached (refused)", later=True)

    return reachable


def _sent(tracker, what: str) -> None:
    """Wait until the tracking thread is done with `what` (an event, at most a minute)."""
    deadline = time.monotonic() + 60
    while what in tracker._pending and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_server_down_at_the_start_is_tried_again_each_epoch_and_gets_the_epochs_it_missed(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    """Down for the start and the first epoch's end, up at the second's: one warning, then the run
    is made and epoch 1's metrics go with epoch 2's, at their own steps."""
    import mlflow

    class Metrics(_Client):
        def log_batch(self, run_id, params=(), tags=(), metrics=(), synchronous=False):
            super().log_batch(run_id, params, tags, metrics, synchronous)
            self.calls.append(("metrics", run_id, sorted((m.key, m.step) for m in metrics)))

        def log_artifact(self, run_id, path):
            self.calls.append(("log_artifact", run_id, Path(path).name))

    monkeypatch.setattr(tracking, "check_reachable", _refused_at_first(2))  # the start, epoch 1's end
    monkeypatch.setattr(mlflow, "MlflowClient", lambda tracking_uri: Metrics(tracking_uri))
    _Client.made = []
    (tmp_path / "manifest.json").write_text("{}")

    with caplog.at_level(logging.INFO, logger="train"):
        tracker = tracking.start(URI, "exp", tmp_path, {"epochs": 2})
        assert tracker._started.wait(60)
        tracker.record()
        assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"]["tracking"] == "off"
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
        _sent(tracker, "epoch 1 metrics")
        tracker.log_epoch({"epoch": 2, "loss": 0.5}, 20)
        _sent(tracker, "epoch 2 metrics")
        tracker.finish("completed")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        f"WARNING: MLflow: {URI}/health cannot be reached (refused) (MLFLOW_TRACKING_URI={URI}): the run is "
        "started in MLflow once it answers, tried at each epoch's end; training goes on"
    )
    assert (
        lines[1].startswith("MLflow: logging to run new-run in experiment new-exp at") and "answered late" in lines[1]
    )
    assert lines[2:] == ["MLflow: metrics of epoch 1 sent late, with epoch 2 metrics"]
    (client,) = _Client.made
    assert [c for c in client.calls if c[0] == "metrics" and c[2]] == [
        ("metrics", "new-run", [("epoch", 10), ("epoch", 20), ("loss", 10), ("loss", 20)])
    ]
    assert client.calls[-1] == ("set_terminated", "new-run", "FINISHED")
    assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"]["tracking"] == "on"


def test_a_server_back_only_at_the_end_gets_the_run_its_metrics_and_its_status(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    import mlflow

    monkeypatch.setattr(tracking, "check_reachable", _refused_at_first(2))  # the start, epoch 1's end
    clients = []
    monkeypatch.setattr(
        mlflow, "MlflowClient", lambda tracking_uri: clients.append(Recording(tracking_uri)) or clients[-1]
    )
    (tmp_path / "manifest.json").write_text("{}")
    with caplog.at_level(logging.INFO, logger="train"):
        tracker = tracking.start(URI, "exp", tmp_path, {"epochs": 1})
        assert tracker._started.wait(60)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
        _sent(tracker, "epoch 1 metrics")
        tracker.finish("completed")
    assert "MLflow: metrics of epoch 1 sent late" in [r.getMessage() for r in caplog.records]
    (client,) = clients
    sent = [kw["metrics"] for name, _, kw in client.calls if name == "log_batch" and kw.get("metrics")]
    assert [{m.key: m.step for m in ms} for ms in sent] == [{"epoch": 10, "loss": 10}]
    assert client.calls[-1][:2] == ("set_terminated", ("r1", "FINISHED"))


def test_a_server_back_only_at_the_end_gets_a_manifest_naming_its_run(tmp_path, monkeypatch):
    """The start's last try comes before the manifest is recorded and uploaded: the manifest.json
    artifact names the MLflow run it is in, not tracking off."""
    import mlflow

    class Uploads(Recording):
        uploaded: dict = {}

        def log_artifact(self, run_id, path):
            Uploads.uploaded[Path(path).name] = Path(path).read_text()

    monkeypatch.setattr(tracking, "check_reachable", _refused_at_first(2))  # the start, epoch 1's end
    monkeypatch.setattr(mlflow, "MlflowClient", Uploads)
    (tmp_path / "manifest.json").write_text("{}")
    tracker = tracking.start(URI, "exp", tmp_path, {"epochs": 1})
    assert tracker._started.wait(60)
    tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
    _sent(tracker, "epoch 1 metrics")
    tracker.finish("completed")
    expected = {"run_id": "r1", "experiment_id": "7", "tracking_uri": URI, "tracking": "on"}
    assert json.loads(Uploads.uploaded["manifest.json"])["mlflow"] == expected
    assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"] == expected


def test_epochs_queued_behind_a_slow_try_of_the_start_try_it_once_at_the_newest(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    """Each try of the start may wait HEALTH_TIMEOUT for a server that accepts and never answers:
    the epochs that queued meanwhile try it once, at the newest one's end, not once each (their calls
    would fill the queue, and the epochs past it be lost for a server back later)."""
    import mlflow

    checks, held, release = [], threading.Event(), threading.Event()

    def reachable(uri):
        checks.append(uri)
        if len(checks) == 2:  # the try at epoch 1's end: held, as by a server that never answers
            held.set()
            release.wait(60)
        if len(checks) < 4:  # it answers the start's try at the run's end
            raise tracking.TrackingUnavailable(f"{uri}/health cannot be reached (timed out)", later=True)

    clients = []
    monkeypatch.setattr(tracking, "check_reachable", reachable)
    monkeypatch.setattr(
        mlflow, "MlflowClient", lambda tracking_uri: clients.append(Recording(tracking_uri)) or clients[-1]
    )
    (tmp_path / "manifest.json").write_text("{}")
    epochs = range(1, tracking.QUEUE_SIZE + 2)
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = tracking.start(URI, "exp", tmp_path, {"epochs": len(epochs)})
        assert tracker._started.wait(60)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
        assert held.wait(60)
        for epoch in epochs[1:]:  # the queue holds them all
            tracker.log_epoch({"epoch": epoch, "loss": 1.0}, 10 * epoch)
        release.set()
        deadline = time.monotonic() + 60
        while any(w.startswith("epoch ") for w in tracker._pending) and time.monotonic() < deadline:
            time.sleep(0.01)
        tracker.finish("completed")
    assert len(checks) == 4  # the start, epoch 1's end, the newest epoch's end once it was taken, the end
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]  # the first warning only
    (client,) = clients
    sent = [kw["metrics"] for name, _, kw in client.calls if name == "log_batch" and kw.get("metrics")]
    assert [sorted({m.step for m in ms}) for ms in sent] == [[10 * e for e in epochs]]
    assert client.calls[-1][:2] == ("set_terminated", ("r1", "FINISHED"))


def test_a_server_that_answers_a_later_try_with_a_refusal_is_not_said_never_to_have_answered(
    tmp_path, caplog, train_log_propagates
):
    deleted = "the experiment 'exp' (id 1) is deleted in MLflow: restore it"
    tries = iter(
        [
            tracking.TrackingUnavailable(f"{URI}/health cannot be reached (refused)", later=True),
            tracking.TrackingUnavailable(deleted),  # it answers, and refuses the run
        ]
    )

    def open_run():
        raise next(tries)

    _run_files(tmp_path)
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = tracking.Tracker(tmp_path, URI, open_run)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 10)
        tracker.finish("completed")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[1:] == [
        f"WARNING: MLflow tracking off for this run: {deleted} (MLFLOW_TRACKING_URI={URI}); training goes on"
    ]
    assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"] == {"tracking": "off", "reason": deleted}


@pytest.mark.parametrize("failure", ["refused", "bug"])
def test_any_start_failure_turns_tracking_off_and_never_stops_the_training(
    tmp_path, caplog, train_log_propagates, monkeypatch, failure
):
    """A server that answers /health but refuses the API (403), or an error of any other kind (a
    bug here or in the client): one warning, nothing raised into the training, the reason recorded.
    There is no setting that makes tracking required."""
    from mlflow import MlflowClient

    if failure == "bug":
        monkeypatch.setattr(MlflowClient, "create_run", lambda *a, **k: 1 / 0)
    manifest = {"mlflow": {"run_id": "earlier", "experiment_id": "3", "tracking_uri": "http://old:5000"}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with _HealthyButRefusing() as uri, caplog.at_level(logging.WARNING, logger="train"):
        if failure == "bug":
            monkeypatch.setattr(MlflowClient, "get_experiment_by_name", lambda *a, **k: None)
            monkeypatch.setattr(MlflowClient, "create_experiment", lambda *a, **k: "1")
        tracker = tracking.start(uri, "Default", tmp_path, {"epochs": 1})
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 1)  # never raises, whatever the start did
        tracker.finish("completed")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    off = [w for w in warnings if w.startswith("WARNING: MLflow tracking off for this run: ")]
    assert len(off) == 1 and off[0].endswith("training goes on"), warnings
    recorded = json.loads((tmp_path / "manifest.json").read_text())["mlflow"]
    assert recorded["tracking"] == "off"
    assert ("ZeroDivisionError" if failure == "bug" else "PERMISSION_DENIED") in recorded["reason"]
    # The run tracked by an earlier segment stays recorded: a later resume can continue it.
    assert {k: recorded[k] for k in ("run_id", "experiment_id", "tracking_uri")} == manifest["mlflow"]


def test_a_manifest_unreadable_at_the_start_turns_tracking_off_without_raising(tmp_path, caplog, train_log_propagates):
    (tmp_path / "manifest.json").write_text('{"trunc')
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = tracking.start("http://127.0.0.1:9", "Default", tmp_path, {"epochs": 1})
        tracker.finish("completed")
    off = [r.getMessage() for r in caplog.records if "tracking off for this run" in r.getMessage()]
    assert len(off) == 1 and "manifest.json" in off[0]


class _HealthyButRefusing:
    """An HTTP server on 127.0.0.1 that answers /health and refuses every API call with 403."""

    def __enter__(self) -> str:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                ok = self.path == "/health"
                body = b"OK" if ok else b'{"error_code": "PERMISSION_DENIED", "message": "not allowed"}'
                self.send_response(200 if ok else 403)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Recording:
    """An MLflow client that answers every call at once and records it: the order of what a run
    sends, without a server (the real-server tests below check what a server makes of it)."""

    def __init__(self, tracking_uri: str):
        from types import SimpleNamespace as NS

        self.uri, self.calls, self.NS = tracking_uri, [], NS

    def __getattr__(self, name):
        def call(*args, **kw):
            self.calls.append((name, args, kw))
            NS = self.NS
            if name == "get_experiment_by_name":
                return None
            if name == "create_experiment":
                return "7"
            if name == "create_run":
                return NS(info=NS(run_id="r1"))
            if name == "get_run":
                return NS(info=NS(experiment_id="7"), data=NS(params={}))
            return None

        return call


@pytest.mark.slow
def test_a_run_sends_its_start_each_epoch_its_files_and_its_status_in_that_order(tmp_path, monkeypatch):
    import mlflow

    from train import train

    clients = []
    monkeypatch.setattr(
        mlflow, "MlflowClient", lambda tracking_uri: clients.append(Recording(tracking_uri)) or clients[-1]
    )
    monkeypatch.setattr(tracking, "check_reachable", lambda uri: None)
    s = tiny_settings(tmp_path, export=False, report="quick", mlflow_tracking_uri="http://127.0.0.1:9")
    result = train(s)
    assert result.status == "completed"
    (client,) = clients
    names = [name for name, _, _ in client.calls]
    assert names[:5] == ["get_experiment_by_name", "create_experiment", "create_run", "log_batch", "get_run"]
    epochs = [kw["metrics"] for name, _, kw in client.calls[5:] if name == "log_batch"]
    assert [{m.key: m.step for m in ms}["val_accuracy"] for ms in epochs] == [12, 24]  # at the global step
    uploads = [Path(args[1]).name for name, args, _ in client.calls if name == "log_artifact"]
    assert uploads == ["manifest.json", "config.json", "report.html", "curves.png", "metrics.csv"]
    assert client.calls[-1][:2] == ("set_terminated", ("r1", "FINISHED"))
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["mlflow"] == {
        "run_id": "r1",
        "experiment_id": "7",
        "tracking_uri": "http://127.0.0.1:9",
        "tracking": "on",
    }
    log = (result.run_dir / "train.log").read_text()
    # The checkout's own state (a working tree with edits) may add its warning; MLflow must add none.
    warnings = [line for line in log.splitlines() if "WARNING" in line and "the checkout has uncommitted" not in line]
    line = "MLflow: logging to run r1 in experiment 7 at http://127.0.0.1:9 (in a browser: http://127.0.0.1:9/#/experiments/7/runs/r1)"
    assert line in log and not warnings, warnings


class Silent:
    """A server on 127.0.0.1 that accepts every connection, reads the request and never answers (with
    `health`, it answers GET /health, as a server whose API hangs). `held` are the connections it
    holds unanswered; `requests` the first line of each request."""

    def __init__(self, health: bool = False):
        import socket

        self.health, self.held, self.requests = health, [], []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        first = data.split(b"\r\n", 1)[0].decode("latin-1")
        self.requests.append(first)
        if self.health and first.startswith("GET /health "):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
            conn.close()
            return
        self.held.append(conn)

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _fit_against(server: Silent, tmp_path: Path, epochs: int, constants: dict | None = None, **env: str):
    from builders import write_tiny_npz
    from faults import fit_flags, start_fit

    flags = fit_flags(tmp_path, write_tiny_npz(tmp_path), epochs=epochs, export=False, report="quick")
    return start_fit(flags, tmp_path, extra_env={"MLFLOW_TRACKING_URI": server.uri, **env}, constants=constants)


# The deadlines of a run against a server that never answers, shortened in the training child so
# that a test waits seconds, not the product's minute: the same code ends the wait, at 4 s (2 s
# once a stop is asked for) instead of FLUSH_SECONDS (STOP_FLUSH_SECONDS).
SHORT_FLUSH, SHORT_STOP_FLUSH = 4.0, 2.0
SHORT_DEADLINES = {
    "train.tracking.mlflow_run.FLUSH_SECONDS": SHORT_FLUSH,
    "train.tracking.mlflow_run.STOP_FLUSH_SECONDS": SHORT_STOP_FLUSH,
}


def _ended(proc, timeout: float = 900) -> int:
    """The exit code; the timeout is only a guard against a hang (then the process is killed)."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# The user's own MLFLOW_HTTP_REQUEST_TIMEOUT wins; an hour stands for a server that keeps a call
# alive for ever (trickling bytes, which no client timeout catches): only the deadline ends the wait.
FOREVER = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "3600"}


@pytest.mark.slow
def test_a_server_that_never_answers_costs_the_training_nothing_and_no_credential_lands_anywhere(tmp_path):
    """The credentials where they belong (MLflow's own variables) reach no file and no console."""
    from faults import output

    secrets = {"MLFLOW_TRACKING_TOKEN": "tok-" + SECRET, "MLFLOW_TRACKING_USERNAME": "usr-" + SECRET}
    secrets["MLFLOW_TRACKING_PASSWORD"] = "pw-" + SECRET
    with Silent() as server:
        proc = _fit_against(server, tmp_path, epochs=2, **secrets)
        rc = _ended(proc)
        out = output(proc)
        assert server.requests and set(server.requests) == {"GET /health HTTP/1.1"}  # each held until the check gave up
    assert rc == 0, out[-3000:]
    from faults import manifest, only_run

    run_dir = only_run(tmp_path / "runs")
    recorded = manifest(run_dir)
    assert recorded["status"] == "completed" and recorded["epochs_completed"] == 2
    assert recorded["mlflow"]["tracking"] == "off" and "/health cannot be reached" in recorded["mlflow"]["reason"]
    # One line when the run ended before the first check gave up; two when an epoch ended first (the
    # start is tried again at each epoch's end, and a last line at the end says tracking was off).
    lines = [line for line in out.splitlines() if "MLflow" in line]
    assert len(lines) <= 2 and "WARNING: MLflow tracking off for this run: " in lines[-1], lines
    assert _files_and_output_holding(tmp_path, out, [SECRET]) == []


@pytest.mark.slow
def test_a_server_whose_api_never_answers_costs_the_training_nothing(tmp_path):
    from faults import manifest, only_run, output

    with Silent(health=True) as server:
        proc = _fit_against(
            server, tmp_path, epochs=2, constants=SHORT_DEADLINES, MLFLOW_TRACKING_TOKEN="tok-" + SECRET, **FOREVER
        )
        rc = _ended(proc)  # a training blocked by the server would never end
        out = output(proc)
        assert server.held  # the process ended with the server still holding its call
    assert rc == 0, out[-3000:]
    recorded = manifest(only_run(tmp_path / "runs"))
    assert recorded["status"] == "completed" and recorded["epochs_completed"] == 2
    assert recorded["mlflow"] == {
        "tracking": "off",
        "reason": f"{server.uri} did not answer within {SHORT_FLUSH:.0f} s",
    }
    (line,) = [line for line in out.splitlines() if "MLflow" in line]
    assert f"WARNING: MLflow: not sent within {SHORT_FLUSH:.0f} s (no answer from {server.uri}): " in line
    assert "the MLflow run's start, metrics of epochs 1-2, manifest.json, config.json" in line and "run status" in line
    assert _files_and_output_holding(tmp_path, out, [SECRET]) == []


@pytest.mark.slow
def test_sigterm_ends_the_run_whatever_the_tracking_server_does(tmp_path):
    from faults import manifest, only_run, output, wait_until

    with Silent(health=True) as server:
        proc = _fit_against(server, tmp_path, epochs=100, constants=SHORT_DEADLINES, **FOREVER)
        try:  # an epoch trained (its metrics queued for a server that never answers), then the stop
            assert wait_until(lambda: "epoch 1/100:" in output(proc), proc, timeout=900), output(proc)[-3000:]
            proc.send_signal(signal.SIGTERM)
        finally:
            rc = _ended(proc)
        out = output(proc)
        assert server.held
    assert rc == 75, out[-3000:]
    recorded = manifest(only_run(tmp_path / "runs"))
    assert recorded["status"] == "interrupted" and recorded["mlflow"]["tracking"] == "off"
    (line,) = [line for line in out.splitlines() if "MLflow" in line]
    assert f"not sent within {SHORT_STOP_FLUSH:.0f} s (no answer from {server.uri}): the MLflow run's start" in line


# --- a real server ----------------------------------------------------------------------------


def _server_executable() -> str | None:
    given = os.environ.get("MLFLOW_SERVER")
    if given:
        return shutil.which(given) or given
    own = PROJECT_ROOT / ".venv-mlflow-server" / "bin" / "mlflow"
    return str(own) if own.is_file() else None


def _server_or_skip() -> str:
    exe = _server_executable()
    if exe is None:
        pytest.skip(
            server_missing(
                "MLflow server",
                "scripts/venv-mlflow-server.sh installs one into .venv-mlflow-server (or MLFLOW_SERVER=/path/to/mlflow); "
                "neither requirements/cpu.lock nor the image has it",
            )
        )
    return exe


def test_a_run_of_the_suite_names_the_real_server_tests_it_skipped_and_how_to_run_them(tmp_path, monkeypatch):
    """The banner of tests/conftest.py, in a pytest run of its own: two tests skipped for the reason
    _server_or_skip gives, one for another reason (not named), and the closing counts line still last."""
    monkeypatch.setattr(sys.modules[__name__], "_server_executable", lambda: None)
    monkeypatch.delenv("REQUIRE_ALL", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _server_or_skip()
    # The banner lives in conftest.py; its real-server plugins (modules beside it) are not needed here.
    conftest = (Path(__file__).resolve().parents[1] / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(re.sub(r"(?m)^pytest_plugins = .*$", "", conftest))
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        f"def test_needs_a_server():\n    pytest.skip({skipped.value.msg!r})\n"
        f"def test_needs_it_too():\n    pytest.skip({skipped.value.msg!r})\n"
        "def test_other():\n    pytest.skip('no GPU')\n"
        "def test_fine():\n    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=HELPERS_PATH),
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    banner = next(i for i, line in enumerate(lines) if "2 test(s) SKIPPED: no MLflow server installed" in line)
    text = "\n".join(lines[banner:])
    assert "skipped: test_x.py::test_needs_a_server" in text and "skipped: test_x.py::test_needs_it_too" in text
    assert "test_other" not in text and "scripts/venv-mlflow-server.sh" in text and "REQUIRE_ALL=1" in text
    assert re.fullmatch(r"1 passed, 3 skipped in .*", lines[-1])


@contextlib.contextmanager
def _running_server(args: list[str], home: Path, port: int):
    """`mlflow <args>` in `home`, until /health on 127.0.0.1:`port` answers; stopped afterwards."""
    log_path = home / "server.log"
    # The compose service's environment: without the server's job runner (a second process for
    # server-side jobs, which tracking never asks for), 12 s shorter to start, 10 s to stop, on one slow core.
    env = {**os.environ, **_compose_file()["services"]["mlflow"]["environment"]}
    with open(log_path, "wb") as out:
        # SIGTERM when the tests die: the mlflow command passes it on to its uvicorn, which SIGKILL would leave.
        proc = server_process(
            [_server_or_skip(), *args],
            signal.SIGTERM,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=home,
            env=env,
            start_new_session=True,
        )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc, log_path)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def _server_args(home: Path, port: int, artifacts: str) -> list[str]:
    """`mlflow server` on 127.0.0.1:`port`, one worker, SQLite in `home`, artifacts in home/`artifacts`."""
    return [
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{home / 'mlflow.db'}",
        "--artifacts-destination",
        str(home / artifacts),
    ]


def _compose_server_args(home: Path, port: int) -> list[str]:
    """The compose service's own command line, with its paths moved under `home`, on `port`, one worker."""
    command = _compose_file()["services"]["mlflow"]["command"]
    moved = [
        a.replace("--host=0.0.0.0", "--host=127.0.0.1")
        .replace("--port=5000", f"--port={port}")
        .replace("/mlflow/", f"{home}/")
        for a in command[1:]
    ]
    return [*moved, "--workers=1"]


SERVER_HOMES: dict[str, Path] = {}  # the module's server: its folder, by URI


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1, started with the compose service's own command
    (SQLite backend, artifacts served): its URI."""
    _server_or_skip()
    home = tmp_path_factory.mktemp("mlflow-server")
    (port,) = free_local_ports(1)
    with _running_server(_compose_server_args(home, port), home, port):
        uri = f"http://127.0.0.1:{port}"
        SERVER_HOMES[uri] = home
        yield uri


def test_every_test_against_the_real_server_is_slow():
    """Its start alone takes seconds of both cores: the fast tier never waits for it."""
    fast = [
        name
        for name, test in globals().items()
        if name.startswith("test_")
        and "mlflow_server" in inspect.signature(test).parameters
        and not any(mark.name == "slow" for mark in getattr(test, "pytestmark", []))
    ]
    assert fast == [], "mark these @pytest.mark.slow: " + ", ".join(fast)


def _wait_healthy(uri: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Until /health answers 200, or the server exits (then its log is the failure message). The
    bound only keeps a hung server from hanging the suite; it asserts nothing about speed."""
    give_up = time.monotonic() + 600
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(uri + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"mlflow server never answered /health:\n{log_path.read_text()[-3000:]}")


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _artifacts(client, run_id, path=None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= _artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


@pytest.mark.slow
def test_a_run_logs_params_metrics_tags_and_files_to_a_real_server(mlflow_server, tmp_path, capfd):
    from train import train

    s = tiny_settings(
        tmp_path, report="quick", export=True, mlflow_tracking_uri=mlflow_server, mlflow_experiment="template-tests"
    )
    result = train(s)
    assert result.status == "completed"
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    run_id = manifest["mlflow"]["run_id"]
    assert manifest["mlflow"]["tracking_uri"] == mlflow_server
    # The link is train.log's; the client's own "View run" lines would be stdout's only.
    experiment = manifest["mlflow"]["experiment_id"]
    assert (
        f"(in a browser: {mlflow_server}/#/experiments/{experiment}/runs/{run_id})"
        in (result.run_dir / "train.log").read_text()
    )
    assert "View run" not in capfd.readouterr().out

    client = _client(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == result.run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "template-tests"
    params = run.data.params
    assert params["batch_size"] == "32" and params["epochs"] == "2" and params["dataset"] == s.dataset
    assert "mlflow_tracking_uri" not in params and len(params) == len(s.to_dict()) - 2

    history = client.get_metric_history(run_id, "val_accuracy")
    steps_per_epoch = -(-384 // 32)  # tiny_settings: 384 training examples
    assert [m.step for m in history] == [steps_per_epoch, 2 * steps_per_epoch]
    assert [m.value for m in history] == pytest.approx([r["val_accuracy"] for r in result.history])
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [steps_per_epoch, 2 * steps_per_epoch]

    tags = run.data.tags
    assert tags["commit"].startswith(str(manifest["git"]["commit"]))
    assert tags["lock_sha256"] == manifest["requirements_lock"]["sha256"]
    assert tags["data_fingerprint"] == manifest["data"]["fingerprint"] and tags["image"]

    files = _artifacts(client, run_id)
    assert {
        "manifest.json",
        "config.json",
        "report.html",
        "curves.png",
        "metrics.csv",
        "export/model.keras",
        "export/labels.txt",
        "export/savedmodel/saved_model.pb",
    } <= files
    local = Path(client.download_artifacts(run_id, "manifest.json", str(tmp_path)))
    assert json.loads(local.read_text())["status"] == "completed"  # the final manifest, not the one at start


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_mlflow_run(mlflow_server, tmp_path, monkeypatch):
    from train import train
    from train.training import stop_flag

    s = tiny_settings(tmp_path, epochs=1, export=False, report="quick", mlflow_tracking_uri=mlflow_server)
    original = stop_flag.StopFlag.check
    calls = {"n": 0}

    def stop_at_step_5(self):
        calls["n"] += 1
        if calls["n"] == 5:
            self.request("test stop")
        return original(self)

    monkeypatch.setattr(stop_flag.StopFlag, "check", stop_at_step_5)
    stopped = train(s)
    assert stopped.status == "interrupted"
    run_id = json.loads((stopped.run_dir / "manifest.json").read_text())["mlflow"]["run_id"]
    client = _client(mlflow_server)
    assert client.get_run(run_id).info.status == "KILLED"

    monkeypatch.setattr(stop_flag.StopFlag, "check", original)
    resumed = train(s.replace(epochs=2), resume=stopped.run_dir.name)
    assert resumed.status == "completed"
    assert json.loads((stopped.run_dir / "manifest.json").read_text())["mlflow"]["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "1"  # params cannot change; the run's config.json artifact has EPOCHS=2
    steps = [m.step for m in client.get_metric_history(run_id, "val_accuracy")]
    assert steps == [12, 24]  # both epochs, the first trained across the stop, on the global step
    local = Path(client.download_artifacts(run_id, "manifest.json", str(tmp_path)))
    segments = json.loads(local.read_text())["segments"]  # the artifact is the newest manifest
    assert [seg["status"] for seg in segments] == ["interrupted", "completed"]
    experiment_runs = client.search_runs([run.info.experiment_id], f"attributes.run_name = '{stopped.run_dir.name}'")
    assert [r.info.run_id for r in experiment_runs] == [run_id]  # no second MLflow run


@pytest.mark.slow  # a real MLflow server
def test_a_resume_that_starts_the_mlflow_run_sends_the_epochs_trained_before_it(mlflow_server, tmp_path):
    """The first segment tracked nowhere (no URI, or a server that never answered): the MLflow run the
    resume makes holds every epoch, each at the global step it ended on, as an uninterrupted run's."""
    from train import train

    s = tiny_settings(tmp_path, epochs=1, export=False, report="off")
    first = train(s)
    assert first.status == "completed" and "mlflow" not in json.loads((first.run_dir / "manifest.json").read_text())
    resumed = train(s.replace(epochs=2, mlflow_tracking_uri=mlflow_server), resume=first.run_dir.name)
    assert resumed.status == "completed"
    run_id = json.loads((first.run_dir / "manifest.json").read_text())["mlflow"]["run_id"]
    client = _client(mlflow_server)
    history = client.get_metric_history(run_id, "val_accuracy")
    assert [m.step for m in history] == [12, 24]  # 384 examples in batches of 32, as the loop counts them
    csv_rows = (first.run_dir / "metrics.csv").read_text().splitlines()
    assert [f"{m.value:.6g}" for m in history] == [row.split(",")[4] for row in csv_rows[1:]]
    started = [line for line in (first.run_dir / "train.log").read_text().splitlines() if "MLflow: logging to" in line]
    assert len(started) == 1 and started[0].endswith("; metrics of epoch 1 (trained before it) sent from metrics.csv")


@pytest.mark.slow  # a real MLflow server
def test_a_continued_mlflow_run_gets_the_epochs_of_a_segment_tracked_nowhere(mlflow_server, tmp_path):
    """Epoch 2 trained with MLFLOW_TRACKING_URI unset: the run continued at epoch 3 had a hole at its
    step; only the missing epoch is sent, nothing twice."""
    from train import train

    s = tiny_settings(tmp_path, epochs=1, export=False, report="off", mlflow_tracking_uri=mlflow_server)
    first = train(s)
    assert train(s.replace(epochs=2, mlflow_tracking_uri=""), resume=first.run_dir.name).status == "completed"
    assert train(s.replace(epochs=3), resume=first.run_dir.name).status == "completed"
    run_id = json.loads((first.run_dir / "manifest.json").read_text())["mlflow"]["run_id"]
    history = _client(mlflow_server).get_metric_history(run_id, "epoch")
    assert sorted((m.step, m.value) for m in history) == [(12, 1.0), (24, 2.0), (36, 3.0)]
    started = [line for line in (first.run_dir / "train.log").read_text().splitlines() if "MLflow: continuing" in line]
    assert len(started) == 1 and started[0].endswith("; metrics of epoch 2 (missing from it) sent from metrics.csv")


def _csv(run_dir: Path, rows: list[tuple[int, float, int]]) -> None:
    lines = ["epoch,loss,accuracy,batch_size"] + [f"{e},{loss},0.5,{b}" for e, loss, b in rows]
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_the_epochs_before_a_segment_are_at_the_steps_their_batch_sizes_make(tmp_path):
    """A resume that changed BATCH_SIZE: each epoch's steps at its own batch size; rows of the epochs
    this segment trains again, and every row of a manifest that lacks the counts, are not sent."""
    run_dir = tmp_path
    _csv(run_dir, [(1, 0.9, 100), (2, 0.5, 100), (3, 0.4, 64), (4, 0.3, 64)])
    manifest = {"data": {"n_train": 1000}, "segments": [{"epoch_from": 0}, {"epoch_from": 3}]}
    assert [(e, step, m["loss"]) for e, step, m in tracking.earlier_epochs(run_dir, manifest)] == [
        (1, 10, 0.9),
        (2, 20, 0.5),
        (3, 36, 0.4),  # ceil(1000 / 64) = 16 steps
    ]
    assert tracking.earlier_epochs(run_dir, {"data": {}, "segments": [{"epoch_from": 3}]}) == []
    assert tracking.earlier_epochs(run_dir, {"data": {"n_train": 1000}, "segments": [{"epoch_from": 0}]}) == []


def test_a_batch_size_changed_within_an_epoch_puts_the_epochs_where_the_loop_counted_them(tmp_path):
    """BATCH_SIZE 128 -> 256 (--force) at step 72 of epoch 3 (step 36 in batches of 256), as a real run
    recorded it: the loop ended epoch 3 at global step 844 + 72 + 175 = 1091, not 844 + 211, and the
    segment after epoch 4 starts at 1302; epochs 1-2 stay where they ended."""
    _csv(tmp_path, [(1, 0.9, 128), (2, 0.5, 128), (3, 0.4, 256), (4, 0.3, 256)])
    manifest = {
        "data": {"n_train": 54001},
        "segments": [
            {"epoch_from": 0},
            {"epoch_from": 2, "resumed_from": "ckpt-000000916.npz (epoch 3, step 36)"},
            {"epoch_from": 4, "resumed_from": "ckpt-000001302.npz (epoch 5, step 0)"},
        ],
        "distribution": [{"from_global_step": 0}, {"from_global_step": 916}, {"from_global_step": 1302}],
    }
    assert [(e, step) for e, step, _ in tracking.earlier_epochs(tmp_path, manifest)] == [
        (1, 422),
        (2, 844),
        (3, 1091),
        (4, 1302),
    ]


def test_rows_repeated_or_missing_in_metrics_csv_end_the_epochs_sent(tmp_path):
    """An edited metrics.csv: epoch 2 twice put epoch 3 at the step the segment logs epoch 4 at."""
    manifest = {"data": {"n_train": 1000}, "segments": [{"epoch_from": 0}, {"epoch_from": 3}]}
    _csv(tmp_path, [(1, 0.9, 100), (2, 0.5, 100), (2, 0.5, 100), (3, 0.4, 100)])
    assert [(e, step) for e, step, _ in tracking.earlier_epochs(tmp_path, manifest)] == [(1, 10), (2, 20)]
    _csv(tmp_path, [(1, 0.9, 100), (3, 0.4, 100)])
    assert [(e, step) for e, step, _ in tracking.earlier_epochs(tmp_path, manifest)] == [(1, 10)]


def test_epochs_the_new_run_could_not_take_are_one_warning_and_tracking_goes_on(
    tmp_path, answering, caplog, train_log_propagates
):
    (tmp_path / "metrics.csv").write_text("epoch,loss,batch_size\n1,0.9,32\n")
    segments = {"data": {"n_train": 64}, "segments": [{"epoch_from": 1}]}

    class _Refusing(_Client):
        def log_batch(self, run_id, params=(), tags=(), metrics=(), synchronous=False):
            if metrics:
                raise RuntimeError("INVALID_PARAMETER_VALUE: no\nthe server's trace")
            super().log_batch(run_id, params, tags, metrics, synchronous)

    with caplog.at_level(logging.WARNING, logger="train"):
        tracker, client = answering(tmp_path, experiments={"exp": "3"}, manifest=segments, client=_Refusing)
    assert tracker.off is None and tracker.run_id == "new-run"
    assert [r.getMessage() for r in caplog.records] == [
        "WARNING: MLflow: metrics of epoch 1 trained before this MLflow run not sent "
        "(INVALID_PARAMETER_VALUE: no); metrics.csv has them"
    ]


@pytest.mark.slow
def test_with_two_workers_only_the_chief_logs(mlflow_server, tmp_path):
    from builders import write_tiny_npz
    from faults import env, fit_flags, only_run

    npz = write_tiny_npz(tmp_path)
    workers = ",".join(f"127.0.0.1:{p}" for p in free_local_ports(2))
    procs = []
    for i in range(2):
        cwd = tmp_path / f"w{i}"  # each its own RUNS_DIR: no shared disk, as on two hosts
        cwd.mkdir()
        with open(cwd / "out.txt", "w") as out:
            flags = fit_flags(cwd, npz, epochs=2, export=False, report="quick", mlflow_experiment="two-workers")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "train", "fit", *flags],
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env(WORKERS=workers, WORKER_INDEX=str(i), MLFLOW_TRACKING_URI=mlflow_server),
                )
            )
    codes = [p.wait(timeout=900) for p in procs]  # the timeout only guards against a hang
    outputs = [(tmp_path / f"w{i}" / "out.txt").read_text() for i in range(2)]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    chief_run = only_run(tmp_path / "w0" / "runs")
    assert "MLflow: logging to run" in outputs[0] and "MLflow" not in outputs[1]
    client = _client(mlflow_server)
    experiment = client.get_experiment_by_name("two-workers")
    (run,) = client.search_runs([experiment.experiment_id])  # one MLflow run, not one per worker
    assert run.info.run_name == chief_run.name and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")] == [12, 24]


@pytest.mark.slow
def test_a_server_lost_mid_run_costs_warnings_not_the_run(tmp_path, monkeypatch):
    from train import train

    home = tmp_path / "server"
    home.mkdir()
    (port,) = free_local_ports(1)
    args = _server_args(home, port, "a")
    with _running_server(args, home, port) as server:
        original = tracking.Tracker.log_epoch

        def log_then_lose_the_server(self, row, step):
            original(self, row, step)
            if server.poll() is None:  # once epoch 1 is queued: the server goes away
                # The run is made on the tracking thread: lose the server after it exists, not before.
                assert self._started.wait(300)
                os.killpg(server.pid, 9)
                server.wait()

        monkeypatch.setattr(tracking.Tracker, "log_epoch", log_then_lose_the_server)
        s = tiny_settings(tmp_path, export=False, report="quick", mlflow_tracking_uri=f"http://127.0.0.1:{port}")
        result = train(s)
    assert result.status == "completed" and result.epochs_completed == 2
    lines = (result.run_dir / "train.log").read_text().splitlines()
    warned = [line.split(" ", 2)[2] for line in lines if "WARNING: MLflow" in line]
    assert warned and all(w.startswith("WARNING: MLflow: ") and "training goes on" in w for w in warned)
    assert any(re.search(r"epoch \d+ metrics not logged", w) for w in warned)
    assert any("run status not logged" in w for w in warned)
    assert json.loads((result.run_dir / "manifest.json").read_text())["status"] == "completed"


# --- the packages -------------------------------------------------------------------------------


def _pinned(lock: str, name: str) -> str:
    found = re.findall(rf"^{re.escape(name)}==(\S+)", (PROJECT_ROOT / lock).read_text(), re.MULTILINE)
    assert len(found) == 1, (lock, name, found)
    return found[0]


def test_the_test_server_is_the_clients_version_and_neither_is_in_the_cores_locks():
    if not (PROJECT_ROOT / "requirements/mlflow-server.lock").is_file():
        pytest.skip("the test server's lock is host-side (not in the image)")
    client = _pinned("requirements/mlflow.lock", "mlflow-skinny")  # the mlflow extra's client
    assert _pinned("requirements/all.lock", "mlflow-skinny") == client
    assert _pinned("requirements/mlflow-server.lock", "mlflow") == client
    assert f"mlflow=={client}" in (PROJECT_ROOT / "requirements/mlflow-server.in").read_text()
    for lock in ("requirements/cpu.lock", "requirements/gpu.lock", "requirements/mlflow.lock"):
        text = (PROJECT_ROOT / lock).read_text()
        for server_only in (
            "mlflow",
            "flask",
            "gunicorn",
            "pandas",
            *(("mlflow-skinny",) if "mlflow." not in lock else ()),
        ):
            assert not re.search(rf"^{server_only}==", text, re.MULTILINE), (lock, server_only)


# --- the compose profile -------------------------------------------------------------------------


def _compose_file() -> dict:
    from yamlish import load

    path = PROJECT_ROOT / "docker-compose.yml"
    if not path.is_file():
        pytest.skip("the compose files are host-side (not in the image)")
    return load(path.read_text())


def test_the_mlflow_profile_is_a_local_only_server_with_sqlite_and_artifacts_on_a_volume():
    compose = _compose_file()
    server = compose["services"]["mlflow"]
    assert server["profiles"] == ["mlflow"]
    client = _pinned("requirements/mlflow.lock", "mlflow-skinny")
    assert server["image"] == "${MLFLOW_IMAGE:-ghcr.io/mlflow/mlflow:v" + client + "}"  # the client's version
    assert server["ports"] == ["127.0.0.1:${MLFLOW_PORT:-5000}:5000"]  # loopback only: no authentication
    assert server["volumes"] == ["mlflow:/mlflow"] and "mlflow" in compose["volumes"]
    command = server["command"]
    assert command[:2] == ["mlflow", "server"] and "--serve-artifacts" in command
    assert "--backend-store-uri=sqlite:////mlflow/mlflow.db" in command  # on the volume
    assert "--artifacts-destination=/mlflow/artifacts" in command
    train = compose["services"]["train"]
    assert train["environment"]["MLFLOW_TRACKING_URI"] == "${MLFLOW_TRACKING_URI:-}"
    assert train["depends_on"]["mlflow"] == {"condition": "service_healthy", "required": False}


def test_the_training_container_reaches_a_tracking_server_on_the_host_by_name():
    """docs/tracking.md's recipe: MLFLOW_TRACKING_URI=http://host.docker.internal:5000, on Linux too."""
    train = _compose_file()["services"]["train"]
    assert "host.docker.internal:host-gateway" in train["extra_hosts"]


def _compose_binary() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


@pytest.mark.docker
def test_compose_starts_the_server_only_with_its_profile_and_points_the_training_at_it():
    _compose_file()
    compose = _compose_binary()
    if compose is None:
        pytest.skip("no Docker Compose v2 binary (docker compose / docker-compose) installed")

    def config(*args, **env):
        out = subprocess.run(
            [*compose, *args, "config", "--format", "json"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", ""), **env},
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    plain = config()
    assert set(plain["services"]) == {"train"}
    assert plain["services"]["train"]["environment"]["MLFLOW_TRACKING_URI"] == ""
    on = config("--profile", "mlflow", MLFLOW_TRACKING_URI="http://mlflow:5000")
    assert set(on["services"]) == {"train", "mlflow"}
    assert on["services"]["train"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    (port,) = on["services"]["mlflow"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "5000", 5000)


@pytest.mark.slow
def test_the_profiles_server_command_runs_and_answers_the_training_containers_host_name(mlflow_server):
    """The compose service's own command line (the module's server runs it), with its paths moved."""
    port = mlflow_server.rsplit(":", 1)[1]

    def status(host: str) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert status("mlflow:5000") == 200  # how the train service reaches it
    assert status(f"localhost:{port}") == 200  # a browser on this machine
    assert status("attacker.example:5000") == 403  # anything else: refused (DNS rebinding)
    assert (SERVER_HOMES[mlflow_server] / "mlflow.db").is_file()


def test_the_health_check_asks_once_with_its_timeout_and_names_what_failed(monkeypatch):
    import urllib.error
    import urllib.request

    calls, answer = [], {}

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            calls.append(("read", n))
            return b"OK"

    def urlopen(url, timeout):
        calls.append((url, timeout))
        if "error" in answer:
            raise answer["error"]
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    tracking.check_reachable("https://mlflow.example/", timeout=2.5)  # a trailing / is not doubled
    assert calls == [("https://mlflow.example/health", 2.5), ("read", 64)]  # a long body is not read whole
    for error, says in (
        (urllib.error.HTTPError("u", 503, "unavailable", {}, None), "https://HOST-X/health answered HTTP 503"),
        (urllib.error.URLError("refused"), "https://HOST-X/health cannot be reached (refused)"),
        (OSError("network is down"), "https://HOST-X/health cannot be reached (network is down)"),
    ):
        answer["error"] = error
        with pytest.raises(tracking.TrackingUnavailable) as exc:
            tracking.check_reachable("https://HOST-X")  # only slashes are stripped
        assert str(exc.value) == says


def test_what_each_call_sends_to_the_server(tmp_path):
    _run_files(tmp_path)
    (tmp_path / "export").mkdir()
    client = Recording("http://127.0.0.1:9")
    before = int(time.time() * 1000)
    tracker = _tracker(tmp_path, client, run_id="r9")
    assert tracker._thread.daemon and tracker._thread.name == "mlflow-tracking"  # a hung server never holds the exit
    row = {"epoch": 2, "loss": 0.5, "accuracy": 0.75}
    tracker.log_epoch(row, 40)
    after = int(time.time() * 1000)
    tracker.finish("no such status")
    (batch,) = [c for c in client.calls if c[0] == "log_batch"]
    assert batch[1] == ("r9",) and batch[2]["synchronous"] is True
    sent = [(m.key, m.value, m.step) for m in batch[2]["metrics"]]
    assert sent == [(k, v, 40) for k, v in tracking.epoch_metrics(row).items()] and sent
    assert all(before <= m.timestamp <= after for m in batch[2]["metrics"])  # milliseconds since the epoch
    uploads = [(name, args) for name, args, _ in client.calls if name.startswith(("log_artifact", "set_terminated"))]
    assert uploads == [
        *(("log_artifact", ("r9", str(tmp_path / n))) for n in ("manifest.json", "config.json", "report.html")),
        ("log_artifacts", ("r9", str(tmp_path / "export"), "export")),
        ("set_terminated", ("r9", "FAILED")),  # a status it does not know: FAILED
    ]


@pytest.mark.parametrize(
    "status, mlflow_status",
    [("completed", "FINISHED"), ("failed", "FAILED"), ("interrupted", "KILLED"), ("budget", "KILLED")],
)
def test_the_mlflow_run_ends_with_the_status_of_how_the_segment_ended(tmp_path, status, mlflow_status):
    client = Recording("http://127.0.0.1:9")
    _tracker(tmp_path, client, run_id="r9").finish(status)
    assert [args for name, args, _ in client.calls if name == "set_terminated"] == [("r9", mlflow_status)]


class _UploadsFail(Recording):
    """A client whose file uploads fail; every other call is answered."""

    def __getattr__(self, name):
        if name == "log_artifact":

            def fail(*args, **kw):
                self.calls.append((name, args, kw))
                raise ConnectionError("upload refused")

            return fail
        return super().__getattr__(name)


def test_after_a_failed_upload_the_export_is_not_tried_but_the_status_is_sent(tmp_path, caplog, train_log_propagates):
    _run_files(tmp_path)
    (tmp_path / "export").mkdir()
    client = _UploadsFail("http://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="train"):
        _tracker(tmp_path, client, run_id="r9").finish("completed")
    assert [(name, args) for name, args, _ in client.calls] == [
        ("log_artifact", ("r9", str(tmp_path / "manifest.json"))),  # fails: no other upload waits out its retries
        ("set_terminated", ("r9", "FINISHED")),
    ]
    assert [r.getMessage() for r in caplog.records] == [
        "WARNING: MLflow: manifest.json not logged (ConnectionError: upload refused); training goes on"
    ]


def test_every_tag_from_a_whole_manifest_and_from_an_empty_one():
    manifest = {
        "run_id": "r1",
        "image": "registry/train:1",
        "git": {"commit": "abc123", "dirty": False, "source": "git"},
        "requirements_lock": {"file": "/app/requirements/cpu.lock", "sha256": "ff"},
        "data": {"fingerprint": "cd", "dataset": "mnist"},
    }
    assert tracking.tags_from_manifest(manifest) == {
        "commit": "abc123",
        "mlflow.source.git.commit": "abc123",
        "lock": "requirements/cpu.lock",
        "lock_sha256": "ff",
        "data_fingerprint": "cd",
        "dataset": "mnist",
        "image": "registry/train:1",
        "run_dir": "r1",
    }
    assert tracking.tags_from_manifest({}) == {
        "commit": "unknown",
        "mlflow.source.git.commit": "",
        "lock": "unknown",
        "lock_sha256": "unknown",
        "data_fingerprint": "unknown",
        "dataset": "unknown",
        "image": "none (a git checkout)",
        "run_dir": "",
    }
    # Made in an image that recorded no commit: no tag can be named, so where the commit came from.
    assert tracking.image_of({"git": {"source": "/app/BUILD_COMMIT"}}) == "an image (/app/BUILD_COMMIT)"


def test_a_value_left_out_of_the_epoch_metrics_leaves_the_next_ones_in():
    assert tracking.epoch_metrics({"mfu": None, "loss": 0.5, "val_loss": float("inf"), "epoch": 1}) == {
        "loss": 0.5,
        "epoch": 1.0,
    }


def test_what_was_not_sent_without_epochs_or_with_two_and_a_message_s_first_line():
    assert tracking._names(["manifest.json", "run status"]) == "manifest.json, run status"
    assert tracking._names(["epoch 1 metrics", "epoch 2 metrics"]) == "metrics of epochs 1-2"
    assert tracking._why(ValueError("")) == "ValueError"  # no message: its type
    assert tracking._why(ValueError("  first\nsecond")) == "first"
    assert tracking._why(ValueError("x" * 400)) == "x" * 300


class _ExportFails(Recording):
    """A client whose folder upload (export/) fails; every other call is answered."""

    def __getattr__(self, name):
        if name == "log_artifacts":

            def fail(*args, **kw):
                raise ConnectionError("export refused")

            return fail
        return super().__getattr__(name)


def test_a_failed_export_upload_is_named_export(tmp_path, caplog, train_log_propagates):
    (tmp_path / "export").mkdir()
    with caplog.at_level(logging.WARNING, logger="train"):
        _tracker(tmp_path, _ExportFails("http://127.0.0.1:9")).finish("completed")
    assert [r.getMessage() for r in caplog.records] == [
        "WARNING: MLflow: export/ not logged (ConnectionError: export refused); training goes on"
    ]


def test_a_start_that_never_answers_is_recorded_as_tracking_off_and_why(tmp_path, monkeypatch):
    (tmp_path / "manifest.json").write_text("{}")
    release = threading.Event()
    monkeypatch.setattr(tracking, "STOP_FLUSH_SECONDS", 0.2)
    tracker = tracking.Tracker(tmp_path, "http://127.0.0.1:9", lambda: release.wait(600) and 1 / 0)
    tracker.finish("interrupted")
    release.set()
    assert json.loads((tmp_path / "manifest.json").read_text())["mlflow"] == {
        "tracking": "off",
        "reason": "http://127.0.0.1:9 did not answer within 0 s",
    }


def test_a_row_without_an_epoch_is_queued_and_named_epoch_metrics(tmp_path, caplog, train_log_propagates):
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = _tracker(tmp_path, Down())
        tracker.log_epoch({"loss": 1.0}, 10)  # never raises into the training, whatever the row holds
        tracker.finish("completed")
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: MLflow: {what} not logged (ConnectionError: connection refused); training goes on"
        for what in ("epoch metrics", "manifest.json", "run status")
    ]


# --- start() against a client that answers in this process -------------------------------------


class _Client:
    """The MlflowClient calls start() makes, answered from `runs` ({run_id: (experiment_id, params)})."""

    made: list[_Client] = []

    def __init__(self, tracking_uri: str, runs: dict | None = None, experiments: dict | None = None):
        self.tracking_uri, self.calls = tracking_uri, []
        self.runs, self.experiments = runs or {}, experiments or {}
        _Client.made.append(self)

    def get_experiment_by_name(self, name):
        self.calls.append(("get_experiment_by_name", name))
        found = self.experiments.get(name)
        return None if found is None else type("E", (), {"experiment_id": found})()

    def create_experiment(self, name):
        self.calls.append(("create_experiment", name))
        return "new-exp"

    def create_run(self, experiment_id, run_name):
        self.calls.append(("create_run", experiment_id, run_name))
        self.runs["new-run"] = (experiment_id, {})
        return type("R", (), {"info": type("I", (), {"run_id": "new-run"})()})()

    def get_run(self, run_id):
        self.calls.append(("get_run", run_id))
        if run_id not in self.runs:
            raise RuntimeError(f"RESOURCE_DOES_NOT_EXIST: Run '{run_id}' not found\nthe server's trace")
        experiment_id, params = self.runs[run_id]
        info, data = type("I", (), {"experiment_id": experiment_id})(), type("D", (), {"params": params})()
        return type("R", (), {"info": info, "data": data})()

    def update_run(self, run_id, status):
        self.calls.append(("update_run", run_id, status))

    def log_batch(self, run_id, params=(), tags=(), metrics=(), synchronous=False):
        sent = {"params": {p.key: p.value for p in params}, "tags": {t.key: t.value for t in tags}}
        self.calls.append(("log_batch", run_id, sent, synchronous))

    def set_terminated(self, run_id, status):
        self.calls.append(("set_terminated", run_id, status))


URI = "http://127.0.0.1:9"


@pytest.fixture
def answering(monkeypatch):
    """start() with _Client for MlflowClient and a reachable server; returns a function that makes the
    client's answers and starts: (tracker, client)."""
    import mlflow

    monkeypatch.setattr(tracking, "check_reachable", lambda uri: None)
    _Client.made = []

    def run(run_dir: Path, previous: dict | None = None, uri: str = URI, manifest=None, client=_Client, **answers):
        monkeypatch.setattr(mlflow, "MlflowClient", lambda tracking_uri: client(tracking_uri, **answers))
        manifest = {"run_id": run_dir.name, "git": {"commit": "c0ffee", "source": "git"}, **(manifest or {})}
        (run_dir / "manifest.json").write_text(json.dumps({**manifest, **({"mlflow": previous} if previous else {})}))
        tracker = tracking.start(uri, "exp", run_dir, {"epochs": 5, "seed": 1, "mlflow_tracking_uri": uri})
        assert tracker._started.wait(60)
        (client,) = _Client.made
        return tracker, client

    return run


def test_start_makes_a_new_run_in_the_experiment_with_the_params_and_tags(tmp_path, answering, caplog):
    with caplog.at_level(logging.INFO, logger="train"):
        tracker, client = answering(tmp_path, experiments={"exp": "3"})
        tracker.finish("completed")
    assert client.tracking_uri == URI and tracker.off is None
    assert client.calls[-1] == ("set_terminated", "new-run", "FINISHED")  # the tracker logs through that client
    tags = tracking.tags_from_manifest({"run_id": tmp_path.name, "git": {"commit": "c0ffee", "source": "git"}})
    assert client.calls[:4] == [
        ("get_experiment_by_name", "exp"),
        ("create_run", "3", tmp_path.name),
        ("log_batch", "new-run", {"params": {"epochs": "5", "seed": "1"}, "tags": tags}, True),
        ("get_run", "new-run"),
    ]
    link = f"(in a browser: {URI}/#/experiments/3/runs/new-run)"
    assert f"MLflow: logging to run new-run in experiment 3 at {URI} {link}" in [r.getMessage() for r in caplog.records]
    recorded = json.loads((tmp_path / "manifest.json").read_text())["mlflow"]
    assert recorded == {"run_id": "new-run", "experiment_id": "3", "tracking_uri": URI, "tracking": "on"}


def test_start_makes_the_experiment_when_the_server_has_none_of_that_name(tmp_path, answering):
    tracker, client = answering(tmp_path)
    assert client.calls[:3] == [
        ("get_experiment_by_name", "exp"),
        ("create_experiment", "exp"),
        ("create_run", "new-exp", tmp_path.name),
    ]
    assert (tracker.run_id, tracker.experiment_id) == ("new-run", "new-exp")


def test_a_resume_continues_the_recorded_run_and_logs_only_the_params_it_lacks(tmp_path, answering, caplog):
    previous = {"run_id": "old", "experiment_id": "3", "tracking_uri": URI}
    with caplog.at_level(logging.INFO, logger="train"):
        tracker, client = answering(tmp_path, previous, runs={"old": ("3", {"epochs": "3"})})
    assert client.calls[:5] == [
        ("get_run", "old"),
        ("update_run", "old", "RUNNING"),
        ("get_run", "old"),
        ("log_batch", "old", {"params": {"seed": "1"}, "tags": client.calls[3][2]["tags"]}, True),
        ("get_run", "old"),
    ]
    assert (tracker.run_id, tracker.experiment_id) == ("old", "3")
    link = f"(in a browser: {URI}/#/experiments/3/runs/old)"
    assert f"MLflow: continuing run old in experiment 3 at {URI} {link}" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    "previous, says",
    [
        (
            {"run_id": "gone", "tracking_uri": "http://elsewhere:5000"},
            f"WARNING: MLflow: run gone (tracked at http://elsewhere:5000) not found at {URI} "
            "(RESOURCE_DOES_NOT_EXIST: Run 'gone' not found): a new MLflow run is started",
        ),
        (
            {"run_id": "gone", "tracking_uri": URI},
            f"WARNING: MLflow: run gone not found at {URI} (RESOURCE_DOES_NOT_EXIST: Run 'gone' not found): "
            "a new MLflow run is started",
        ),
    ],
)
def test_a_resume_the_server_cannot_continue_starts_a_new_run_in_one_warning(
    tmp_path, answering, caplog, train_log_propagates, previous, says
):
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker, client = answering(tmp_path, previous, experiments={"exp": "3"}, runs={"old": ("3", {})})
    assert [r.getMessage() for r in caplog.records] == [says]
    assert tracker.run_id == "new-run" and ("create_run", "3", tmp_path.name) in client.calls
    assert not any(call[0] == "update_run" for call in client.calls)


def test_start_sets_the_clients_defaults_and_leaves_the_users_own(tmp_path, answering, monkeypatch):
    for key in tracking.CLIENT_DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3600")
    answering(tmp_path, experiments={"exp": "3"})
    assert {k: os.environ[k] for k in tracking.CLIENT_DEFAULTS} == {
        **tracking.CLIENT_DEFAULTS,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "3600",
    }


def test_a_failed_start_is_one_warning_naming_the_error_and_the_uri(tmp_path, caplog, train_log_propagates):
    def refused():
        raise PermissionError("403 Forbidden\nthe page")

    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = tracking.Tracker(tmp_path, URI, refused)
        assert tracker._started.wait(60)
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: MLflow tracking off for this run: PermissionError: 403 Forbidden (MLFLOW_TRACKING_URI={URI}); "
        "training goes on"
    ]


def test_the_manifest_is_written_once_per_tracking_state(tmp_path, monkeypatch):
    writes, real = [], tracking.update_manifest
    monkeypatch.setattr(tracking, "update_manifest", lambda path, **kw: writes.append(kw) or real(path, **kw))
    (tmp_path / "manifest.json").write_text("{}")
    tracker = _tracker(tmp_path, Recording(URI))
    assert tracker._started.wait(60)
    for epoch in (1, 2, 3):
        tracker.log_epoch({"epoch": epoch, "loss": 1.0}, epoch)
    tracker.finish("completed")
    assert writes == [{"mlflow": {"run_id": "run", "experiment_id": "0", "tracking_uri": URI, "tracking": "on"}}]


def test_a_manifest_that_cannot_be_written_is_one_error_line_and_never_raises(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    def full(path, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking, "update_manifest", full)
    with caplog.at_level(logging.ERROR, logger="train"):
        tracker = _tracker(tmp_path, Recording(URI))
        assert tracker._started.wait(60)
        tracker.record()
    assert [r.getMessage() for r in caplog.records] == [
        f"could not record MLflow tracking in {tmp_path / 'manifest.json'}: [Errno 28] No space left on device"
    ]


def test_without_a_stop_finish_waits_the_whole_flush_deadline(tmp_path, monkeypatch, caplog, train_log_propagates):
    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 1.0)  # the line names 1 s; a stop's deadline would be 0 s
    monkeypatch.setattr(tracking, "STOP_FLUSH_SECONDS", 0.2)
    client = Held()
    with caplog.at_level(logging.WARNING, logger="train"):
        _tracker(tmp_path, client).finish("completed")  # the status call never answers
    client.release.set()
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: MLflow: not sent within 1 s (no answer from {URI}): manifest.json, run status; the run directory has all of it"
    ]


def _server_answers_once_finish_waits(monkeypatch, client: Held, tracker: tracking.Tracker, stop=None) -> None:
    """The held `client` is released from the final flush's wait, never before it: after finish queued
    everything (and, with `stop`, after a stop asked for during that wait was noticed)."""
    from types import SimpleNamespace

    real = time.sleep

    def sleep(seconds):
        if tracker._ending and stop is not None and not stop.reason:
            stop.request("received SIGTERM")  # the next pass of the wait notices it
        elif tracker._ending:
            client.release.set()
        real(min(seconds, 0.01))

    monkeypatch.setattr(tracking, "time", SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=sleep))


def test_finish_queues_its_files_and_status_even_behind_a_full_queue_of_epochs(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 600.0)  # a safety net: the server answers during the flush
    _run_files(tmp_path)
    client = Held()
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = _tracker(tmp_path, client)
        tracker.log_epoch({"epoch": 1, "loss": 1.0}, 1)
        assert client.entered.wait(60)  # the thread is held by epoch 1's call ...
        for epoch in range(2, tracking.QUEUE_SIZE + 2):  # ... while the queue fills up to QUEUE_SIZE
            tracker.log_epoch({"epoch": epoch, "loss": 1.0}, epoch)
        _server_answers_once_finish_waits(monkeypatch, client, tracker)
        tracker.finish("completed")
    assert client.calls == ["log_batch"] * (tracking.QUEUE_SIZE + 1) + ["log_artifact"] * 3 + ["set_terminated"]
    assert caplog.records == []


def test_a_stop_during_the_final_flush_still_gives_the_server_the_stop_deadline(
    tmp_path, monkeypatch, caplog, train_log_propagates
):
    from train.training.stop_flag import StopFlag

    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 3600.0)
    monkeypatch.setattr(tracking, "STOP_FLUSH_SECONDS", 600.0)  # a safety net: the server answers at once
    client, stop = Held(), StopFlag()
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = _tracker(tmp_path, client)
        assert tracker._started.wait(60)
        _server_answers_once_finish_waits(monkeypatch, client, tracker, stop)
        tracker.finish("completed", stop)
    assert stop.reason and client.calls == ["log_artifact", "set_terminated"]  # the manifest record() wrote
    assert caplog.records == []  # sent after the stop, within STOP_FLUSH_SECONDS of it: nothing is named


def test_what_the_tracker_says_about_its_server_shows_the_uri_masked():
    from train.tracking.mlflow_run import TrackingUnavailable, check_reachable

    # An @ after the first / is a path to the HTTP client, so the URI is accepted; shown, it is masked.
    uri = f"http://127.0.0.1:9/a/{SECRET}@b"
    assert load_settings({"mlflow_tracking_uri": uri}, env_file=None, environ={}).to_dict()["mlflow_tracking_uri"] == (
        "http://***@b"
    )
    with pytest.raises(TrackingUnavailable) as info:
        check_reachable(uri, timeout=2)
    assert SECRET not in str(info.value) and str(info.value).startswith("http://***@b/health")


def _start_against(uri: str, run_dir: Path, experiment: str, previous: dict | None = None):
    """tracking.start on a run directory whose manifest records `previous` (the MLflow run of an
    earlier segment), against a real server: the tracker once its start is done."""
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"run_id": run_dir.name, "git": {"commit": "c0ffee", "source": "git"}}
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, **({"mlflow": previous} if previous else {})}))
    tracker = tracking.start(uri, experiment, run_dir, {"epochs": 1, "mlflow_tracking_uri": uri})
    assert tracker._started.wait(120)
    return tracker


@pytest.mark.slow  # a real MLflow server
def test_a_resume_whose_mlflow_run_was_deleted_starts_a_new_run(mlflow_server, tmp_path, caplog, train_log_propagates):
    """A deleted run is still found by the server, which refuses every write to it: a new run, as
    for a run not found, never tracking off for this and every later segment."""
    client = _client(mlflow_server)
    experiment_id = client.create_experiment(f"deleted-run-{time.time_ns()}")
    old = client.create_run(experiment_id).info.run_id
    client.delete_run(old)
    previous = {"run_id": old, "experiment_id": experiment_id, "tracking_uri": mlflow_server}
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = _start_against(mlflow_server, tmp_path / "run", client.get_experiment(experiment_id).name, previous)
        tracker.finish("completed")
    assert tracker.off is None and tracker.run_id != old
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: MLflow: run {old} was deleted at {mlflow_server}: a new MLflow run is started"
    ]


@pytest.mark.slow  # a real MLflow server
def test_a_deleted_experiment_is_one_warning_saying_how_to_restore_it(
    mlflow_server, tmp_path, caplog, train_log_propagates
):
    client = _client(mlflow_server)
    name = f"deleted-experiment-{time.time_ns()}"
    experiment_id = client.create_experiment(name)
    client.delete_experiment(experiment_id)
    with caplog.at_level(logging.WARNING, logger="train"):
        tracker = _start_against(mlflow_server, tmp_path / "run", name)
        tracker.finish("completed")
    why = (
        f"the experiment {name!r} (id {experiment_id}) is deleted in MLflow: restore it (the UI, or "
        f"`mlflow experiments restore --experiment-id {experiment_id}`), or set MLFLOW_EXPERIMENT to another name"
    )
    assert tracker.off == why
    assert [r.getMessage() for r in caplog.records] == [
        f"WARNING: MLflow tracking off for this run: {why} (MLFLOW_TRACKING_URI={mlflow_server}); training goes on"
    ]
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["mlflow"] == {"tracking": "off", "reason": why}


@pytest.mark.slow  # a real MLflow server
def test_two_runs_starting_at_once_in_a_new_experiment_both_log_into_it(mlflow_server, tmp_path, monkeypatch):
    """Both find no experiment of that name and both create it; the server refuses the second
    (RESOURCE_ALREADY_EXISTS), whose run then logs into the one the first made."""
    from mlflow import MlflowClient

    name, both_looked = f"made-at-once-{time.time_ns()}", threading.Barrier(2, timeout=60)
    looked = MlflowClient.get_experiment_by_name

    def look_then_wait_for_the_other(self, experiment):
        found = looked(self, experiment)
        if threading.current_thread().name == "mlflow-tracking" and found is None and not both_looked.broken:
            with contextlib.suppress(threading.BrokenBarrierError):
                both_looked.wait()
        return found

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", look_then_wait_for_the_other)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir in runs:
        run_dir.mkdir()
        (run_dir / "manifest.json").write_text(json.dumps({"run_id": run_dir.name}))
    trackers = [tracking.start(mlflow_server, name, d, {"epochs": 1}) for d in runs]
    for tracker in trackers:
        assert tracker._started.wait(120)
        tracker.finish("completed")
    assert [t.off for t in trackers] == [None, None]
    experiment_id = _client(mlflow_server).get_experiment_by_name(name).experiment_id
    assert {t.experiment_id for t in trackers} == {experiment_id}


@pytest.mark.slow  # a real MLflow server
def test_a_resume_through_another_name_of_the_same_server_continues_its_mlflow_run(mlflow_server, tmp_path):
    """Tracked from compose as http://mlflow:5000 and resumed on the host as http://127.0.0.1:5000 (here
    127.0.0.1 and localhost): the same server, so the same MLflow run, never a second one."""
    first = _start_against(mlflow_server, tmp_path / "run", "Default")
    first.finish("interrupted")
    previous = json.loads((tmp_path / "run" / "manifest.json").read_text())["mlflow"]
    other_name = mlflow_server.replace("127.0.0.1", "localhost") + "/"
    resumed = _start_against(other_name, tmp_path / "run", "Default", previous)
    resumed.finish("completed")
    assert resumed.off is None and resumed.run_id == first.run_id
    assert _client(mlflow_server).get_run(first.run_id).info.status == "FINISHED"


class Restarted:
    """An MLflow client whose server is gone for the first `down` calls of log_batch, then back."""

    def __init__(self, down: int):
        self.down, self.batches = down, []

    def log_batch(self, run_id, metrics=(), **_):
        if self.down:
            self.down -= 1
            raise ConnectionError("connection refused")
        self.batches.append(sorted((m.step, m.key, m.value) for m in metrics))

    def __getattr__(self, name):
        return lambda *a, **k: None


def test_metrics_a_lost_server_missed_are_sent_with_the_next_epoch_once_it_is_back(
    tmp_path, caplog, train_log_propagates
):
    """A tracking server restarted mid-run: the epochs it missed reach it with the first epoch after,
    at their own steps, so its curves have no hole."""
    _run_files(tmp_path)
    client = Restarted(down=2)
    with caplog.at_level(logging.INFO, logger="train"):
        tracker = _tracker(tmp_path, client)
        for epoch in (1, 2, 3, 4):
            tracker.log_epoch({"epoch": epoch, "loss": 1.0 / epoch}, 10 * epoch)
        tracker.finish("completed")
    assert client.batches == [
        [(10, "epoch", 1.0), (10, "loss", 1.0), (20, "epoch", 2.0), (20, "loss", 0.5), (30, "epoch", 3.0)]
        + [(30, "loss", 1 / 3)],
        [(40, "epoch", 4.0), (40, "loss", 0.25)],
    ]
    lines = [r.getMessage() for r in caplog.records]
    assert "MLflow: metrics of epochs 1-2 sent late, with epoch 3 metrics" in lines
    assert sum("not logged" in line for line in lines) == 1  # the same error again says nothing more


def test_metrics_kept_for_a_lost_server_are_bounded_by_what_one_call_takes(tmp_path, monkeypatch):
    _run_files(tmp_path)
    monkeypatch.setattr(tracking, "LATE_METRICS", 4)
    client = Restarted(down=3)
    tracker = _tracker(tmp_path, client)
    for epoch in (1, 2, 3, 4):
        tracker.log_epoch({"epoch": epoch, "loss": 1.0}, epoch)
    tracker.finish("completed")
    assert [{step for step, _, _ in batch} for batch in client.batches] == [{2, 3, 4}]  # epoch 1 left out


def test_a_call_the_server_does_not_answer_is_named_by_what_happened(tmp_path, monkeypatch):
    """The client's error is 300 characters of its request and connection pool before the words that
    say what happened (Connection refused); the warning keeps those words."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    for key, value in tracking.CLIENT_DEFAULTS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    (port,) = free_local_ports(1)
    with pytest.raises(Exception) as refused:
        MlflowClient(f"http://127.0.0.1:{port}").log_batch("run", metrics=[Metric("loss", 1.0, 0, 1)], synchronous=True)
    assert tracking._why(refused.value) == "no answer from the server: Connection refused"
    assert tracking._why(RuntimeError("RESOURCE_DOES_NOT_EXIST: Run 'x' not found")).startswith("RESOURCE_DOES")


def test_a_server_down_for_many_epochs_is_one_warning_then_one_line_when_back(tmp_path, caplog, train_log_propagates):
    _run_files(tmp_path)
    client = Restarted(down=5)
    with caplog.at_level(logging.INFO, logger="train"):
        tracker = _tracker(tmp_path, client)
        for epoch in range(1, 8):
            tracker.log_epoch({"epoch": epoch, "loss": 1.0}, epoch)
        tracker.finish("completed")
    lines = [
        r.getMessage() for r in caplog.records if "MLflow: " in r.getMessage() and "logging to" not in r.getMessage()
    ]
    assert lines == [
        "WARNING: MLflow: epoch 1 metrics not logged (ConnectionError: connection refused); training goes on",
        "MLflow: metrics of epochs 1-5 sent late, with epoch 6 metrics",
    ]


class _Refused(Exception):
    """What the client raises for a request the server refuses for its content (HTTP 400)."""

    def get_http_status_code(self):
        return 400


def test_metrics_the_server_refused_are_not_sent_again_with_the_next_epoch(tmp_path):
    """Kept for later only when the server may take them later: a batch refused for what it holds
    would make every later epoch's call fail too."""
    _run_files(tmp_path)
    client = Restarted(down=0)
    refuse_once = [True]

    def log_batch(run_id, metrics=(), **_):
        if refuse_once.pop() if refuse_once else False:
            raise _Refused("INVALID_PARAMETER_VALUE: refused")
        client.batches.append(sorted((m.step, m.key) for m in metrics))

    client.log_batch = log_batch
    tracker = _tracker(tmp_path, client)
    for epoch in (1, 2):
        tracker.log_epoch({"loss": 1.0}, epoch)
    tracker.finish("completed")
    assert client.batches == [[(2, "loss")]]
