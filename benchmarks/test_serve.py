"""11. Serving: requests/s and latency of `python -m train serve` with dynamic batching against without.

Two servers on 127.0.0.1 hold the same export of the default CNN (28x28x1, 10 classes): one batches
(SERVE_MAX_BATCH=32, SERVE_MAX_WAIT_MS=5), one answers each request alone (SERVE_MAX_BATCH=1). For 1, 8 and
32 concurrent clients each sends one image per request (Open Inference Protocol, JSON) on a kept-alive
connection; the load is bounded by a fixed number of requests and a time limit per level. Beside
them, `predict`'s cost per image (predict_files on one file: what a one-file-at-a-time user pays,
the export loaded every time). The ratio is batched throughput at 32 clients over the unbatched one
at 1 client (one by one). Clients and servers share this machine's cores: the figures say so.

12. Valid requests under a stream of bad ones: the latency of one-image requests from one client,
alone and while BAD clients keep sending 34 KB PNGs that declare 36 million pixels each (what once
held every decoding thread: 20.9 s for a request answered in 12 ms alone); the ratio is the p50
under that stream over the p50 alone.

13. Memory under large uploads: LARGE clients each post a JSON body of 15 MB (pixel lists, under the
default SERVE_MAX_BODY_MB of 16) at once; the ratio is the server's peak memory growth (VmHWM over
its resident size once ready) over the bytes posted. Every body read whole and parsed took 1.7x.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import common
import numpy as np
import pytest

GOAL = 3.0
CLIENTS = (1, 8, 32)
BAD = 7  # clients sending heavy requests without pause
UNDER_LOAD_GOAL = 5.0  # valid-request latency under the bad stream, as a multiple of its idle value
LARGE = 40  # clients posting a large body each, at once
MEMORY_GOAL = 0.5  # the server's peak growth, as a fraction of the bytes they post
HANG = 600  # seconds without an answer to a bad request: the server hangs (a loaded machine answers in fewer)
TIMEOUT = 120  # seconds a client waits for the answer to one request
# What a bad request can meet that is no answer of the server: nothing listens (it is gone), or TIMEOUT.
NO_ANSWER = ("ConnectionRefusedError", "TimeoutError")


class Server:
    def __init__(self, run, env: dict[str, str]):
        full_env = {**os.environ, "PYTHONPATH": str(common.ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "train", "serve", str(run), "--port", "0"],
            cwd=run.parent,
            env=full_env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.port = None
        for line in self.proc.stderr:  # the port, then readiness: events, not sleeps
            if m := re.search(r"serving on http://127\.0\.0\.1:(\d+)", line):
                self.port = int(m.group(1))
            if " ready: " in line:
                break
        assert self.port and self.proc.poll() is None, "serve did not start"
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def _load(port: int, clients: int, total: int, limit: float, body: bytes) -> dict:
    """Up to `total` requests from `clients` threads, stopped at `limit` seconds; rps and latencies.

    A client whose request gets no answer in TIMEOUT stops (counted in `timeouts`: a machine that
    busy); any other failure (an answer other than 200, a refused or reset connection) fails the
    benchmark: in a thread of its own it would only be printed, and the level would read as unanswered."""
    latencies: list[float] = []
    failures: list[BaseException] = []
    timeouts = [0]
    lock = threading.Lock()
    left = [total]
    stop_at = time.perf_counter() + limit

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            while time.perf_counter() < stop_at:
                with lock:
                    if left[0] == 0:
                        break
                    left[0] -= 1
                t0 = time.perf_counter()
                conn.request("POST", "/v2/models/model/infer", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200, f"a valid request was answered {resp.status}"
                with lock:
                    latencies.append(time.perf_counter() - t0)
        except TimeoutError:
            with lock:
                timeouts[0] += 1
        except BaseException as exc:  # noqa: BLE001  (raised again below, in the benchmark's thread)
            with lock:
                failures.append(exc)
        finally:
            conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        raise failures[0]
    ms = np.asarray(latencies) * 1000
    return {  # no request answered within TIMEOUT (a machine that busy): no latency, not a failure
        "requests": len(latencies),
        "timeouts": timeouts[0],
        "rps": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
    }


def _exported_run(tmp_path):
    """(run directory of the default CNN's export, a one-image v2 JSON body, that image's pixels)."""
    from train.config import Settings
    from train.models import build_model
    from train.results.export import export_model

    run = tmp_path / "20260101-000000-000000-bench"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Settings().to_dict()))
    labels = [str(i) for i in range(10)]
    (run / "manifest.json").write_text(json.dumps({"data": {"input_shape": [28, 28, 1], "class_names": labels}}))
    export_model(build_model("cnn", (28, 28, 1), 10), run, labels)
    pixels = np.random.default_rng(0).integers(0, 256, (1, 28, 28, 1), dtype=np.uint8)
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 28, 28, 1], "data": pixels.reshape(-1).tolist()}
    return run, json.dumps({"inputs": [tensor]}).encode(), pixels


@pytest.mark.processes
def test_serving_throughput_with_and_without_batching(benchmark, quick, tmp_path):
    from PIL import Image

    from train.results.predict import predict_files

    run, body, pixels = _exported_run(tmp_path)
    image = tmp_path / "one.png"
    Image.fromarray(pixels[0, :, :, 0]).save(image)
    total, limit = (96, 20.0) if quick else (1000, 60.0)

    def measure():
        figures = {}
        predict_s = [common.timed(lambda: predict_files(run, [str(image)]))[0] for _ in range(1 if quick else 3)]
        figures["predict_seconds_per_image"] = common.median(predict_s)
        for mode, env in (("unbatched", {"SERVE_MAX_BATCH": "1"}), ("batched", {"SERVE_MAX_BATCH": "32"})):
            server = Server(run, {**env, "SERVE_MAX_WAIT_MS": "5"})
            try:
                _load(server.port, 4, 16, limit, body)  # warm the connections and the model's batch sizes
                for clients in CLIENTS:
                    figures[f"{mode}_{clients}"] = _load(server.port, clients, total, limit, body)
            finally:
                server.stop()
        return figures

    figures = common.once(benchmark, measure)
    one_by_one = figures["unbatched_1"]["rps"]
    value = common.ratio(figures["batched_32"]["rps"], one_by_one)
    common.record(
        benchmark,
        "11. serving requests/s: batched at 32 clients / one by one (1 client, no batching)",
        f">= {GOAL}x",
        value,
        value is not None and value >= GOAL,
        cpus=os.cpu_count(),
        note="clients and servers on the same (shared) machine",
        **figures,
    )


def _bad_stream(port: int, clients: int, png: bytes, stop: threading.Event) -> dict[int | str, int]:
    """`clients` threads posting `png` to /predict until `stop`; started, and the count of each status
    (or of each error's name: a reset is the server's answer too, NO_ANSWER's are not). A client that
    finds nothing listening stops: the server is gone, and it would only spin."""
    statuses: dict[int | str, int] = {}
    lock = threading.Lock()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        while not stop.is_set():
            try:
                conn.request("POST", "/predict", png, {"Content-Type": "image/png"})
                resp = conn.getresponse()
                resp.read()
                status, close = resp.status, resp.getheader("connection", "").lower() == "close"
            except (OSError, http.client.HTTPException) as exc:  # a reset counts too; the stream goes on
                status, close = type(exc).__name__, True
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
            if status == "ConnectionRefusedError":
                break
            if close:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        conn.close()

    for _ in range(clients):
        threading.Thread(target=client, daemon=True).start()
    return statuses


def _answered(statuses: dict[int | str, int]) -> int:
    """The bad requests the server answered (a status or a reset), of those `_bad_stream` counts."""
    return sum(n for k, n in list(statuses.items()) if k not in NO_ANSWER)  # list(): a copy, at once


@pytest.mark.processes
def test_valid_request_latency_while_bad_requests_arrive(benchmark, quick, tmp_path):
    import io

    from PIL import Image

    run, body, _ = _exported_run(tmp_path)
    out = io.BytesIO()
    Image.new("L", (6000, 6000)).save(out, format="PNG")  # about 35 KB declaring 36 million pixels
    png = out.getvalue()
    total, limit = (32, 20.0) if quick else (500, 60.0)

    def measure():
        server = Server(run, {"SERVE_MAX_BATCH": "32", "SERVE_MAX_WAIT_MS": "0"})
        stop = threading.Event()
        try:
            _load(server.port, 1, 16, limit, body)  # warm the connection and the model
            figures = {"idle": _load(server.port, 1, total, limit, body)}
            statuses = _bad_stream(server.port, BAD, png, stop)
            deadline = time.monotonic() + HANG  # waits for the event; the cap only catches a hang
            while _answered(statuses) < BAD:  # answers to bad requests: the stream is flowing
                assert server.proc.poll() is None, f"serve exited ({server.proc.returncode}) under the bad stream"
                assert time.monotonic() < deadline, f"{BAD} bad requests got no answer in {HANG} s: {statuses}"
                time.sleep(0.05)
            figures["under_bad_stream"] = _load(server.port, 1, total, limit, body)
            stop.set()
            figures["bad_answers"] = {str(k): v for k, v in sorted(statuses.items(), key=str)}
        finally:
            stop.set()
            server.stop()
        return figures

    figures = common.once(benchmark, measure)
    value = common.ratio(figures["under_bad_stream"]["p50_ms"], figures["idle"]["p50_ms"])
    common.record(
        benchmark,
        f"12. serving p50 latency of valid requests while {BAD} clients send 36-megapixel PNGs / alone",
        f"<= {UNDER_LOAD_GOAL}x",
        value,
        value is not None and value <= UNDER_LOAD_GOAL,
        cpus=os.cpu_count(),
        bad_clients=BAD,
        note="clients and servers on the same (shared) machine",
        **figures,
    )


def _memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak) of a process, in kB (Linux)."""
    with open(f"/proc/{pid}/status") as fh:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in fh) if k in ("VmRSS", "VmHWM")}


