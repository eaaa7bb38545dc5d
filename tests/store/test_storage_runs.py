"""Runs with RUNS_DIR=s3://...: every command, the faults of the store, and the loss of the whole machine.

Each `python -m train` runs in a subprocess with its own HOME (so its own STORE_CACHE) and working
directory, as on another machine; the bucket is read with a stock client (the MinIO SDK). The server is
a real SeaweedFS on 127.0.0.1 (tests/servers_s3.py). Every wait is for an event: an object in the
bucket, a line of output, the process's end."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from builders import write_tiny_npz
from faults import env, fit_flags, output, start_fit, wait_until
from servers_s3 import dead_endpoint

# 3 epochs x 24 steps, a state every 4 steps: a few seconds of training, many checkpoints.
RUN = dict(epochs=3, batch_size=16, checkpoint_every=4, deterministic=True, precision="float32", export=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_tiny_npz(tmp_path_factory.mktemp("data"))


QUICK_RETRIES = {"train.store.mirror.BACKOFF_SECONDS": (0.2, 0.5, 1.0)}


class Machine:
    """A HOME, a temp folder and a working directory of their own: what a lost machine takes with it."""

    def __init__(self, root: Path, server, **env_changes: str):
        self.root = root
        self.home, self.cwd, self.tmp = root / "home", root / "work", root / "tmp"
        for d in (self.home, self.cwd, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {**(server.env() if server else {}), "HOME": str(self.home), "TMPDIR": str(self.tmp), **env_changes}

    def fit(self, flags: list[str], constants: dict | None = None) -> subprocess.Popen:
        return start_fit(flags, self.cwd, extra_env=self.env, constants=constants)

    def command(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "train", *args],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            env=env(**self.env),
            timeout=timeout,
        )

    def lose(self) -> None:
        """The machine is gone: its home (and the cache in it), temp files and working directory."""
        shutil.rmtree(self.root)


def _flags(tmp_path: Path, npz: Path, bucket: str, **changes) -> list[str]:
    return fit_flags(tmp_path, npz, runs_dir=f"s3://{bucket}/runs", **{**RUN, **changes})


def _runs_in(server, bucket) -> dict[str, dict[str, bytes]]:
    """{run name: {path inside the run: contents}} as the bucket holds them."""
    runs: dict[str, dict[str, bytes]] = {}
    for key, body in server.keys(bucket, "runs/").items():
        name, rel = key[len("runs/") :].split("/", 1)
        runs.setdefault(name, {})[rel] = body
    return runs


def _in_bucket(server, bucket, pattern: str):
    """A predicate: an object whose name inside its run matches `pattern` (a glob) is in the bucket."""
    import fnmatch

    return lambda: any(fnmatch.fnmatch(key.split("/", 2)[-1], pattern) for key in server.names(bucket, "runs/"))


def _checkpoint_in_bucket(server, bucket):
    return _in_bucket(server, bucket, "checkpoints/ckpt-*.npz")


def _in_the_bucket(tmp_path: Path, server, bucket: str, monkeypatch, *names: str, weights=True) -> Path:
    """Runs' records (and best weights, with `weights`) put in the bucket under runs/, this process's store
    set to it with a staging cache in tmp_path; the staging copy's runs folder (empty until a command)."""
    from builders import write_run_records

    client = server.client()
    for name in names:
        made = write_run_records(tmp_path / "made" / name)
        if weights:
            (made / "best.weights.h5").write_bytes(b"weights")
        for path in made.rglob("*"):
            client.fput_object(bucket, f"runs/{name}/{path.relative_to(made).as_posix()}", str(path))
    for key, value in {**server.env(), "STORE_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return server.staging(tmp_path / "cache", bucket)


def _staging(machine: Machine, bucket: str) -> Path:
    at = (
        machine.env["AWS_ENDPOINT_URL"].split("://", 1)[1].replace(":", "_")
    )  # another server's bucket of that name: another folder
    return machine.home / ".cache/tf-train-template/runs" / f"s3@{at}" / bucket / "runs"


# -- faults at start: one line, exit 7, before any training ---------------------------------------
def test_a_store_that_does_not_answer_stops_fit_before_training(tmp_path, data, s3_server):
    machine = Machine(tmp_path / "m", s3_server, AWS_ENDPOINT_URL=dead_endpoint())
    proc = machine.fit(_flags(tmp_path, data, "some-bucket"))
    assert proc.wait(timeout=300) == 7
    out = output(proc)
    assert "StorageError: RUNS_DIR s3://some-bucket/runs: the store at http://127.0.0.1:" in out
    assert "does not answer" in out and "epoch" not in out and "devices:" not in out
    assert not any(_staging(machine, "some-bucket").glob("2*")), "no run directory was created"


def test_wrong_credentials_are_one_line_and_exit_7(tmp_path, data, s3_server, s3_bucket):
    machine = Machine(tmp_path / "m", s3_server, AWS_SECRET_ACCESS_KEY="not-the-secret-123")
    proc = machine.fit(_flags(tmp_path, data, s3_bucket))
    assert proc.wait(timeout=300) == 7
    out = output(proc)
    errors = [line for line in out.splitlines() if line.startswith("StorageError")]
    assert len(errors) == 1 and "refused the credentials" in errors[0] and "AWS_SECRET_ACCESS_KEY" in errors[0]
    assert "not-the-secret-123" not in out and "epoch" not in out


def test_a_missing_bucket_is_one_line_naming_it(tmp_path, data, s3_server):
    machine = Machine(tmp_path / "m", s3_server)
    proc = machine.fit(_flags(tmp_path, data, "no-such-bucket"))
    assert proc.wait(timeout=300) == 7
    assert "StorageError: RUNS_DIR s3://no-such-bucket/runs: bucket 'no-such-bucket' does not exist" in output(proc)


# -- every command, each from a machine that has never seen the run -------------------------------
@pytest.mark.slow
def test_fit_to_a_bucket_then_runs_report_export_predict_and_resume_from_fresh_machines(
    tmp_path, data, s3_server, s3_bucket
):
    trainer = Machine(tmp_path / "trainer", s3_server)
    proc = trainer.fit(_flags(tmp_path, data, s3_bucket, epochs=2, report="quick"))
    assert proc.wait(timeout=600) == 0, output(proc)[-3000:]
    runs = _runs_in(s3_server, s3_bucket)
    assert len(runs) == 1
    name, files = next(iter(runs.items()))
    # The layout in the bucket is the local run directory's, file for file (the lease is gone).
    local = _staging(trainer, s3_bucket) / name
    here = {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()} - {"run.lock"}
    assert set(files) == here
    for rel in ("config.json", "manifest.json", "metrics.csv", "train.log", "best.weights.h5", "final.weights.h5"):
        assert rel in files, rel
    latest = files["checkpoints/LATEST"].decode().strip()
    assert f"checkpoints/{latest}" in files
    assert json.loads(files["manifest.json"])["status"] == "completed"
    # The last uploads come after train.log's last line ("run ... ended: completed").
    assert files["train.log"] == (local / "train.log").read_bytes()
    assert b"ended: completed" in files["train.log"].splitlines()[-1]
    assert json.loads(files["config.json"])["runs_dir"] == f"s3://{s3_bucket}/runs"

    listed = Machine(tmp_path / "lister", s3_server).command("runs", "--runs-dir", f"s3://{s3_bucket}/runs")
    assert listed.returncode == 0 and name in listed.stdout, listed.stderr

    s3_server.client().remove_object(s3_bucket, f"runs/{name}/report.html")
    reported = Machine(tmp_path / "reporter", s3_server).command(
        "report", name, "--quick", "--runs-dir", f"s3://{s3_bucket}/runs"
    )
    assert reported.returncode == 0, reported.stderr
    assert "report.html" in _runs_in(s3_server, s3_bucket)[name]
    assert f"run {name}: uploaded to s3://{s3_bucket}/runs/{name}/ (the paths printed" in reported.stderr

    exported = Machine(tmp_path / "exporter", s3_server).command(
        "export", "latest", "--runs-dir", f"s3://{s3_bucket}/runs"
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    files = _runs_in(s3_server, s3_bucket)[name]
    assert "export/model.keras" in files and any(rel.startswith("export/savedmodel/") for rel in files)

    from PIL import Image

    predictor = Machine(tmp_path / "predictor", s3_server)
    Image.new("L", (28, 28), 200).save(predictor.cwd / "digit.png")
    predicted = predictor.command("predict", name, "digit.png", "--runs-dir", f"s3://{s3_bucket}/runs")
    assert predicted.returncode == 0 and "digit.png" in predicted.stdout, predicted.stderr[-3000:]

    resumer = Machine(tmp_path / "resumer", s3_server)
    proc = resumer.fit(_flags(tmp_path, data, s3_bucket, epochs=3, report="quick") + ["--resume", "latest"])
    assert proc.wait(timeout=600) == 0, output(proc)[-3000:]
    assert "resuming at epoch 3" in output(proc)
    manifest = json.loads(_runs_in(s3_server, s3_bucket)[name]["manifest.json"])
    assert manifest["status"] == "completed" and len(manifest["resumed_at"]) == 1


# -- the lease between machines, and a stop that saves ---------------------------------------------
@pytest.mark.slow
def test_a_second_machine_is_refused_while_the_first_trains_and_sigterm_saves_to_the_store(
    tmp_path, data, s3_server, s3_bucket
):
    first = Machine(tmp_path / "first", s3_server)
    flags = _flags(tmp_path, data, s3_bucket, epochs=200, store_lease_seconds=6)
    proc = first.fit(flags)
    lease, state = _in_bucket(s3_server, s3_bucket, "run.lock"), _checkpoint_in_bucket(s3_server, s3_bucket)
    assert wait_until(lambda: lease() and state(), proc, timeout=600)
    name = next(iter(_runs_in(s3_server, s3_bucket)))
    second = Machine(tmp_path / "second", s3_server)
    refused = second.fit(flags + ["--resume", name])
    assert refused.wait(timeout=600) == 4
    busy = [line for line in output(refused).splitlines() if line.startswith("RunBusyError")]
    assert len(busy) == 1 and f"run {name} is in use by another process (pid {proc.pid} on host" in busy[0]
    assert proc.poll() is None, "the first run trains on"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=600) == 75, output(proc)[-3000:]
    files = _runs_in(s3_server, s3_bucket)[name]
    assert json.loads(files["manifest.json"])["status"] == "interrupted"
    assert "run.lock" not in files
    local = _staging(first, s3_bucket) / name / "checkpoints"
    assert files["checkpoints/LATEST"] == (local / "LATEST").read_bytes()  # the newest state reached the store
    assert f"checkpoints/{files['checkpoints/LATEST'].decode().strip()}" in files


# -- the store lost mid-run ------------------------------------------------------------------------
@pytest.mark.slow
def test_a_store_lost_mid_run_training_goes_on_one_warning_and_everything_arrives_when_back(
    tmp_path, data, s3_server_factory
):
    server = s3_server_factory()
    bucket = server.make_bucket("lost-mid-run")
    machine = Machine(tmp_path / "m", server)
    # Retries a second apart at most, not the product's 30 s: the test waits for the store's return,
    # not for the next retry.
    proc = machine.fit(_flags(tmp_path, data, bucket, epochs=4), constants=QUICK_RETRIES)
    assert wait_until(_checkpoint_in_bucket(server, bucket), proc, timeout=600)
    server.kill()  # the store vanishes mid-epoch
    assert wait_until(lambda: "waiting up to" in output(proc), proc, timeout=600), output(proc)[-3000:]
    out = output(proc)
    assert "epoch 4/4:" in out, "training went on without the store"
    server.start()
    assert proc.wait(timeout=600) == 0, output(proc)[-3000:]
    out = output(proc)
    assert len([line for line in out.splitlines() if "WARNING: RUNS_DIR" in line]) == 1, out
    name, files = next(iter(_runs_in(server, bucket).items()))
    local = _staging(machine, bucket) / name
    assert "answers again" in (local / "train.log").read_text()
    assert json.loads(files["manifest.json"])["status"] == "completed"
    assert files["final.weights.h5"] == (local / "final.weights.h5").read_bytes()
    assert files["checkpoints/LATEST"] == (local / "checkpoints/LATEST").read_bytes()


@pytest.mark.slow
def test_a_store_that_stays_down_makes_the_exit_code_7_naming_what_is_only_local(tmp_path, data, s3_server_factory):
    server = s3_server_factory()
    bucket = server.make_bucket("down-for-good")
    machine = Machine(tmp_path / "m", server)
    proc = machine.fit(_flags(tmp_path, data, bucket, epochs=2, store_flush_seconds=3))
    assert wait_until(_checkpoint_in_bucket(server, bucket), proc, timeout=600)
    server.kill()
    assert proc.wait(timeout=600) == 7
    out = output(proc)
    errors = [line for line in out.splitlines() if line.startswith("StorageError")]
    assert len(errors) == 1 and "the newest state did not reach" in errors[0] and "--resume" in errors[0], out
    assert "ended: completed" in out  # the training itself finished; only the upload did not


# -- the promise: lose the whole machine ------------------------------------------------------------
@pytest.mark.slow
def test_machine_lost_mid_epoch_a_fresh_machine_continues_from_the_bucket_bit_identical(
    tmp_path_factory, data, s3_server, s3_bucket
):
    # The reference: the same settings, uninterrupted, on a local disk, in this process (only its
    # final weights are read: no TensorFlow start of its own).
    from faults import only_run
    from helpers import fit_in_process

    straight_dir = tmp_path_factory.mktemp("straight")
    assert fit_in_process(straight_dir, fit_flags(straight_dir, data, **RUN)) == 0

    reference = json.loads((only_run(straight_dir / "runs") / "manifest.json").read_text())["final_weights_sha256"]

    tmp = tmp_path_factory.mktemp("lost")
    flags = _flags(tmp, data, s3_bucket, store_lease_seconds=3)
    lost = Machine(tmp / "lost", s3_server)
    proc = lost.fit(flags)
    # Mid-epoch: once a state taken inside the first epoch (step 8 of 24) is in the bucket.
    assert wait_until(_in_bucket(s3_server, s3_bucket, "checkpoints/ckpt-000000008.npz"), proc, timeout=600)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    lost.lose()
    assert not (tmp / "lost").exists()

    fresh = Machine(tmp / "fresh", s3_server, RESUME="auto")  # the same settings, elsewhere
    proc = fresh.fit(flags)
    assert proc.wait(timeout=600) == 0, output(proc)[-3000:]
    out = output(proc)
    assert re.search(r"resuming at epoch 1, step (8|12|16|20) ", out), out[-3000:]  # mid-epoch, from the bucket
    assert re.search(r"files downloaded from s3://", out), out[-3000:]
    runs = _runs_in(s3_server, s3_bucket)
    assert len(runs) == 1, "the fresh machine continued the run, it did not start another"
    manifest = json.loads(next(iter(runs.values()))["manifest.json"])
    assert manifest["status"] == "completed" and len(manifest["resumed_at"]) == 1
    assert manifest["final_weights_sha256"] == reference
    print(f"\nFIGURES machine loss: SIGKILL once step 8 was in the bucket, fresh machine, sha identical: {True}")


def test_runs_and_compare_read_runs_a_stock_client_put_in_the_bucket(tmp_path, s3_server, s3_bucket):
    """Runs uploaded by hand (the layout is all there is to it), listed and compared from a fresh machine."""
    from builders import write_run_records

    names = ["20261201-100000-000001-base", "20261201-110000-000002-wide"]
    client = s3_server.client()
    for i, name in enumerate(names):
        run = write_run_records(tmp_path / "made" / name, config={"learning_rate": 0.001 * (i + 1)})
        for path in run.rglob("*"):
            if path.is_file():
                client.fput_object(s3_bucket, f"runs/{name}/{path.relative_to(run).as_posix()}", str(path))
    machine = Machine(tmp_path / "reader", s3_server)
    listed = machine.command("runs", "--runs-dir", f"s3://{s3_bucket}/runs")
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in names)
    compared = machine.command("compare", *names, "--runs-dir", f"s3://{s3_bucket}/runs")
    assert compared.returncode == 0, compared.stderr
    assert "LEARNING_RATE" in compared.stdout.upper() and "0.002" in compared.stdout


