"""RUNS_DIR in object storage, without training: the URL, the store's errors, the lease, the uploads.

Against a real S3-compatible server on 127.0.0.1 (tests/servers_s3.py), never a mock."""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import tempfile
import threading
import time

import pytest
from servers_s3 import dead_endpoint

from train.config import load_settings
from train.errors import ConfigError, RunBusyError, StorageError
from train.run import remote
from train.store import lease
from train.store import remote as remote_store
from train.store.client import Conflict, Store, parse_url, store_error
from train.store.lease import Lease
from train.store.mirror import Mirror
from train.store.remote import RemoteRuns, Uploads


@pytest.fixture(autouse=True)
def _forget_opened_stores():
    yield
    remote.close_all()


@pytest.fixture(autouse=True)
def _quick_looks(monkeypatch):
    """A newcomer looks at a held lease every 0.05 s, not 0.5 s: its wait ends that soon after the event."""
    monkeypatch.setattr(lease, "POLL_SECONDS", 0.05)


def _settings(tmp_path, **values):
    values.setdefault("store_cache", str(tmp_path / "cache"))
    return load_settings(values, env_file=None, environ={})


def _store(server, bucket, monkeypatch, prefix="runs", **env) -> Store:
    for name, value in server.env(**env).items():
        monkeypatch.setenv(name, value)
    return Store(parse_url(f"s3://{bucket}/{prefix}"))


# -- the URL -------------------------------------------------------------------------------------
def test_an_s3_url_is_a_store_not_a_local_folder(tmp_path):
    s = _settings(tmp_path, runs_dir="s3://my-bucket/team/runs")
    assert s.runs_dir == "s3://my-bucket/team/runs"
    assert str(parse_url(s.runs_dir)) == "s3://my-bucket/team/runs"
    assert parse_url("s3://my-bucket/").prefix == ""
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize(
    "value, says",
    [
        ("s3:my-bucket/runs", "two slashes"),
        ("s3:/my-bucket/runs", "two slashes"),
        ("ftp://host/runs", "no object store"),
        ("s3://", "no bucket"),
        ("s3://My_Bucket/runs", "not valid"),
        ("gs:bucket", "two slashes"),
        ("s3://bkt/../etc", "'..' in the prefix"),
        ("s3://bkt/runs/..", "'..' in the prefix"),
        ("gs://bkt/./runs", "'.' in the prefix"),
    ],
)
def test_a_runs_dir_url_that_cannot_work_is_refused_with_the_fix(tmp_path, value, says):
    with pytest.raises(ConfigError, match="RUNS_DIR") as err:
        _settings(tmp_path, runs_dir=value)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "value",
    [
        "s3://AKIAEXAMPLE:hunter2secret@my-bucket/runs",
        "s3://token-hunter2secret@my-bucket/runs",
        "s3://my-bucket/runs?secret_access_key=hunter2secret",
        "s3://my-bucket/runs#hunter2secret",
    ],
)
def test_a_credential_in_the_runs_dir_url_is_refused(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, runs_dir=value)
    text = str(err.value)
    assert "credential" in text and "AWS_ACCESS_KEY_ID" in text


def test_a_store_cache_in_the_home_of_an_unknown_user_is_one_config_error(tmp_path):
    """STORE_CACHE=~nouser/cache: RuntimeError: Could not determine home directory, where the runs were staged."""
    with pytest.raises(ConfigError) as err:
        _settings(tmp_path, store_cache="~nouser-x/cache")
    assert str(err.value) == (
        "STORE_CACHE='~nouser-x/cache' is not valid: ~nouser-x is the home folder of a user named 'nouser-x', "
        "unknown here: write ~/nouser-x/cache for a folder in your own home, or a full path"
    )


def test_a_local_folder_with_a_colon_is_still_a_folder(tmp_path):
    s = _settings(tmp_path, runs_dir=str(tmp_path / "runs:old"))
    assert s.runs_dir.endswith("runs:old")


