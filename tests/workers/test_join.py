"""join: every worker waits for the others in Python, before TensorFlow is imported.

In-process (threads play the other workers) and `python -m train fit` subprocesses whose other
worker never starts: both end before TensorFlow loads, so these are fast. Waits are for a line in
the output; the timeouts only guard against a hang.
"""

from __future__ import annotations

import logging
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults import env
from helpers import free_local_ports, ipv6_loopback

from train.errors import ConfigError, Interrupted
from train.training.stop_flag import StopFlag
from train.workers import PortInUseError, join
from train.workers.cluster import from_workers
from train.workers.join import WorkersMissingError

HANG_GUARD = 120  # seconds: only reached when something hangs


@pytest.fixture(autouse=True)
def _quick_rounds(monkeypatch):
    """A round every 0.05 s, not 0.5 s: a wait ends that soon after its timeout, a stop or a worker's start."""
    monkeypatch.setattr(join, "POLL_SECONDS", 0.05)


@pytest.fixture
def train_log(caplog):
    """The train logger's lines (it does not propagate once a run has set up its logging)."""
    logger = logging.getLogger("train")
    level = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


def _cluster(ports, index):
    return from_workers(",".join(f"127.0.0.1:{p}" for p in ports), index)


def _in_thread(fn, *args):
    box = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def test_three_workers_started_one_after_the_other_all_join(monkeypatch):
    # The end of the join wakes its listener: an accept left to its own timeout would outlast HANG_GUARD.
    monkeypatch.setattr(join, "ACCEPT_SECONDS", 30 * HANG_GUARD)
    before = set(threading.enumerate())
    ports = free_local_ports(3)
    runs = []
    for i in range(3):
        runs.append(_in_thread(join.wait_for_workers, _cluster(ports, i), 0, StopFlag(), "WORKERS"))
    for t, box in runs:
        t.join(HANG_GUARD)
        assert not t.is_alive() and "error" not in box, box
    listeners = [t for t in threading.enumerate() if t.name == "join-listener" and t not in before]
    for t in listeners:  # one may still end a worker's call it was answering (a loaded machine): waited for
        t.join(HANG_GUARD)
    assert [t for t in listeners if t.is_alive()] == []
    # Each port is free again for TensorFlow.
    for p in ports:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::", p))


def test_a_missing_worker_is_given_up_after_join_timeout_naming_it(train_log):
    ports = free_local_ports(3)
    with pytest.raises(WorkersMissingError) as info:
        join.wait_for_workers(_cluster(ports, 0), 0.3, StopFlag(), "WORKERS")
    assert str(info.value) == (
        f"worker 1 (127.0.0.1:{ports[1]}), worker 2 (127.0.0.1:{ports[2]}) did not start within JOIN_TIMEOUT=0.3 s: "
        "start them with the same WORKERS, check the host:port and that it is reachable from here, or raise "
        "JOIN_TIMEOUT"
    )
    assert info.value.exit_code == 11
    assert f"waiting for worker 1 (127.0.0.1:{ports[1]}), worker 2" in train_log.text


def test_the_missing_workers_are_logged_once_until_join_report_seconds_have_passed(train_log):
    ports = free_local_ports(2)
    with pytest.raises(WorkersMissingError):  # rounds every POLL_SECONDS: more than one before it gives up
        join.wait_for_workers(_cluster(ports, 0), 3 * join.POLL_SECONDS, StopFlag(), "WORKERS")
    logged = {id(r) for r in train_log.records if r.getMessage().startswith("waiting for worker 1")}  # each once
    assert len(logged) == 1, train_log.messages


def test_a_stop_request_ends_the_wait_with_interrupted_naming_who_is_missing():
    ports = free_local_ports(2)
    stop = StopFlag()
    stop.request("received SIGTERM")
    with pytest.raises(Interrupted) as info:
        join.wait_for_workers(_cluster(ports, 1), 0, stop, "WORKERS")
    assert info.value.exit_code == 75
    assert str(info.value) == (
        f"received SIGTERM while waiting for worker 0 (127.0.0.1:{ports[0]}): nothing was trained, so nothing "
        "is lost; start every worker again"
    )


@pytest.mark.parametrize("where", ["127.0.0.1", "0.0.0.0"])
def test_this_workers_port_in_use_is_one_error_naming_the_port(where):
    ports = free_local_ports(2)
    with socket.socket() as other:
        other.bind((where, ports[1]))
        other.listen()
        with pytest.raises(PortInUseError) as info:
            join.wait_for_workers(_cluster(ports, 1), 0, StopFlag(), "WORKERS")
    assert info.value.exit_code == 2
    assert f"127.0.0.1:{ports[1]}: port {ports[1]} is in use by another process" in str(info.value)