def test_a_bucket_run_names_its_url_from_its_first_line(tmp_path, s3_server, s3_bucket, monkeypatch):
    """In this process, stopped by SIGTERM during its start-up: the run's first line is all there is to see."""
    import os
    import types

    from helpers import tiny_settings

    from train import cli
    from train.commands import fit as fit_command
    from train.run import remote
    from train.setup import devices

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    settings = tiny_settings(tmp_path, runs_dir=f"s3://{s3_bucket}/runs", store_cache=str(tmp_path / "cache"))

    def signalled_setup(_settings, **_probes):
        os.kill(os.getpid(), signal.SIGTERM)
        return types.SimpleNamespace(strategy=None, replicas=1, describe=lambda: "devices: none (test)")

    monkeypatch.setattr(devices, "setup_devices", signalled_setup)
    monkeypatch.setattr(fit_command, "settings_for", lambda _args: settings)
    try:
        assert cli.main(["fit"]) == 75
    finally:
        remote.close_all()
    ((name, files),) = _runs_in(s3_server, s3_bucket).items()
    staged = s3_server.staging(tmp_path / "cache", s3_bucket) / name
    first = files["train.log"].decode().splitlines()[0]
    assert first.endswith(f" run {name}: s3://{s3_bucket}/runs/{name} (staged in {staged})"), first