# -- the server does what the lease relies on ------------------------------------------------------
def test_the_server_honours_conditional_writes_with_a_stock_client(s3_server, s3_bucket):
    from minio.error import S3Error

    client = s3_server.client()

    def put(body: bytes, **headers: str):
        # The SDK signs the request; its put_object would turn these headers into user metadata.
        return client._execute("PUT", s3_bucket, "probe", body=body, headers=headers)

    first = put(b"1", **{"If-None-Match": "*"}).headers["ETag"]
    with pytest.raises(S3Error, match="PreconditionFailed"):
        put(b"2", **{"If-None-Match": "*"})
    with pytest.raises(S3Error, match="PreconditionFailed"):
        put(b"3", **{"If-Match": '"0000"'})
    put(b"4", **{"If-Match": first})
    assert s3_server.keys(s3_bucket)["probe"] == b"4"
    # The server's log is in its own folder only (weed.log), none in the system's temp folder.
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"weed.*.{s3_server.proc.pid}"))


# -- one line for each way the store can fail at start ---------------------------------------------
def test_wrong_credentials_are_one_line_naming_the_variables_never_the_secret(s3_server, s3_bucket, monkeypatch):
    store = _store(s3_server, s3_bucket, monkeypatch, AWS_SECRET_ACCESS_KEY="wrong-secret-value")
    with pytest.raises(StorageError) as err:
        store.check()
    text = str(err.value)
    assert "refused the credentials" in text and "AWS_SECRET_ACCESS_KEY" in text and "\n" not in text
    assert "wrong-secret-value" not in text


def test_a_missing_bucket_is_one_line_naming_it(s3_server, monkeypatch):
    store = _store(s3_server, "no-such-bucket-here", monkeypatch)
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist") as err:
        store.check()
    assert "\n" not in str(err.value)


def test_a_staging_folder_that_cannot_be_written_names_store_cache_not_runs_dir(
    s3_server, s3_bucket, monkeypatch, tmp_path
):
    import errno
    import pathlib

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where STORE_CACHE's folder goes")
    settings = _settings(tmp_path, runs_dir=f"s3://{s3_bucket}/runs", store_cache=str(blocked / "cache"))
    with pytest.raises(StorageError) as err:
        remote.open_runs_dir(settings)
    assert "STORE_CACHE" in str(err.value) and "RUNS_DIR at" not in str(err.value), err.value

    # A full disk, as root meets it (a read-only mode does not stop root): the fix is STORE_CACHE's.
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_bytes", full)
    with pytest.raises(StorageError) as err:
        remote.open_runs_dir(_settings(tmp_path, runs_dir=f"s3://{s3_bucket}/runs"))
    assert "point STORE_CACHE at a larger volume" in str(err.value) and "RUNS_DIR" not in str(err.value), err.value


def test_the_staging_copy_names_the_stores_address_and_runs_of_it_an_older_version_staged_are_said(
    s3_server, s3_bucket, monkeypatch, tmp_path, caplog
):
    """Two S3-compatible servers with a bucket of one name are two stores: one staging copy would list,
    resume or upload a run of one as the other's. An earlier version staged both in STORE_CACHE/s3/<bucket>."""
    import io

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    # The address as a user may type it: one store, one folder (an upper-case HTTP:// is plain HTTP too).
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint.upper() + "/")
    older = tmp_path / "cache" / "s3" / s3_bucket / "runs"
    for run in ("20261201-000000-000001-ours", "20261201-000000-000002-other"):
        (older / run).mkdir(parents=True)
        (older / run / "config.json").write_text("{}")
    s3_server.client().put_object(s3_bucket, "runs/20261201-000000-000001-ours/config.json", io.BytesIO(b"{}"), 2)
    opened = remote.open_runs_dir(_settings(tmp_path, runs_dir=f"s3://{s3_bucket}/runs"))
    assert opened.root == s3_server.staging(tmp_path / "cache", s3_bucket)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"WARNING: run(s) 20261201-000000-000001-ours of s3://{s3_bucket}/runs are staged in {older}, as an earlier "
        "version staged every s3:// store: move each folder, with .store-state/<run>.json beside it, into "
        f"{opened.root}, in place of the copy of it there (what this version downloaded: remove it first, unless "
        "the run trained there since); there a command that writes into the run uploads what the store lacks"
    ]