def test_another_program_on_a_workers_port_is_not_taken_for_the_worker(monkeypatch):
    monkeypatch.setattr(join, "LINE_SECONDS", 0.2)  # the rounds after its one answer wait for a line: not 3 s
    ports = free_local_ports(2)
    with socket.socket() as other:
        other.bind(("127.0.0.1", ports[1]))
        other.listen()

        def answer():
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(WorkersMissingError) as info:
            join.wait_for_workers(_cluster(ports, 0), 0.3, StopFlag(), "WORKERS")
    # In the timeout's line, whatever the load: the wait's own line comes only when a round ends before it.
    assert f"within JOIN_TIMEOUT=0.3 s (another program answers at worker 1 (127.0.0.1:{ports[1]}))" in str(info.value)


def test_a_silent_program_on_a_workers_port_is_named_too(monkeypatch):
    """An HTTP server waits for the client to speak; a worker and TensorFlow's server speak first."""
    monkeypatch.setattr(join, "LINE_SECONDS", 0.2)
    ports = free_local_ports(2)
    with socket.socket() as other:
        other.bind(("127.0.0.1", ports[1]))
        other.listen()
        with pytest.raises(WorkersMissingError) as info:
            join.wait_for_workers(_cluster(ports, 0), 0.5, StopFlag(), "WORKERS")
    # In the timeout's line, whatever the load: the wait's own line comes only when a round ends before it.
    assert f"within JOIN_TIMEOUT=0.5 s (another program answers at worker 1 (127.0.0.1:{ports[1]}))" in str(info.value)


def test_a_host_name_that_does_not_resolve_is_said_while_waiting_and_at_the_timeout(train_log):
    """A typo in WORKERS is not a late worker: both lines name the host that does not resolve."""
    (port,) = free_local_ports(1)
    cluster = from_workers(f"127.0.0.1:{port},no-such-worker.invalid:2222", 0)
    with pytest.raises(WorkersMissingError) as info:
        join.wait_for_workers(cluster, 0.3, StopFlag(), "WORKERS")
    assert str(info.value) == (
        "worker 1 (no-such-worker.invalid:2222) did not start within JOIN_TIMEOUT=0.3 s (no-such-worker.invalid "
        "does not resolve here (yet): check WORKERS): start it with the same WORKERS, check the host:port and "
        "that it is reachable from here, or raise JOIN_TIMEOUT"
    )
    assert "; no-such-worker.invalid does not resolve here (yet): check WORKERS" in train_log.text


# The first bytes TensorFlow's gRPC server sends on a new connection (an HTTP/2 SETTINGS frame).
GRPC_HELLO = bytes.fromhex(
    "000018040000000000000400400000000500400000000600004000fe0300000001000004080000000000003f0001"
)


def _answers_once(server: socket.socket, line: bytes, read: int) -> None:
    """A stand-in peer on `server`: answers the first connection with `line`, then reads the reply."""

    def answer():
        conn, _ = server.accept()
        with conn:
            conn.sendall(line)
            conn.recv(read)

    threading.Thread(target=answer, daemon=True).start()


def test_a_worker_already_in_tensorflows_join_counts_as_started(train_log):
    # It met this worker's earlier self, which was restarted since: joining it is how the pair recovers.
    ports = free_local_ports(2)
    with socket.socket() as tensorflow:
        tensorflow.bind(("127.0.0.1", ports[0]))
        tensorflow.listen()
        _answers_once(tensorflow, GRPC_HELLO, 1)
        join.wait_for_workers(_cluster(ports, 1), HANG_GUARD, StopFlag(), "WORKERS")
    assert "joined: every worker of 2 has started" in train_log.messages


def test_a_worker_started_with_another_cluster_is_refused():
    p0, p1, p2 = free_local_ports(3)
    theirs = _cluster([p0, p2], 0)  # listens on p0, but its cluster is another list
    stop_theirs = StopFlag()
    t, _ = _in_thread(join.wait_for_workers, theirs, 0, stop_theirs, "WORKERS")
    try:
        with pytest.raises(ConfigError) as info:
            join.wait_for_workers(_cluster([p0, p1], 1), HANG_GUARD, StopFlag(), "WORKERS")
    finally:
        stop_theirs.request("test over")
        t.join(HANG_GUARD)
    assert info.value.name == "WORKERS" and info.value.value == f"127.0.0.1:{p0}"
    assert f"started with another cluster (127.0.0.1:{p0} is its worker 0)" in str(info.value)