def test_runs_shows_a_bucket_run_whose_lease_expired_as_killed_with_the_command_that_continues_it(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """A SIGKILLed run's records and lease object, as it leaves them, put with a stock client."""
    import json
    import time

    from builders import write_run_records

    from train.cli import main
    from train.run import remote
    from train.run.lock import RunLock

    killed, alive = "20261201-100000-000001-killed", "20261201-110000-000002-alive"
    client = s3_server.client()
    for name, renewed in ((killed, time.time() - 61), (alive, time.time())):
        made = write_run_records(tmp_path / "made" / name, manifest={"status": "running"})
        # The lease of a process that last renewed it `renewed`, for 60 s (STORE_LEASE_SECONDS).
        lease = {"holder": "pid 7 on host gone", "renewed": renewed, "seconds": 60.0}
        (tmp_path / "lease.json").write_text(json.dumps(lease))
        client.fput_object(s3_bucket, f"runs/{name}/run.lock", str(tmp_path / "lease.json"))
        for path in made.rglob("*"):
            client.fput_object(s3_bucket, f"runs/{name}/{path.relative_to(made).as_posix()}", str(path))
    for key, value in {**s3_server.env(), "STORE_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["runs", "--runs-dir", f"s3://{s3_bucket}/runs"]) == 0
        # A report or an export of the killed run takes its lease over and lets go: the run still reads as killed.
        RunLock(s3_server.staging(tmp_path / "cache", s3_bucket) / killed, reader=True).acquire().release()
        capsys.readouterr()
        assert main(["runs", "--runs-dir", f"s3://{s3_bucket}/runs"]) == 0
    finally:
        remote.close_all()
    out = capsys.readouterr().out.splitlines()
    status = {line.split()[0]: line.split()[1] for line in out[1:3]}
    assert status == {killed: "killed", alive: "running"}, out
    assert out[3:] == [
        f"{killed}: killed: its process ended without closing the run (SIGKILL, out of memory, the machine went "
        f"down); `python -m train fit --resume {killed} --runs-dir s3://{s3_bucket}/runs` continues it"
    ]


def test_runs_marks_a_run_only_in_this_machines_staging_copy_and_its_upload_puts_it_back(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """One run in the bucket; one in the staging copy only (deleted from the bucket, or its upload failed):
    both listed, the second with a line saying where it is and what uploads it."""
    from builders import write_run_records

    from train.cli import main
    from train.run import remote

    stored, local = "20261201-100000-000001-stored", "20261201-110000-000002-local"
    staging = _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, stored, weights=False)
    write_run_records(staging / local)
    (staging / local / "best.weights.h5").write_bytes(b"weights")  # trained here: more than `runs` brings
    url = f"s3://{s3_bucket}/runs"
    try:
        assert main(["runs", "--runs-dir", url]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [line.split()[0] for line in out[1:3]] == [stored, local], out
        assert out[3:] == [
            f"{local}: only in this machine's staging copy {staging / local}, not in {url} (deleted from the store, "
            f"or never uploaded): `python -m train report {local} --runs-dir {url}` on this machine uploads it whole; "
            "delete that folder to forget it"
        ]
        assert main(["runs", "--json", "--runs-dir", url]) == 0
        assert [r.get("staged_only") for r in json.loads(capsys.readouterr().out)] == [None, True]
        assert main(["report", local, "--runs-dir", url]) == 0  # what the line says uploads it
    finally:
        remote.close_all()
    assert {"config.json", "manifest.json", "metrics.csv", "report.html"} <= set(_runs_in(s3_server, s3_bucket)[local])


def test_a_run_deleted_from_the_bucket_whose_records_only_runs_brought_is_not_offered_for_upload(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """`runs` brings every run's records into the staging copy: after the run is deleted from the bucket,
    its note said `report` uploads it whole, which would put back a run without weights or checkpoints."""
    import io

    from minio.deleteobjects import DeleteObject

    from train.cli import main
    from train.run import remote

    name = "20261201-100000-000001-gone"
    staging = _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name)
    url = f"s3://{s3_bucket}/runs"
    client = s3_server.client()
    client.put_object(s3_bucket, f"runs/{name}/checkpoints/ckpt-000000004.npz", io.BytesIO(b"state"), 5)
    client.put_object(s3_bucket, f"runs/{name}/report.html", io.BytesIO(b"<html>"), 6)
    try:
        assert main(["runs", "--runs-dir", url]) == 0  # its records only, into the staging copy
        assert {p.name for p in (staging / name).iterdir() if p.is_file()} == {
            "config.json",
            "manifest.json",
            "metrics.csv",
        }, "what the table reads: no checkpoint, weights, report or log"
        gone = [DeleteObject(key) for key in s3_server.names(s3_bucket, f"runs/{name}/")]
        assert not list(client.remove_objects(s3_bucket, gone))
        capsys.readouterr()
        assert main(["runs", "--runs-dir", url]) == 0
    finally:
        remote.close_all()
    assert capsys.readouterr().out.splitlines()[2:] == [
        f"{name}: only its records are in this machine's staging copy {staging / name}, not in {url} (deleted "
        "from the store; an earlier `runs` brought them): delete that folder to forget it"
    ]


def test_export_latest_in_a_bucket_is_the_newest_run_with_weights_and_a_line_says_which(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """In this process, the export itself replaced: which run `latest` brings is the store's to decide."""

    import train.results.export
    from train.cli import main
    from train.run import remote

    trained, failed = "20261201-100000-000001-base", "20261201-110000-000002-wide"
    _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, trained)
    _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, failed, weights=False)
    exported = []
    monkeypatch.setattr(
        train.results.export,
        "export_run",
        lambda r, **kw: exported.append(r) or {"savedmodel": "s", "max_abs_diff": 0.0},
    )
    try:
        assert main(["export", "latest", "--runs-dir", f"s3://{s3_bucket}/runs"]) == 0
    finally:
        remote.close_all()
    assert [p.name for p in exported] == [trained] and (exported[0] / "best.weights.h5").read_bytes() == b"weights"
    lines = [
        f"latest: run {trained}, the newest run with weights (newer, without: {failed})",
        f"run {trained}: uploaded to s3://{s3_bucket}/runs/{trained}/ (the paths printed are its local staging copy)",
    ]
    assert capsys.readouterr().err.splitlines() == lines


@pytest.mark.parametrize("command", ["export", "report"])
def test_export_or_report_of_a_run_another_machine_writes_is_refused_and_uploads_nothing(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys, command
):
    """The holder's lease renewed by this test; this machine's staging copy holds a file the store lacks
    (a checkpoint from before the other took the run over): a refused export or report (which writes
    report.html and curves.png into the run) must not send it into that run."""

    from train.cli import main
    from train.run import remote
    from train.store import lease
    from train.store.client import Store, parse_url
    from train.store.lease import Lease

    monkeypatch.setattr(lease, "RENEWALS", 60)  # renewed every 0.1 s, not 2 s: the refusal comes that soon
    monkeypatch.setattr(lease, "POLL_SECONDS", 0.05)
    name = "20261201-100000-000001-base"
    _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name)
    staged = s3_server.staging(tmp_path / "cache", s3_bucket) / name
    (staged / "checkpoints").mkdir(parents=True)
    (staged / "checkpoints" / "ckpt-000000004.npz").write_bytes(
        b"a state of this machine's, before the other took over"
    )
    holder = Lease(Store(parse_url(f"s3://{s3_bucket}/runs")), f"{name}/run.lock", name, seconds=6).acquire()
    try:
        assert main([command, name, "--runs-dir", f"s3://{s3_bucket}/runs"]) == 4
    finally:
        holder.release()
        remote.close_all()
    assert not any(rel.startswith("checkpoints/") for rel in _runs_in(s3_server, s3_bucket)[name])
    (line,) = capsys.readouterr().err.splitlines()  # and no line saying it was uploaded
    assert line.startswith(f"RunBusyError: run {name} is in use by another process"), line


def test_an_export_that_fails_keeps_its_own_error_when_the_store_then_does_not_answer(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """In this process, the export replaced by one that fails once the store is gone: the user sees why the
    export failed and its exit code (8), and one warning that the store did not take what it wrote."""

    import train.results.export
    from train.cli import main
    from train.errors import ExportError
    from train.run import remote

    name = "20261201-100000-000001-base"
    _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name)

    def failing_export(_run_dir, **_kw):
        remote.close_all()  # the store this command opened is forgotten, and at its address now
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())  # nothing answers
        raise ExportError("max |diff| 1.0e-03 above 1e-05")

    monkeypatch.setattr(train.results.export, "export_run", failing_export)
    try:
        assert main(["export", name, "--runs-dir", f"s3://{s3_bucket}/runs"]) == 8
    finally:
        remote.close_all()
    warning, error = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"WARNING: StorageError: RUNS_DIR s3://{s3_bucket}/runs: the store at "), warning
    assert error == "ExportError: max |diff| 1.0e-03 above 1e-05"