def test_an_endpoint_with_its_schemes_own_port_is_staged_as_one_without_it(monkeypatch, tmp_path):
    monkeypatch.setattr(Store, "check", lambda self: None)  # no server on port 80 or 443 here
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    roots = set()
    for endpoint in ("http://s3.local:80", "HTTP://S3.local/", "https://s3.local:443", "https://s3.local"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        roots.add(remote_store.open_store(_settings(tmp_path, runs_dir="s3://bkt/runs")).root)
    assert roots == {tmp_path / "cache" / "s3@s3.local" / "bkt" / "runs"}


def test_a_store_that_does_not_answer_is_one_line(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(StorageError, match="does not answer") as err:
        Store(parse_url("s3://some-bucket/runs")).check()
    assert "\n" not in str(err.value) and "check AWS_ENDPOINT_URL and the network" in str(err.value)
    # An Azure or Google store is not pointed at with the AWS variables.
    for url in ("az://container/runs", "gs://some-bucket/runs"):
        line = str(store_error(parse_url(url), "the run list", OSError("error sending request")))
        assert "does not answer" in line and "AWS" not in line, line


@pytest.mark.parametrize(
    "name, value",
    [
        ("AWS_ENDPOINT_URL", "127.0.0.1:9000"),  # no scheme: a Rust panic and 99 lines before
        ("AWS_ENDPOINT_URL", ""),
        ("AWS_ENDPOINT_URL", "ftp://127.0.0.1:9000"),
        ("AWS_ENDPOINT_URL", "http://"),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:port"),
        ("AWS_ENDPOINT_URL", "http://KEY:hunter2secret@127.0.0.1:9000"),
        ("AWS_ENDPOINT", "localhost:9000"),
    ],
)
def test_an_endpoint_that_is_no_http_address_is_one_config_error_before_the_client_is_made(monkeypatch, name, value):
    import obstore.store

    made = []
    monkeypatch.setattr(obstore.store, "S3Store", lambda *a, **k: made.append(a))
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(ConfigError) as err:
        Store(parse_url("s3://some-bucket/runs"))
    text = str(err.value)
    assert text.startswith(f"{name}=") and "http(s)://HOST[:PORT]" in text and "\n" not in text
    assert "hunter2secret" not in text and made == []


# -- the lease -----------------------------------------------------------------------------------
def test_a_second_writer_is_refused_with_one_line_naming_the_holder(s3_server, s3_bucket, monkeypatch):
    store = _store(s3_server, s3_bucket, monkeypatch)
    monkeypatch.setattr(lease, "RENEWALS", 150)  # renewed every 0.1 s, not 5 s: the refusal comes sooner
    holder = Lease(store, "run-a/run.lock", "run-a", seconds=15).acquire()
    try:
        other = Lease(store, "run-a/run.lock", "run-a", seconds=15, then="export again")
        other.holder_text = "pid 2 on host elsewhere"
        with pytest.raises(RunBusyError) as err:
            other.acquire()  # refused at the holder's next renewal
        assert holder.holder_text in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).endswith("then export again")  # what the refused command was doing
    finally:
        holder.release()
    assert "runs/run-a/run.lock" not in s3_server.keys(s3_bucket)  # released: the object is gone


def test_a_newcomer_that_waits_for_a_missed_renewal_says_why_it_waits(s3_server, s3_bucket, monkeypatch, caplog):
    """`report` on a run whose machine was just lost waited the lease's seconds (60) without a word."""
    store = _store(s3_server, s3_bucket, monkeypatch)
    holder = "pid 7 on host lost"
    # Renewed every 0.8 s while it lived, last 1.5 s ago: missed, and 1 s left for the newcomer's first look
    # (on a loaded machine), which must come before the lease runs out to say that it waits.
    body = {"holder": holder, "renewed": time.time() - 1.5, "seconds": 2.5}
    store.create("run-w/run.lock", json.dumps(body).encode())
    with caplog.at_level(logging.INFO, logger="train"):
        newcomer = Lease(store, "run-w/run.lock", "run-w", seconds=2.5).acquire()  # takes it over at 2.5 s
    try:
        waiting, took = (r.getMessage() for r in caplog.records)
        assert re.fullmatch(
            rf"WARNING: run run-w: its lease is held by {holder}, last renewed \d s ago: waiting up to 2 s "
            r"\(STORE_LEASE_SECONDS\) for that process to renew it \(it lives\) or not \(it is gone\)",
            waiting,
        )
        assert took.startswith(f"run run-w: took over the lease of {holder} (not renewed for ")
    finally:
        newcomer.release()


def test_a_dead_holders_lease_expires_and_is_taken_over(s3_server, s3_bucket, monkeypatch, caplog):
    store = _store(s3_server, s3_bucket, monkeypatch)
    dead = Lease(store, "run-b/run.lock", "run-b", seconds=0.5).acquire()
    dead._stop.set()  # the holder dies: nothing renews its lease any more, nothing deletes it
    dead._thread.join()
    newcomer = Lease(store, "run-b/run.lock", "run-b", seconds=0.5)
    with caplog.at_level(logging.INFO, logger="train"):
        newcomer.acquire()  # waits at most the lease's 0.5 s
    try:
        assert "took over the lease" in caplog.text
        assert b"pid" in s3_server.keys(s3_bucket)["runs/run-b/run.lock"]
        # The dead holder, were it to wake up, can no longer renew: its ETag is not the object's.
        with pytest.raises(Conflict):
            store.replace("run-b/run.lock", b"x", dead.etag)
    finally:
        newcomer.release()


def test_a_takeover_remembers_when_the_dead_holder_last_renewed_its_lease(s3_server, s3_bucket, monkeypatch, caplog):
    import json
    import time

    store = _store(s3_server, s3_bucket, monkeypatch)
    dead = Lease(store, "run-d/run.lock", "run-d", seconds=0.5).acquire()
    dead._stop.set()  # killed: its last renewal is the last sign of its life
    dead._thread.join()
    dead_body = s3_server.keys(s3_bucket)["runs/run-d/run.lock"]
    last_renewed = json.loads(dead_body)["renewed"]
    # A command that only reads the run (report, export, RESUME=auto's look) puts the dead holder's lease
    # back when it lets go: the run still reads as killed, and the resume after it learns the same.
    with caplog.at_level(logging.INFO, logger="train"):
        Lease(store, "run-d/run.lock", "run-d", seconds=0.5, reader=True).acquire().release()
    assert s3_server.keys(s3_bucket)["runs/run-d/run.lock"] == dead_body
    assert "took over" not in caplog.text  # said once, by the resume that continues the run (RESUME=auto: twice)
    newcomer = Lease(store, "run-d/run.lock", "run-d", seconds=0.5).acquire()
    try:
        assert newcomer.taken_from == last_renewed
    finally:
        newcomer.release()
    free = Lease(store, "run-e/run.lock", "run-e", seconds=0.5).acquire()
    try:
        assert free.taken_from is None  # a free run: nobody's
    finally:
        free.release()

    # A reader puts the dead holder's lease back while a newcomer elsewhere watches it: no renewal, taken over.
    class PutBackOnFirstLook(Store):
        looked = False

        def get(self, rel):
            found = super().get(rel)
            if not self.looked:
                self.looked = True
                self.put(rel, dead_body)  # the reader lets go just after the newcomer's first look
            return found

    watched = PutBackOnFirstLook(store.url)
    watched.create("run-f/run.lock", json.dumps({"holder": "a reader", "renewed": time.time(), "seconds": 60}).encode())
    newcomer = Lease(watched, "run-f/run.lock", "run-f", seconds=0.5).acquire()
    try:
        assert newcomer.taken_from == last_renewed
    finally:
        newcomer.release()


def test_two_newcomers_racing_for_a_free_run_get_one_lease(s3_server, s3_bucket, monkeypatch):
    store = _store(s3_server, s3_bucket, monkeypatch)
    monkeypatch.setattr(lease, "RENEWALS", 150)  # the loser is refused at the winner's first renewal: 0.1 s, not 5
    results, barrier = [], threading.Barrier(2)

    def take(n):
        lease = Lease(store, "run-c/run.lock", "run-c", seconds=15)
        lease.holder_text = f"contender {n}"
        barrier.wait()
        try:
            results.append(lease.acquire())
        except RunBusyError as exc:
            results.append(exc)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    won = [r for r in results if isinstance(r, Lease)]
    assert len(won) == 1 and len(results) == 2, results
    won[0].release()


# -- the uploads ---------------------------------------------------------------------------------
class Recording(Store):
    """The real store, also noting the order of its writes."""

    def __init__(self, url):
        super().__init__(url)
        self.order: list[str] = []

    def put(self, rel, data):
        etag = super().put(rel, data)
        self.order.append(rel)
        return etag


def test_pointers_reach_the_store_only_after_what_they_point_to(s3_server, s3_bucket, monkeypatch, tmp_path):
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    store = Recording(parse_url(f"s3://{s3_bucket}/runs"))
    run = tmp_path / "20261201-000000-000001"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "metrics.csv").write_text("epoch\n1\n")
    (run / "checkpoints" / "ckpt-000000004.npz").write_bytes(b"state 4")
    (run / "checkpoints" / "LATEST").write_text("ckpt-000000004.npz\n")
    (run / "manifest.json").write_text('{"status": "running"}')
    mirror = Mirror(store, tmp_path, run)
    try:
        assert mirror.sync_once()
        names = [rel.split("/", 1)[1] for rel in store.order]
        assert names[0] == "config.json"
        assert names.index("checkpoints/LATEST") > names.index("checkpoints/ckpt-000000004.npz")
        assert names[-2:] == ["checkpoints/LATEST", "manifest.json"] or names[-1] == "manifest.json"
        # The next state, the old one removed: the new object first, the pointer, then the deletion.
        (run / "checkpoints" / "ckpt-000000008.npz").write_bytes(b"state 8")
        (run / "checkpoints" / "LATEST").write_text("ckpt-000000008.npz\n")
        (run / "checkpoints" / "ckpt-000000004.npz").unlink()
        store.order.clear()
        assert mirror.sync_once()
        assert [rel.split("/", 1)[1] for rel in store.order] == ["checkpoints/ckpt-000000008.npz", "checkpoints/LATEST"]
        keys = s3_server.keys(s3_bucket, "runs/")
        assert f"runs/{run.name}/checkpoints/ckpt-000000004.npz" not in keys
        assert keys[f"runs/{run.name}/checkpoints/LATEST"] == b"ckpt-000000008.npz\n"
        # Unchanged files are not sent again.
        store.order.clear()
        assert mirror.sync_once() and store.order == []
    finally:
        mirror.stop_watching()