def test_workers_started_with_other_settings_both_stop_naming_them():
    ports = free_local_ports(2)
    chiefs = {"learning_rate": 0.007, "model": "cnn", "seed": 42}
    theirs = {"learning_rate": 0.01, "model": "cnn", "seed": 7}
    t, box = _in_thread(join.wait_for_workers, _cluster(ports, 0), HANG_GUARD, StopFlag(), "WORKERS", chiefs)
    with pytest.raises(ConfigError) as info:
        join.wait_for_workers(_cluster(ports, 1), HANG_GUARD, StopFlag(), "WORKERS", theirs)
    t.join(HANG_GUARD)
    assert not t.is_alive() and isinstance(box.get("error"), ConfigError), box  # the chief does not wait on
    for error, value, other in ((info.value, 0.01, 0), (box["error"], 0.007, 1)):
        assert error.name == "LEARNING_RATE" and error.value == value
        assert str(error).endswith(
            f"worker {other} (127.0.0.1:{ports[other]}) was started with another LEARNING_RATE, SEED: give every "
            "worker the same settings (only WORKER_INDEX and where its files are, e.g. RUNS_DIR and DATA_DIR, may "
            "differ; BATCH_SIZE and PRECISION are the chief's)"
        ), str(error)


def test_workers_of_other_commits_both_stop_naming_them():
    """Same settings, other code (a host left at an older checkout): the join let them train together."""
    ports = free_local_ports(2)
    ours, theirs = "a" * 40, "b" * 40
    args = (HANG_GUARD, StopFlag(), "WORKERS", {"seed": 7})
    t, box = _in_thread(join.wait_for_workers, _cluster(ports, 0), *args, ours)
    with pytest.raises(ConfigError) as info:
        join.wait_for_workers(_cluster(ports, 1), *args, theirs)
    t.join(HANG_GUARD)
    assert not t.is_alive() and isinstance(box.get("error"), ConfigError), box  # the chief does not wait on
    for error, other, commits in (
        (info.value, 0, "aaaaaaaaaaaa, this one bbbbbbbbbbbb"),
        (box["error"], 1, "bbbbbbbbbbbb, this one aaaaaaaaaaaa"),
    ):
        assert error.name == "WORKERS" and error.value == f"127.0.0.1:{ports[other]}"
        assert str(error).endswith(
            f"worker {other} there runs commit {commits}: the same settings can train another model or read the "
            "data otherwise; start every worker from the same commit (or image)"
        ), str(error)


@pytest.mark.parametrize(
    "commits",
    [("a" * 40, None), (None, "a" * 40), ("a" * 40, "a" * 40), ("built by hand", "built by hand"), ("a" * 40, "a" * 7)],
)
def test_workers_of_one_commit_or_where_one_does_not_know_its_own_join(commits):
    """An image built without GIT_COMMIT knows no commit: it is not refused beside a git checkout. A
    GIT_COMMIT of several words stays one word of the join's line; a short hash is its commit's."""
    ports = free_local_ports(2)
    runs = [
        _in_thread(join.wait_for_workers, _cluster(ports, i), HANG_GUARD, StopFlag(), "WORKERS", {}, commits[i])
        for i in range(2)
    ]
    for t, box in runs:
        t.join(HANG_GUARD)
        assert not t.is_alive() and "error" not in box, box


@pytest.mark.parametrize(
    "changes, told",
    [
        (("clean", "0123456789ab"), ("uncommitted changes 0123456789ab", "no uncommitted changes")),
        (("0123456789ab", "ba9876543210"), ("uncommitted changes ba9876543210", "uncommitted changes 0123456789ab")),
    ],
)
def test_workers_of_one_commit_with_other_uncommitted_changes_both_stop_naming_them(changes, told):
    """One commit, a model edited on one host and not committed: the join let them train together."""
    ports = free_local_ports(2)
    args = (HANG_GUARD, StopFlag(), "WORKERS", {"seed": 7}, "a" * 40)
    t, box = _in_thread(join.wait_for_workers, _cluster(ports, 0), *args, changes[0])
    with pytest.raises(ConfigError) as info:
        join.wait_for_workers(_cluster(ports, 1), *args, changes[1])
    t.join(HANG_GUARD)
    assert not t.is_alive() and isinstance(box.get("error"), ConfigError), box  # the chief does not wait on
    for error, other, (theirs, mine) in ((info.value, 0, told[::-1]), (box["error"], 1, told)):
        assert error.name == "WORKERS" and error.value == f"127.0.0.1:{ports[other]}"
        assert str(error).endswith(
            f"worker {other} there runs commit aaaaaaaaaaaa with {theirs}, this one with {mine}: the same settings "
            "can train another model or read the data otherwise; commit the changes and start every worker from "
            "that commit (or image)"
        ), str(error)