@pytest.mark.processes
def test_server_memory_while_many_clients_post_large_bodies(benchmark, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    run, _, _ = _exported_run(tmp_path)
    row = json.dumps([[[0]] * 28] * 28)  # one 28x28x1 image as pixel lists
    body = ('{"instances": [' + ",".join([row] * (15_000_000 // len(row))) + "]}").encode()

    def post(port: int) -> int | str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            conn.request("POST", "/v1/models/model:predict", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status
        except (OSError, http.client.HTTPException) as exc:  # a reset is an answer too
            return type(exc).__name__
        finally:
            conn.close()

    def measure():
        server = Server(run, {})
        try:
            ready = _memory_kb(server.proc.pid)
            with ThreadPoolExecutor(LARGE) as pool:
                statuses = list(pool.map(post, [server.port] * LARGE))
            after = _memory_kb(server.proc.pid)
        finally:
            server.stop()
        counts = {str(k): statuses.count(k) for k in sorted(set(statuses), key=str)}
        return {"ready_mb": ready["VmRSS"] / 1024, "peak_mb": after["VmHWM"] / 1024, "answers": counts}

    figures = common.once(benchmark, measure)
    posted_mb = LARGE * len(body) / 2**20
    value = common.ratio(figures["peak_mb"] - figures["ready_mb"], posted_mb)
    common.record(
        benchmark,
        f"13. serving memory: peak growth while {LARGE} clients post {len(body) / 1e6:.0f} MB of JSON at once / posted",
        f"<= {MEMORY_GOAL}x",
        value,
        value is not None and value <= MEMORY_GOAL,
        posted_mb=posted_mb,
        **figures,
    )


# -- the clients themselves, against stand-in servers (no TensorFlow): what they count as an answer.
# Each waits for what it checks (an answer, a timeout, a refusal), HANG seconds at most.


class _StandIn:
    """An HTTP server on 127.0.0.1 that answers every POST with `status`."""

    def __init__(self, status: int = 200):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _silent_port(sock: socket.socket) -> int:
    """A port that takes connections (the kernel's backlog) and never answers: `sock` never accepts."""
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock.getsockname()[1]


def _until(done, what) -> None:
    deadline = time.monotonic() + HANG
    while not done():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_a_level_whose_requests_are_answered_with_an_error_fails_the_benchmark():
    with _StandIn(status=500) as server, pytest.raises(AssertionError, match="a valid request was answered 500"):
        _load(server.port, 2, 8, HANG, b"{}")


def test_a_level_whose_requests_get_no_answer_in_time_has_no_latency(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT", 0.3)
    with socket.socket() as sock:
        got = _load(_silent_port(sock), 1, 4, HANG, b"{}")
    assert (got["requests"], got["timeouts"], got["p50_ms"]) == (0, 1, None)


def test_a_level_answered_gives_its_latencies():
    with _StandIn() as server:
        got = _load(server.port, 2, 8, HANG, b"{}")
    assert (got["requests"], got["timeouts"]) == (8, 0) and got["p50_ms"] > 0


def test_a_bad_request_meeting_no_server_or_no_answer_is_not_counted_as_answered(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT", 0.3)
    stop = threading.Event()
    try:
        with socket.socket() as hung, socket.socket() as closed:
            silent = _bad_stream(_silent_port(hung), 2, b"png", stop)
            closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
            gone = _bad_stream(closed.getsockname()[1], 2, b"png", stop)
            _until(lambda: silent.get("TimeoutError", 0) >= 2 and sum(gone.values()) >= 2, lambda: (silent, gone))
            assert _answered(silent) == 0, silent
    finally:
        stop.set()
    assert gone == {"ConnectionRefusedError": 2}, "each client stops at the first refusal"


def test_bad_requests_answered_with_a_refusal_count():
    stop = threading.Event()
    try:
        with _StandIn(status=413) as server:
            statuses = _bad_stream(server.port, 2, b"png", stop)
            _until(lambda: _answered(statuses) >= 4, lambda: statuses)
    finally:
        stop.set()
    assert set(statuses) == {413}