def test_an_export_done_when_the_store_then_does_not_answer_says_where_it_is_and_what_uploads_it(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """In this process, the export replaced by one that succeeds, then the store gone: exit 7 with the store's
    message, after one line saying the export is complete on this machine and the command that uploads it."""

    import train.results.export
    from train.cli import main
    from train.run import remote

    name = "20261201-100000-000001-base"
    staging = _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name)

    def export_then_store_gone(_run_dir, **_kw):
        remote.close_all()  # the store this command opened is forgotten, and at its address now
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())  # nothing answers
        return {"savedmodel": "s", "max_abs_diff": 0.0}

    monkeypatch.setattr(train.results.export, "export_run", export_then_store_gone)
    url = f"s3://{s3_bucket}/runs"
    try:
        assert main(["export", "latest", "--runs-dir", url]) == 7
    finally:
        remote.close_all()
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2] == (
        f"run {name}: the export is complete in this machine's staging copy, "
        f"{staging / name / 'export'}, but not in the store: once the store "
        f"answers, `python -m train export {name} --runs-dir {url}` on this machine exports and uploads it"
    ), lines
    assert lines[-1].startswith(f"StorageError: RUNS_DIR {url}: the store at "), lines


def test_a_report_written_when_the_store_then_does_not_answer_says_where_it_is_and_what_uploads_it(
    tmp_path, s3_server, s3_bucket, monkeypatch, capsys
):
    """In this process, the real quick report, then the store gone: exit 7 with the store's message, after one
    line saying report.html is written on this machine and the command that uploads it (as export says)."""
    import train.results.report
    from train.cli import main
    from train.run import remote

    name = "20261201-100000-000001-base"
    staging = _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name, weights=False)
    write_report = train.results.report.write_report

    def report_then_store_gone(run_dir, **kw):
        written = write_report(run_dir, **kw)
        remote.close_all()  # the store this command opened is forgotten, and at its address now
        monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())  # nothing answers
        return written

    monkeypatch.setattr(train.results.report, "write_report", report_then_store_gone)
    url = f"s3://{s3_bucket}/runs"
    try:
        assert main(["report", "latest", "--quick", "--runs-dir", url]) == 7
    finally:
        remote.close_all()
    report = staging / name / "report.html"
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2] == (
        f"run {name}: the report is written in this machine's staging copy, {report}, but not in the store: once "
        f"the store answers, `python -m train report {name} --quick --runs-dir {url}` on this machine writes and "
        "uploads it"
    ), lines
    assert lines[-1].startswith(f"StorageError: RUNS_DIR {url}: the store at "), lines
    assert report.is_file() and f"runs/{name}/report.html" not in s3_server.names(s3_bucket, "runs/")