@pytest.mark.parametrize(
    "code",
    [
        (("a" * 40, "clean"), ("a" * 40, "clean")),
        (("a" * 40, "0123456789ab"), ("a" * 40, "0123456789ab")),
        (("a" * 40, "0123456789ab"), ("a" * 40, "?")),  # an image: its build context's changes unknown
        (("a" * 40, "0123456789ab"), (None, "clean")),
    ],
)
def test_workers_of_the_same_changes_or_where_one_does_not_know_them_join(code):
    ports = free_local_ports(2)
    runs = [
        _in_thread(join.wait_for_workers, _cluster(ports, i), HANG_GUARD, StopFlag(), "WORKERS", {}, *code[i])
        for i in range(2)
    ]
    for t, box in runs:
        t.join(HANG_GUARD)
        assert not t.is_alive() and "error" not in box, box


def test_a_worker_started_with_another_workers_index_is_refused_naming_worker_index():
    p0, p1 = free_local_ports(2)
    mine = _cluster([p0, p1], 0)
    # What a worker on another host answers at p1 when it was given WORKER_INDEX=0 as well.
    impostor = from_workers(f"127.0.0.1:{p0},127.0.0.1:{p1}", 0)
    with socket.create_server(("127.0.0.1", p1)) as server:

        def answer():
            conn, _ = server.accept()
            with conn:
                conn.sendall(join._line(impostor, join.settings_token({})))
                conn.recv(512)

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(ConfigError) as info:
            join.wait_for_workers(mine, HANG_GUARD, StopFlag(), "WORKERS")
    assert info.value.name == "WORKER_INDEX" and info.value.value == 0
    assert f"the worker at 127.0.0.1:{p1} says it is worker 0 (127.0.0.1:{p0}), not worker 1" in str(info.value)
    assert "give each worker its own WORKER_INDEX, its place in WORKERS" in str(info.value)


def test_a_worker_of_an_older_version_is_refused_as_such_not_waited_for():
    """Its line has no settings: it was taken for another program, and both waited out JOIN_TIMEOUT."""
    p0, p1 = free_local_ports(2)
    mine, theirs = _cluster([p0, p1], 0), _cluster([p0, p1], 1)
    older = f"{join.MAGIC} 1 {join.digest(theirs)} 127.0.0.1:{p1}\n".encode()
    with socket.create_server(("127.0.0.1", p1)) as server:
        _answers_once(server, older, 512)
        with pytest.raises(ConfigError) as info:
            join.wait_for_workers(mine, HANG_GUARD, StopFlag(), "WORKERS")
    assert info.value.name == "WORKERS" and info.value.value == f"127.0.0.1:{p1}"
    assert str(info.value).endswith(
        "worker 1 there runs an older version of this template, which does not compare the settings at the "
        "join: start every worker from the same version (commit or image)"
    ), str(info.value)


def test_a_worker_of_a_version_that_sends_no_commit_is_refused_as_such_not_joined():
    """Its line has the settings but no commit: it was taken as a worker whose commit is unknown, and
    the two trained together, one of them on code without the commit check (a host left behind)."""
    p0, p1 = free_local_ports(2)
    mine, theirs = _cluster([p0, p1], 0), _cluster([p0, p1], 1)
    older = f"{join.MAGIC} 1 {join.digest(theirs)} 127.0.0.1:{p1} {join.settings_token({})}\n".encode()
    with socket.create_server(("127.0.0.1", p1)) as server:
        _answers_once(server, older, 512)
        with pytest.raises(ConfigError) as info:
            join.wait_for_workers(mine, HANG_GUARD, StopFlag(), "WORKERS", {}, "a" * 40)
    assert info.value.name == "WORKERS" and info.value.value == f"127.0.0.1:{p1}"
    assert str(info.value).endswith(
        "worker 1 there runs an older version of this template, which does not compare the commits at the "
        "join: start every worker from the same version (commit or image)"
    ), str(info.value)