def test_a_checkpoint_deleted_during_a_pass_stays_in_the_store_while_the_uploaded_pointer_names_it(
    s3_server, s3_bucket, monkeypatch, tmp_path
):
    """KEEP_CHECKPOINTS=1: while a pass uploads the state LATEST named when the pass began, the run
    saves the next state, moves LATEST and deletes the first. The pass uploads LATEST as it read it:
    deleting the first state's object too would leave the store without any state to resume from."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    run = tmp_path / "20261201-000000-000005"
    ckpts = run / "checkpoints"

    class RunMovesOn(Store):
        def put(self, rel, data):
            etag = super().put(rel, data)
            if rel.endswith("ckpt-000000004.npz") and not (ckpts / "ckpt-000000008.npz").exists():
                (ckpts / "ckpt-000000008.npz").write_bytes(b"state 8")
                (ckpts / "LATEST").write_text("ckpt-000000008.npz\n")
                (ckpts / "ckpt-000000004.npz").unlink()
            return etag

    ckpts.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (ckpts / "ckpt-000000004.npz").write_bytes(b"state 4")
    (ckpts / "LATEST").write_text("ckpt-000000004.npz\n")
    mirror = Mirror(RunMovesOn(parse_url(f"s3://{s3_bucket}/runs")), tmp_path, run)
    prefix = f"runs/{run.name}/checkpoints/"
    try:
        assert mirror.sync_once()
        keys = s3_server.keys(s3_bucket, prefix)
        assert keys[prefix + "LATEST"] == b"ckpt-000000004.npz\n"
        assert keys.get(prefix + "ckpt-000000004.npz") == b"state 4", sorted(keys)
        assert mirror.sync_once()  # the next pass: the new state, its pointer, then the old one's deletion
        assert s3_server.keys(s3_bucket, prefix) == {
            prefix + "LATEST": b"ckpt-000000008.npz\n",
            prefix + "ckpt-000000008.npz": b"state 8",
        }
    finally:
        mirror.stop_watching()


def test_a_run_deleted_from_the_bucket_by_hand_is_uploaded_whole_again(s3_server, s3_bucket, monkeypatch, tmp_path):
    """The staging copy's state says every file was uploaded: a later command's mirror (an export, a
    resume on this machine) must not trust it for a run the store no longer has."""
    from minio.deleteobjects import DeleteObject

    store = _store(s3_server, s3_bucket, monkeypatch)
    run = tmp_path / "20261201-000000-000004"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "best.weights.h5").write_bytes(b"weights")
    (run / "checkpoints" / "ckpt-000000004.npz").write_bytes(b"state 4")
    (run / "checkpoints" / "LATEST").write_text("ckpt-000000004.npz\n")
    (run / "manifest.json").write_text('{"status": "completed"}')
    first = Mirror(store, tmp_path, run)
    try:
        assert first.sync_once()
    finally:
        first.stop_watching()
    uploaded = set(s3_server.names(s3_bucket, f"runs/{run.name}/"))
    client = s3_server.client()

    def sync_again():
        mirror = Mirror(store, tmp_path, run)
        try:
            assert mirror.sync_once()
        finally:
            mirror.stop_watching()

    # An old checkpoint deleted by another machine that continued the run stays deleted.
    old = f"runs/{run.name}/checkpoints/ckpt-000000004.npz"
    client.remove_object(s3_bucket, old)
    sync_again()
    assert set(s3_server.names(s3_bucket, f"runs/{run.name}/")) == uploaded - {old}
    # The whole run deleted: all of it comes back, not only what `export` changed.
    assert not list(client.remove_objects(s3_bucket, [DeleteObject(name) for name in uploaded - {old}]))
    (run / "manifest.json").write_text('{"status": "completed", "export": {}}')
    sync_again()
    assert set(s3_server.names(s3_bucket, f"runs/{run.name}/")) == uploaded


def test_a_pull_keeps_a_file_changed_here_and_brings_a_file_changed_in_the_store(
    s3_server, s3_bucket, monkeypatch, tmp_path, caplog
):
    """A resume on the machine that trained the run: its train.log grew while the store was down (not
    uploaded yet), and another machine replaced metrics.csv in the store meanwhile. A file written here
    while the store was down whose state was lost since is kept: nothing says it was uploaded."""
    import io
    import shutil

    from train.store.mirror import pull, state_path

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    store = Recording(parse_url(f"s3://{s3_bucket}/runs"))
    run, client = "20261201-000000-000006", s3_server.client()

    def put(rel: str, data: bytes) -> None:
        client.put_object(s3_bucket, f"runs/{run}/{rel}", io.BytesIO(data), len(data))

    for rel, data in (("config.json", b"{}"), ("metrics.csv", b"epoch\n1\n"), ("train.log", b"one\n")):
        put(rel, data)
    assert pull(store, tmp_path, run) == 3
    assert pull(store, tmp_path, run) == 0
    state_path(tmp_path, run).unlink()  # a staging copy made by hand: the same bytes are not brought again
    assert pull(store, tmp_path, run) == 0
    mirror = Mirror(store, tmp_path, tmp_path / run)  # what the pull brought is known to be in the store
    try:
        assert mirror.sync_once() and store.order == []
    finally:
        mirror.stop_watching()
    (tmp_path / run / "metrics.csv").write_bytes(b"epoch\n1\nnot uploaded\n")
    state_path(tmp_path, run).unlink()
    with caplog.at_level(logging.WARNING, logger="train"):
        assert pull(store, tmp_path, run) == 0
    assert (tmp_path / run / "metrics.csv").read_bytes() == b"epoch\n1\nnot uploaded\n"
    assert re.search(rf"run {run}: file\(s\) metrics.csv of the staging copy .* kept, not downloaded; ", caplog.text)
    mirror = Mirror(store, tmp_path, tmp_path / run)  # the next upload puts it in the store
    try:
        assert mirror.sync_once() and store.order == [f"{run}/metrics.csv"]
    finally:
        mirror.stop_watching()
    with open(tmp_path / run / "train.log", "ab") as log:
        log.write(b"two\n")
    put("metrics.csv", b"epoch\n1\n2\n")
    assert pull(store, tmp_path, run) == 1
    assert (tmp_path / run / "train.log").read_bytes() == b"one\ntwo\n"
    assert (tmp_path / run / "metrics.csv").read_bytes() == b"epoch\n1\n2\n"
    put("checkpoints/ckpt-000000001.npz", b"state 1")
    pull(store, tmp_path, run)
    # The next state saved and this one deleted while the store was down: a resume's pull does not bring it
    # back (the upload deletes it there); with no newer state here (the folder deleted by hand) it does.
    old = tmp_path / run / "checkpoints" / "ckpt-000000001.npz"
    (tmp_path / run / "checkpoints" / "ckpt-000000002.npz").write_bytes(b"state 2")
    old.unlink()
    assert pull(store, tmp_path, run) == 0 and not old.exists()
    shutil.rmtree(tmp_path / run)
    assert pull(store, tmp_path, run) == 4 and old.read_bytes() == b"state 1"
    # The run's folder deleted here by hand (its state beside it kept), then a report: its pull leaves the
    # checkpoints in the store, and its upload deletes none of them there.
    shutil.rmtree(tmp_path / run)
    pull(store, tmp_path, run, lambda rel: not rel.startswith("checkpoints/"))
    mirror = Mirror(store, tmp_path, tmp_path / run)
    try:
        assert mirror.sync_once()
    finally:
        mirror.stop_watching()
    assert f"runs/{run}/checkpoints/ckpt-000000001.npz" in s3_server.names(s3_bucket, f"runs/{run}/")


def test_a_store_whose_client_cannot_be_set_up_is_one_storage_error(monkeypatch):
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageError, match=r"RUNS_DIR az://container/runs: the store's client cannot be set up") as err:
        Store(parse_url("az://container/runs"))
    assert "\n" not in str(err.value)


def test_a_holder_whose_lease_was_taken_over_uploads_nothing_more(s3_server, s3_bucket, monkeypatch, tmp_path):
    store = _store(s3_server, s3_bucket, monkeypatch)
    run = tmp_path / "20261201-000000-000003"
    run.mkdir()
    (run / "config.json").write_text("{}")
    holder = Lease(store, f"{run.name}/run.lock", run.name, seconds=0.5).acquire()
    holder._stop.set()  # cut off from the store: no renewal for longer than the lease
    holder._thread.join()
    newcomer = Lease(store, f"{run.name}/run.lock", run.name, seconds=0.5).acquire()
    try:
        assert holder.renew_once() is False and "taken over" in holder.lost
        mirror = Mirror(store, tmp_path, run, holder)
        try:
            assert mirror.sync_once() is False
        finally:
            mirror.stop_watching()
        assert f"runs/{run.name}/config.json" not in s3_server.names(s3_bucket)
        assert mirror.close(seconds=30) != []  # the run's end says so: exit 7
    finally:
        newcomer.release()


def test_a_lease_gone_from_a_store_that_answers_404_to_if_match_is_lost_not_renewed(
    s3_server, s3_bucket, monkeypatch, tmp_path
):
    """Taken over and released by another process: SeaweedFS answers the renewal's If-Match with 412,
    Amazon S3 with 404 (no such object), which read as a store that is down kept the uploads going."""

    class Answers404(Store):  # the real server, with Amazon's answer to If-Match on a missing object
        def replace(self, rel, data, etag):
            self.get(rel)  # FileNotFoundError when the object is gone
            return super().replace(rel, data, etag)

    store = _store(s3_server, s3_bucket, monkeypatch)
    store.__class__ = Answers404
    run = "20261201-000000-000006"
    holder = Lease(store, f"{run}/run.lock", run, seconds=60).acquire()
    holder._stop.set()
    holder._thread.join()
    store.delete(f"{run}/run.lock")  # what the other process's release leaves
    assert holder.renew_once() is False
    assert (
        holder.lost
        == f"the lease {store.url.key(run + '/run.lock')} is gone from the store: another process took the run over and ended, or it was deleted"
    )
    assert f"runs/{run}/run.lock" not in s3_server.names(s3_bucket)  # not created again


def test_a_stop_asked_for_while_the_last_files_wait_for_the_store_cuts_the_wait(monkeypatch, tmp_path):
    """SIGTERM during the end's flush to a store that does not answer: the wait ends `stop_seconds`
    after it, not after the whole STORE_FLUSH_SECONDS (compose's stop grace period would run out)."""
    import time
    from types import SimpleNamespace

    from train.training.stop_flag import StopFlag

    monkeypatch.setenv("AWS_ENDPOINT_URL", dead_endpoint())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    run = tmp_path / "20261201-000000-000009"
    run.mkdir()
    (run / "config.json").write_text("{}")
    url = parse_url("s3://some-bucket/runs")
    uploads = Uploads(RemoteRuns(url, Store(url), tmp_path, lease_seconds=60, flush_seconds=120))
    uploads.on_start(run)
    mirror, stop = uploads.mirror, StopFlag()
    monkeypatch.setattr(remote_store, "STOP_FLUSH_SECONDS", 0.3)
    signal_later = threading.Timer(0.5, stop.request, args=("received SIGTERM",))
    signal_later.start()
    started = time.monotonic()
    try:
        with pytest.raises(StorageError, match="config.json only in the staging copy"):
            uploads.on_close(stop, None)
        assert time.monotonic() - started < 20
    finally:
        signal_later.cancel()
        mirror.lease = SimpleNamespace(lost="the test is over")  # its thread stops trying


def test_the_line_of_files_not_uploaded_says_why_names_three_and_counts_the_rest(tmp_path):
    """The exit-7 line of a run whose last files stayed in the staging copy: the store's error, or the
    lost lease when there is one; three files named, the others counted; the command that uploads them."""
    from types import SimpleNamespace

    url = parse_url("s3://bucket/runs")
    runs = RemoteRuns(url, None, tmp_path, lease_seconds=60, flush_seconds=120)
    run = tmp_path / "20261201-000000-000007"
    down = StorageError("the store does not answer")
    held, lost = SimpleNamespace(lost=None), SimpleNamespace(lost="the lease was taken over")

    def line(files, lease, error=down):
        return runs.not_uploaded(run, files, SimpleNamespace(lease=lease, last_error=error))

    fix = (
        f"only in the staging copy {run}; once the store answers, `--resume {run.name}` (resume='{run.name}' in "
        "train()) on this machine (same STORE_CACHE) uploads them"
    )
    start = f"run {run.name}: the newest state did not reach s3://bucket/runs"
    assert line(["a", "b", "c", "d", "e"], None) == f"{start} (the store does not answer): a, b, c and 2 more {fix}"
    assert line(["a", "b", "c", "d"], held) == f"{start} (the store does not answer): a, b, c and 1 more {fix}"
    assert line(["a", "b", "c"], lost) == f"{start} (the lease was taken over): a, b, c {fix}"
    slow = "not within the wait for the last files: STORE_FLUSH_SECONDS=120 s, 30 s at most after a stop"
    assert line(["a"], held, error=None) == f"{start} ({slow}): a {fix}"  # the store answered, only not in time