def test_reproduce_uploads_the_rerun_with_its_verdict_and_nothing_of_the_run_it_read(
    tmp_path, s3_server, s3_bucket, monkeypatch
):
    """In this process, the rerun itself replaced: what is uploaded is the command's to decide."""
    from builders import write_run_records

    import train.reproduce.rerun
    from train.cli import main
    from train.reproduce.rerun import Verdict
    from train.run import remote

    name = "20261201-100000-000001-base"
    # A checkpoint the bucket lacks, from before another machine took the run over: reproduce only reads the
    # run, and must not send it into the run the other machine trains.
    staged = _in_the_bucket(tmp_path, s3_server, s3_bucket, monkeypatch, name, weights=False) / name / "checkpoints"
    staged.mkdir(parents=True)
    (staged / "ckpt-000000004.npz").write_bytes(b"a state of this machine's, before the other took over")

    def rerun(run_dir, *_args, **_kw):
        again = write_run_records(run_dir.parent / f"repro-{run_dir.name}")
        (again / "reproduce.json").write_text('{"match": true}\n')
        return Verdict(run_dir.name, again.name, method="final weights sha256", match=True)

    monkeypatch.setattr(train.reproduce.rerun, "reproduce", rerun)
    try:
        assert main(["reproduce", name, "--local", "--runs-dir", f"s3://{s3_bucket}/runs"]) == 0
    finally:
        remote.close_all()
    stored = _runs_in(s3_server, s3_bucket)
    assert stored[f"repro-{name}"]["reproduce.json"] == b'{"match": true}\n'
    assert "config.json" in stored[f"repro-{name}"]  # a whole run of the bucket, listed by `runs`
    assert not any(rel.startswith("checkpoints/") for rel in stored[name])