def test_a_worker_that_compares_other_settings_is_refused_as_another_version_on_both_ends():
    """A version that added a shared setting: listing every setting as different would mislead."""
    ports = free_local_ports(2)
    chiefs = {"learning_rate": 0.01, "seed": 7}
    theirs = {**chiefs, "new_setting": 1}
    t, box = _in_thread(join.wait_for_workers, _cluster(ports, 0), HANG_GUARD, StopFlag(), "WORKERS", chiefs)
    with pytest.raises(ConfigError) as info:
        join.wait_for_workers(_cluster(ports, 1), HANG_GUARD, StopFlag(), "WORKERS", theirs)
    t.join(HANG_GUARD)
    assert not t.is_alive() and isinstance(box.get("error"), ConfigError), box
    for error, other, counts in (
        (info.value, 0, "2 settings at the join, this one 3"),
        (box["error"], 1, "3 settings at the join, this one 2"),
    ):
        assert error.name == "WORKERS" and error.value == f"127.0.0.1:{ports[other]}"
        assert f"worker {other} there compares {counts}: it runs another version" in str(error)
        assert "LEARNING_RATE" not in str(error)


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_workers_at_ipv6_addresses_join():
    ports = free_local_ports(2)  # free on IPv4: each worker binds both families
    cluster = [from_workers(",".join(f"[::1]:{p}" for p in ports), i) for i in range(2)]
    runs = [_in_thread(join.wait_for_workers, c, HANG_GUARD, StopFlag(), "WORKERS") for c in cluster]
    for t, box in runs:
        t.join(HANG_GUARD)
        assert not t.is_alive() and "error" not in box, box


def _call(port: int, line: bytes) -> bytes:
    """What a worker's probe does: connect once the port listens, read its line, send `line`."""
    deadline = time.monotonic() + HANG_GUARD
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD)
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            threading.Event().wait(0.05)
    with conn:
        got = join._read_line(conn)
        conn.sendall(line)
    return got


def test_a_worker_is_met_when_only_the_other_one_reaches_it_after_an_empty_and_a_reset_caller():
    """Worker 0 reaches worker 1, not the other way round (one host's firewall): worker 1 meets it when
    it calls, also after a caller that closed without a line and one that reset its connection."""
    p0, p1 = free_local_ports(2)
    t, box = _in_thread(join.wait_for_workers, _cluster([p0, p1], 1), HANG_GUARD, StopFlag(), "WORKERS")
    _call(p1, b"")  # closes without a line
    reset = socket.create_connection(("127.0.0.1", p1), timeout=HANG_GUARD)
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()
    got = _call(p1, join._line(_cluster([p0, p1], 0), join.settings_token({})))
    assert got.startswith(f"{join.MAGIC} 1 ".encode())
    t.join(HANG_GUARD)
    assert not t.is_alive() and "error" not in box, box


def test_a_worker_of_another_cluster_calling_is_not_counted_as_one_of_ours_but_named(caplog):
    """It refuses itself and exits; this one waits on for its own worker, but says who called and why it
    was not counted, at once and in the timeout's line (the wait alone would say nothing of it)."""
    p0, p1, p2 = free_local_ports(3)
    theirs = _cluster([p2, p0], 1)  # it calls p0 as its worker 1
    called = threading.Event()

    class HeldUntilCalled(StopFlag):  # the wait's first round holds until the calls are in: no race with its timeout
        def check(self):
            called.wait(HANG_GUARD)
            return super().check()

    t, box = _in_thread(join.wait_for_workers, _cluster([p0, p1], 0), 0.3, HeldUntilCalled(), "WORKERS")
    with caplog.at_level(logging.INFO, logger="train"):
        _call(p0, join._line(theirs, join.settings_token({})))
        _call(p0, join._line(theirs, join.settings_token({})))  # said once per caller; the first is recorded by now
        called.set()
        t.join(HANG_GUARD)
    stranger = (
        f"a worker of another cluster called from 127.0.0.1:{p0} (its worker 1, with another WORKERS); "
        "it stops itself: give every worker the same WORKERS"
    )
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [stranger]
    assert isinstance(box.get("error"), WorkersMissingError), box
    assert str(box["error"]) == (
        f"worker 1 (127.0.0.1:{p1}) did not start within JOIN_TIMEOUT=0.3 s ({stranger}): start it with the "
        "same WORKERS, check the host:port and that it is reachable from here, or raise JOIN_TIMEOUT"
    )


def test_each_length_of_line_a_version_sent_is_read_with_what_it_lacks_unknown():
    """Settings from the 5th word on, the commit from the 6th, the uncommitted changes from the 7th."""
    head = f"{join.MAGIC} 1 d 127.0.0.1:5"
    assert join._parse(f"{head}\n".encode()) == (1, "d", "127.0.0.1:5", "", None, "?")
    assert join._parse(f"{head} s\n".encode()) == (1, "d", "127.0.0.1:5", "s", None, "?")
    assert join._parse(f"{head} s c\n".encode()) == (1, "d", "127.0.0.1:5", "s", "c", "?")
    assert join._parse(f"{head} s c clean\n".encode()) == (1, "d", "127.0.0.1:5", "s", "c", "clean")
    assert join._parse(f"{head} s c clean more\n".encode()) is None


# -- through the command line ---------------------------------------------------------------------
@pytest.fixture
def started():
    """Processes a test started: killed at the end if a failed test left them running."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(started, tmp_path: Path, **extra: str) -> tuple[subprocess.Popen, list[int]]:
    ports = free_local_ports(2)
    out = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "train", "fit", "--runs-dir", str(tmp_path / "runs")],
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env(WORKERS=f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", WORKER_INDEX="0", **extra),
    )
    out.close()
    started.append(proc)
    return proc, ports


def _wait_for_line(proc, path: Path, words: str) -> str:
    end = time.monotonic() + HANG_GUARD
    while time.monotonic() < end:
        text = path.read_text()
        if words in text or proc.poll() is not None:
            return text
        time.sleep(0.05)
    raise TimeoutError(path.read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_other_worker_is_missing_exits_75(started, tmp_path, sig):
    proc, ports = _start(started, tmp_path)
    text = _wait_for_line(proc, tmp_path / "out.txt", "waiting for")
    assert f"waiting for worker 1 (127.0.0.1:{ports[1]}) to start" in text, text
    assert "of every network interface" in text  # the exposure warning, once
    proc.send_signal(sig)
    assert proc.wait(timeout=HANG_GUARD) == Interrupted.exit_code, (tmp_path / "out.txt").read_text()
    text = (tmp_path / "out.txt").read_text()
    name = signal.Signals(sig).name
    assert f"Interrupted: received {name} while waiting for worker 1 (127.0.0.1:{ports[1]})" in text, text
    assert "Traceback" not in text and text.count("of every network interface") == 1
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_join_timeout_exits_11_naming_the_missing_worker(started, tmp_path):
    proc, ports = _start(started, tmp_path, JOIN_TIMEOUT="0.5")
    assert proc.wait(timeout=HANG_GUARD) == WorkersMissingError.exit_code
    lines = (tmp_path / "out.txt").read_text().strip().splitlines()
    assert lines[-1].startswith(f"WorkersMissingError: worker 1 (127.0.0.1:{ports[1]}) did not start within")
    assert "JOIN_TIMEOUT=0.5 s" in lines[-1] and "Traceback" not in "\n".join(lines)


def test_a_port_in_use_exits_2_with_one_line_before_tensorflow(tmp_path):
    ports = free_local_ports(2)
    code = (
        "import sys; from train.cli import main; rc = main(['fit']); "
        "assert 'tensorflow' not in sys.modules; sys.exit(rc)"
    )
    with socket.socket() as other:
        other.bind(("127.0.0.1", ports[0]))
        other.listen()
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env(WORKERS=f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", WORKER_INDEX="0"),
            timeout=HANG_GUARD,
        )
    assert proc.returncode == PortInUseError.exit_code, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"PortInUseError: WORKERS: this worker's address 127.0.0.1:{ports[0]}: port {ports[0]}")
    assert "stop it, or give this worker a free port" in line


TAKEN_AFTER_THE_JOIN = """
import socket, sys
from train.workers.cluster import from_workers
from train.workers import PortInUseError
cluster = from_workers(sys.argv[1], 0)
other = socket.socket()
other.bind(("127.0.0.1", cluster.port))
other.listen()
from train.workers.strategy import join_cluster
try:
    join_cluster(cluster)
except PortInUseError as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.slow
def test_a_port_taken_between_the_join_and_tensorflow_is_the_same_one_line(tmp_path):
    ports = free_local_ports(2)
    workers = f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    proc = subprocess.run(
        [sys.executable, "-c", TAKEN_AFTER_THE_JOIN, workers],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env(),
        timeout=HANG_GUARD * 3,
    )
    assert f"PortInUseError: WORKERS: this worker's address 127.0.0.1:{ports[0]}: port {ports[0]} is in use" in (
        proc.stdout
    ), proc.stdout + proc.stderr[-3000:]
