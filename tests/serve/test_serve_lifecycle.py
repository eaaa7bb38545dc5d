"""`serve` as a process: verified export, readiness only once warmed up, SIGTERM drains and exits 0,
the body limit, nothing written, start-up errors with their exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from helpers import PYTHON, ipv6_loopback, subprocess_env
from PIL import Image
from servers_serve import SHAPE, get, make_gated_run, post_json, request

_DEADLINE = 300


def _until(check, what: str):
    """Poll `check` (an event we cause, e.g. a file appears) with a generous safety deadline."""
    deadline = time.monotonic() + _DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {_DEADLINE}s"
        time.sleep(0.05)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return True
    return False


@pytest.mark.slow
def test_not_ready_until_warmed_up_then_sigterm_finishes_the_request_in_flight_and_exits_0(tmp_path, start_server):
    gate = tmp_path / "gate"
    gate.mkdir()
    server = start_server(make_gated_run(tmp_path, gate))
    # The warm-up is held: live, but not ready, and requests are told so.
    assert get(server.url + "/v2/health/live")[0] == 200
    assert get(server.url + "/v2/health/ready")[0] == 503
    assert get(server.url + "/v2/models/model/ready")[0] == 503
    assert get(server.url + "/v1/models/model")[1]["model_version_status"][0]["state"] == "LOADING"
    status, doc = post_json(server.url + "/v1/models/model:predict", {"instances": [np.ones(SHAPE, int).tolist()]})
    assert status == 503 and "/v2/health/ready" in doc["error"]
    (gate / "warm").touch()
    server.wait_ready()

    answers = []
    held = {"instances": [np.full(SHAPE, 255).tolist()]}
    client = threading.Thread(target=lambda: answers.append(post_json(server.url + "/v1/models/model:predict", held)))
    client.start()
    _until((gate / "started").exists, "the held request reaching the model")
    server.proc.send_signal(signal.SIGTERM)
    _until(lambda: _refused(server.port), "the server to stop accepting connections")
    assert server.proc.poll() is None  # still finishing the request in flight
    (gate / "release").touch()
    client.join(_DEADLINE)
    assert server.proc.wait(_DEADLINE) == 0, server.output
    ((status, doc),) = answers
    assert status == 200 and len(doc["predictions"]) == 1
    # One format from start to stop, the template's lines and uvicorn's alike (as training logs);
    # TensorFlow's C++ runtime writes its own start-up lines before Python's logging can see them.
    assert "Application startup complete." in server.output and "Finished server process" in server.output
    stamped = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S")
    tensorflows = re.compile(r"[IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog")
    assert all(stamped.match(line) for line in server.lines if not tensorflows.match(line)), server.output


@pytest.mark.slow
@pytest.mark.parametrize("sig, signals, drain", [(signal.SIGHUP, 1, "1"), (signal.SIGTERM, 2, "600")])
def test_a_request_still_running_when_the_drain_ends_is_answered_503_and_serve_exits_0_without_waiting_for_it(
    tmp_path, start_server, sig, signals, drain
):
    """The model call is held for good (a decode or a model call that outlasts the drain): the drain's
    end, or a second signal, answers it as JSON and the process ends, its thread not waited for.
    SIGHUP (the terminal of a serve started by hand went away) drains as SIGTERM does."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "warm").touch()
    server = start_server(make_gated_run(tmp_path, gate), {"SERVE_DRAIN_SECONDS": drain}).wait_ready()
    answers = []
    held = json.dumps({"instances": [np.full(SHAPE, 255).tolist()]}).encode()
    url = server.url + "/v1/models/model:predict"
    client = threading.Thread(target=lambda: answers.append(request(url, held, {"Content-Type": "application/json"})))
    client.start()
    _until((gate / "started").exists, "the held request reaching the model")
    server.proc.send_signal(sig)
    if signals == 2:
        server.wait_for_line(r"Waiting for connections to close")
        server.proc.send_signal(sig)
    client.join(_DEADLINE)
    ((status, headers, body),) = answers
    assert status == 503 and {k.lower(): v for k, v in headers.items()}["retry-after"] == "1", body
    assert "stopping" in json.loads(body)["error"]
    assert server.proc.wait(_DEADLINE) == 0, server.output
    assert "Traceback" not in server.output and "CancelledError" not in server.output, server.output
    assert "not waiting for 1 call(s) still running" in server.output


@pytest.mark.slow
def test_an_export_copied_away_is_served_with_its_labels_nothing_is_written_and_big_bodies_stop(
    served_run, tmp_path, start_server
):
    export = tmp_path / "model-copy"
    shutil.copytree(served_run / "export", export)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    server = start_server(export, {"TMPDIR": str(tmp), "SERVE_MAX_BODY_MB": "2"}).wait_ready()
    # An upload over 1 MB: what multipart parsers commonly spool to a temporary file.
    noise = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, format="PNG")
    assert 1e6 < len(buf.getvalue()) < 2e6
    body = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="../../escape.png"\r\n\r\n'
        + buf.getvalue()
        + b"\r\n--b--\r\n"
    )
    status, _, raw = request(server.url + "/predict", body, {"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 200, raw
    assert json.loads(raw)["predictions"][0]["class"] in ("cat", "dog")
    # A chunked body has no Content-Length: it is counted as it comes and refused past the limit.
    # The server answers 413 and closes while the client may still be sending: the kernel can then
    # reset the connection before the client reads the answer. Either way the body is refused and
    # the server goes on answering.
    chunks = (b"x" * 65536 for _ in range(64))
    try:
        status, _, raw = request(server.url + "/predict", chunks, {"Content-Type": "image/png"}, "POST")
    except (urllib.error.URLError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        assert isinstance(reason, ConnectionError), exc
    else:
        assert status == 413 and "SERVE_MAX_BODY_MB" in json.loads(raw)["error"]
    assert get(server.url + "/v2/health/live")[0] == 200
    assert server.stop() == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not list(tmp.iterdir())


def _serve(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "train", "serve", *args],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=_DEADLINE,
    )


def test_a_damaged_export_is_refused_before_serving(served_run, tmp_path):
    run = tmp_path / served_run.name
    shutil.copytree(served_run, run)
    (run / "export" / "labels.txt").write_text("cat\nfox\n")
    done = _serve([str(run), "--port", "0"], tmp_path)
    assert done.returncode == 8 and "ExportError" in done.stderr and "labels.txt" in done.stderr
    assert "serving on" not in done.stderr


def test_a_run_without_an_export_says_how_to_make_one(served_run, tmp_path):
    run = tmp_path / served_run.name
    shutil.copytree(served_run, run, ignore=shutil.ignore_patterns("export"))
    (run / "best.weights.h5").write_bytes(b"weights")  # what `export` would make one from
    done = _serve([str(run), "--port", "0"], tmp_path)
    assert done.returncode == 8 and "python -m train export" in done.stderr


def test_serve_latest_passes_over_a_newer_run_that_never_trained_and_names_the_run_it_took(tmp_path, capsys):
    from train.cli import main

    runs = tmp_path / "runs"
    trained, failed = runs / "20260101-000000-aaaa", runs / "20260102-000000-bbbb"
    for run in (trained, failed):
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
    (trained / "best.weights.h5").write_bytes(b"w")  # weights, no export
    assert main(["serve", "latest", "--runs-dir", str(runs), "--env-file", ""]) == 8
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"latest: run {trained.name}, the newest run with weights (newer, without: {failed.name})"
    assert err[1].startswith(f"ExportError: run {trained.name} has no export") and len(err) == 2
    assert err[1].endswith(f"make it with `python -m train export {trained.name} --runs-dir {runs}`")


def test_serving_a_run_without_weights_says_to_train_it_not_to_export_it(tmp_path, capsys):
    from train.cli import main

    failed = tmp_path / "runs" / "20260102-000000-bbbb"
    failed.mkdir(parents=True)
    (failed / "config.json").write_text("{}")
    assert main(["serve", str(failed), "--env-file", ""]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"NoWeightsError: run {failed.name} has no export (") and "train export" not in err
    # Named by its path outside RUNS_DIR: the command pasted must look where it is.
    resume = f"python -m train --resume {failed.name} --runs-dir {failed.parent}"
    assert err.rstrip().endswith(f"resume it with `{resume}`, or train a new run")


def test_a_path_that_is_no_run_and_no_export_is_named_as_the_path_given(tmp_path, capsys):
    from train.cli import main

    (tmp_path / "empty").mkdir()
    flags = ["--runs-dir", str(tmp_path / "runs"), "--env-file", ""]
    for path, what in [
        (tmp_path / "gone", "does not exist"),
        (tmp_path / "empty", "is neither a run (no config.json) nor an export (no savedmodel/)"),
    ]:
        assert main(["serve", str(path), *flags]) == 2
        assert capsys.readouterr().err.strip() == (
            f"RunNotFound: {path} {what}: give a run id, `latest`, a run directory or an export folder (RUN/export)"
        )


def test_a_run_named_with_a_slash_is_still_looked_up_in_runs_dir(tmp_path, monkeypatch):
    """`serve RUN/` (a shell's completion adds the slash) or a path under RUNS_DIR: a run, not "does not exist"."""
    import argparse

    from builders import write_run

    from train.config import Settings, load_settings
    from train.serve.command import _run_of

    run = write_run(tmp_path / "runs" / "20260101-000000-000001", Settings().to_dict(), {"status": "completed"})
    monkeypatch.chdir(tmp_path)  # RUN/ is no folder here
    settings = load_settings({"runs_dir": str(tmp_path / "runs")}, env_file=None, environ={})
    assert _run_of(argparse.Namespace(run=f"{run.name}/", runs_dir=str(run.parent)), settings) == run


def test_a_port_in_use_and_a_bad_model_name_are_usage_errors(served_run, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _serve([str(served_run), "--port", str(taken.getsockname()[1])], tmp_path)
    assert done.returncode == 2 and "--port" in done.stderr and "in use" in done.stderr
    done = _serve([str(served_run), "--model-name", "a/b"], tmp_path)
    assert done.returncode == 2 and "--model-name" in done.stderr


@pytest.mark.parametrize("name", ["SERVE_MAX_BATCH", "SERVE_MAX_WAIT_MS", "SERVE_MAX_BODY_MB"])
def test_serving_settings_out_of_range_are_refused_by_name(name):
    from train.config import load_settings
    from train.errors import ConfigError

    with pytest.raises(ConfigError, match=name):
        load_settings(env_file=None, environ={name: "-1"})


def test_serve_without_the_server_packages_says_how_to_install_them(served_run, monkeypatch, capsys):
    from train.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as in the training image
    assert main(["serve", str(served_run), "--env-file", ""]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "requirements/serve.lock" in err and "serve` target" in err


@pytest.mark.parametrize(
    "host",
    ["", " ", "\t", "0", "0.0", "0.0.0", "00.0.0.0", "0x0", "127.1", "::0", "0:0::0", " 0.0.0.0", "::ffff:0.0.0.0"],
)
def test_a_host_that_does_not_say_plainly_where_is_refused_before_anything_loads(host, capsys):
    from train.cli import main

    # "" and 0 would listen on every interface without a word: only 0.0.0.0 or :: opens the server.
    assert main(["serve", "no-such-run", "--host", host, "--env-file", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ConfigError: --host=") and "0.0.0.0 or ::" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "host, address, in_url",
    [
        ("0.0.0.0", "0.0.0.0", "0.0.0.0"),
        ("::", "::", "[::]"),
        ("::1", "::1", "[::1]"),
        ("[::1]", "::1", "[::1]"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost", "localhost"),
    ],
)
def test_an_address_written_in_full_is_listened_on_and_logged_as_a_url_writes_it(host, address, in_url):
    from train.serve.address import listen_address, url_host

    assert listen_address(host) == address and url_host(address) == in_url


def test_a_name_whose_address_is_every_interface_is_refused_once_bound():
    from train.serve.address import bound_everywhere

    # A host name is only known by the address the socket got: 0.0.0.0 or :: means it said "any".
    assert bound_everywhere("any.example", "0.0.0.0") and bound_everywhere("any.example", "::")
    assert bound_everywhere("any.example", "::ffff:0.0.0.0")
    assert not bound_everywhere("0.0.0.0", "0.0.0.0") and not bound_everywhere("::", "::")
    assert not bound_everywhere("localhost", "127.0.0.1") and not bound_everywhere("::1", "::1")


def test_a_408_closes_the_connection_of_a_client_that_goes_on_trickling_its_body(monkeypatch):
    """Answered 408, a client that sent on a byte now and then kept its connection as long as it liked:
    uvicorn read on, and each byte stopped its keep-alive timer."""
    from train.serve import app as app_module

    monkeypatch.setattr(app_module, "BODY_IDLE_SECONDS", 0.3)
    app = _serve_app(ready=True)  # the body is read (never predicted on)
    keep_alive = 0.5  # uvicorn's idle connection timeout, short: the client outlives it many times over
    with _uvicorn(app, timeout_keep_alive=keep_alive) as port:
        answer, closed = _trickle(port, 10 * keep_alive)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert closed, f"the connection was held {10 * keep_alive:g} s past its 408"
    assert b"\r\nconnection: close\r\n" in answer.lower(), answer  # the client is told, too


def _trickle(port: int, seconds: float) -> tuple[bytes, bool]:
    """A prediction of 100,000 bytes whose body comes a byte each tenth of a second, whatever the
    answer, for up to `seconds`: (what came back, whether the server closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=0.1) as client:
        client.sendall(PREDICT + b"Content-Length: 100000\r\n\r\n{")
        answer, closed, until = b"", False, time.monotonic() + seconds
        while not closed and time.monotonic() < until:
            try:
                client.sendall(b" ")
                got = client.recv(65536)
                answer, closed = answer + got, got == b""
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed = True
    return answer, closed


@contextlib.contextmanager
def _uvicorn(app, **config):
    """`app` on a real uvicorn with serve's protocol, in a thread; yields its port."""
    import uvicorn

    from train.serve import server as server_module

    sock = server_module.bind("127.0.0.1", 0)
    server = uvicorn.Server(
        uvicorn.Config(app, http=server_module._Protocol, log_config=None, lifespan="off", **config)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _until(lambda: server.started, "the server started")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(_DEADLINE)


def _serve_app(ready: bool = False, with_state: bool = False):
    """serve's app (and its State, `with_state`); still loading, it answers a prediction 503 before its body is read."""
    from train.serve.app import State, build_app
    from train.serve.batcher import Batcher
    from train.serve.model import ServedModel

    model = ServedModel("model", None, "run", ["a", "b"], (2, 2, 1), lambda b: np.tile([0.5, 0.5], (len(b), 1)))
    state = State(model, max_batch=4, max_wait_ms=0, max_body=1_000_000, max_pixels=1_000_000)
    if ready:
        state.batcher = Batcher(model.run, 4, 0)  # never started: nothing here is predicted on
    return (build_app(state), state) if with_state else build_app(state)


PREDICT = b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def test_a_client_answered_before_its_body_was_read_is_let_go_however_it_trickles_the_rest(monkeypatch):
    """A 503 (or 404, or 413) answers before the body is read; uvicorn reads the rest and drops it, and
    each byte stopped its keep-alive timer: a client trickling it held its connection as long as it liked."""
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "LINGER_SECONDS", 0.5)
    with _uvicorn(_serve_app()) as port:
        answer, closed = _trickle(port, 20 * server_module.LINGER_SECONDS)
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert closed, f"the connection was held {20 * server_module.LINGER_SECONDS:g} s past its answer"


def test_a_client_answered_before_its_body_was_read_keeps_its_connection_once_the_body_has_come(monkeypatch):
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "LINGER_SECONDS", 0.2)
    with _uvicorn(_serve_app(), timeout_keep_alive=600) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as client:
            client.sendall(PREDICT + b"Content-Length: 2\r\n\r\n{")
            with client.makefile("rb") as answer:
                assert _response(answer).startswith(b"HTTP/1.1 503")
                client.sendall(b"}")  # the body's rest: the answered request is over
                # Past the linger a timer not stopped would have closed the connection (a negative: it
                # takes a wait; the timer is due long before the next request is read).
                time.sleep(3 * server_module.LINGER_SECONDS)
                client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _response(answer).startswith(b"HTTP/1.1 200 OK"), "closed before the next request"


def test_a_client_that_asked_to_close_gets_the_answer_given_before_its_body_was_read():
    """urllib sends `Connection: close` and its whole body before it reads: uvicorn closed the
    connection once the 503 was sent, the body's rest reset it, and the client lost its answer."""
    body = b" " * 32_000_000  # more than the sockets' buffers hold: the client is still sending when answered
    with _uvicorn(_serve_app()) as port:
        url = f"http://127.0.0.1:{port}/v1/models/model:predict"
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=_DEADLINE)
    assert answered.value.code == 503, answered.value
    assert b"still loading" in answered.value.read()


def test_the_server_run_in_another_thread_than_the_main_one_sets_no_signal_handler():
    """uvicorn's server runs in any thread, with no handlers; SIGHUP's was set in every one, and
    Python allows that in the main thread only: a ValueError before anything was served."""
    import uvicorn

    from train.serve import server as server_module

    server = server_module._Server(uvicorn.Config(_serve_app()), None, drain=1.0)
    before, box = signal.getsignal(signal.SIGHUP), {}

    def capture():
        try:
            with server.capture_signals():
                box["inside"] = signal.getsignal(signal.SIGHUP)
        except ValueError as exc:
            box["error"] = exc

    thread = threading.Thread(target=capture)
    thread.start()
    thread.join(_DEADLINE)
    assert box == {"inside": before}, box


def _response(answer) -> bytes:
    """One HTTP/1.1 response read whole from a socket's file (its body by Content-Length)."""
    head = [answer.readline()]
    while head[-1] not in (b"\r\n", b""):
        head.append(answer.readline())
    length = next((int(h.split(b":")[1]) for h in head if h.lower().startswith(b"content-length:")), 0)
    return b"".join(head) + answer.read(length)


def test_a_connection_whose_request_headers_do_not_come_whole_is_closed_and_the_others_are_served(monkeypatch):
    """uvicorn waits for a request's headers without end: clients that connect and send nothing, or
    half a request line, each held a connection and its file descriptor for as long as they liked."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "HEADERS_SECONDS", 0.5)
    with _uvicorn(Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])) as port:
        connect = [socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) for _ in range(3)]
        with connect[0] as silent, connect[1] as half, connect[2] as whole:
            half.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the headers never end
            whole.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            with whole.makefile("rb") as answer:
                assert answer.read().startswith(b"HTTP/1.1 200 OK")
            assert silent.recv(1) == b"" and half.recv(1) == b""  # closed by the server (a timeout here: held)


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_kept_alive_connection_is_not_closed_by_the_wait_for_its_first_request_headers(monkeypatch):
    """The wait for a request's headers stops once they come whole: left running, it closed a connection
    kept alive between two requests HEADERS_SECONDS after it was made, as the client sent its next one."""
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "HEADERS_SECONDS", 0.3)
    with _uvicorn(_serve_app(), timeout_keep_alive=600) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as kept, kept.makefile("rb") as answer:
            kept.sendall(LIVE)
            assert _response(answer).startswith(b"HTTP/1.1 200 OK")
            # A connection made after it and silent is closed HEADERS_SECONDS after it was made: by then the
            # first connection's wait, had it gone on, was over too (the event loop runs its timers in order).
            with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as silent:
                assert silent.recv(1) == b""
            kept.sendall(LIVE)
            assert _response(answer).startswith(b"HTTP/1.1 200 OK"), "closed between two requests"


def test_a_request_whose_headers_come_in_two_parts_is_served():
    """The wait for headers is set again while they are not whole, and a request split across reads
    (long headers, a slow client) is still served."""
    with _uvicorn(_serve_app()) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as split:
            split.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            # Another connection's whole answer: by then the server has read the first part (it came first).
            with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as other, other.makefile("rb") as a:
                other.sendall(LIVE)
                assert _response(a).startswith(b"HTTP/1.1 200 OK")
            split.sendall(b"Host: x\r\n\r\n")
            with split.makefile("rb") as answer:
                assert _response(answer).startswith(b"HTTP/1.1 200 OK")


def test_a_linger_over_closes_no_later_request_whose_body_is_still_coming(monkeypatch):
    """A request answered before its body was read lingers; its body's rest came, the connection lived
    on and carried another request whose body the app is reading when the first linger's time is up:
    that request is no longer answered-and-unread, and its connection stays open."""
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "LINGER_SECONDS", 0.3)
    nowhere = b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{"
    with _uvicorn(_serve_app(ready=True), timeout_keep_alive=600) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as kept, kept.makefile("rb") as answer:
            kept.sendall(nowhere)
            assert _response(answer).startswith(b"HTTP/1.1 404")
            kept.sendall(b"}" + PREDICT + b"Content-Length: 2\r\n\r\n{")  # the rest, then a body half sent
            # Another connection answered before its body was read, after the first, closes at its own
            # linger's end: the first's was over before.
            with socket.create_connection(("127.0.0.1", port), timeout=_DEADLINE) as other:
                other.sendall(nowhere)
                assert other.recv(65536).startswith(b"HTTP/1.1 404")
                while other.recv(65536):
                    pass
            kept.sendall(b"}")
            assert _response(answer).startswith(b"HTTP/1.1 400"), "closed while its body was coming"


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_request_that_asked_to_close_and_was_read_whole_is_closed_at_once(monkeypatch, version):
    """Only a client still sending its body is waited for after an answer that closes; one whose request
    was read whole (or had none) reads to the connection's end and is let go at once."""
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "LINGER_SECONDS", 600.0)
    with _uvicorn(_serve_app(), timeout_keep_alive=600) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client, client.makefile("rb") as answer:
            close = "" if version == "1.0" else "Connection: close\r\n"
            client.sendall(f"GET /v2/health/live HTTP/{version}\r\nHost: x\r\n{close}\r\n".encode())
            assert answer.read().startswith(b"HTTP/1.1 200 OK")  # to its end: closed (held, a timeout)


@pytest.mark.parametrize("signals, drain", [(1, 0.3), (2, 600.0)])
def test_a_signal_to_the_server_drains_for_its_seconds_and_a_second_one_cuts_off_at_once(caplog, signals, drain):
    """serve's own server, in this process: the first signal stops it taking connections and answers
    what is still in flight 503 once the drain is over, a second one at once; the socket it was given is closed.
    (The handler is called as the signal would call it: only the main thread may set one.)"""
    import uvicorn

    from train.serve import server as server_module

    app, state = _serve_app(ready=True, with_state=True)
    sock = server_module.bind("127.0.0.1", 0)
    config = uvicorn.Config(app, http=server_module._Protocol, log_config=None, lifespan="off")
    config.timeout_graceful_shutdown = 600  # uvicorn's own cut-off never comes first
    server = server_module._Server(config, state, drain)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    with caplog.at_level(logging.INFO, logger="train"):
        thread.start()
        _until(lambda: server.started, "the server started")
        with socket.create_connection(sock.getsockname(), timeout=60) as client, client.makefile("rb") as answer:
            client.sendall(PREDICT + b"Content-Length: 2\r\n\r\n{")  # its body never whole: in flight for good
            _until(lambda: state.in_flight, "the request in flight")
            start = time.monotonic()
            server.handle_exit(signal.SIGTERM, None)
            assert (server.should_exit, server.force_exit) == (True, False)
            if signals == 2:
                _until(lambda: any("stopping" in r.getMessage() for r in caplog.records), "the first signal handled")
                server.handle_exit(signal.SIGTERM, None)
                assert (server.should_exit, server.force_exit) == (True, True)
            got = _response(answer)
            waited = time.monotonic() - start
        thread.join(_DEADLINE)
    assert got.startswith(b"HTTP/1.1 503") and b"\r\nretry-after: 1\r\n" in got.lower(), got
    assert got.endswith(b'"server: stopping before this request was done; send it again (to another replica)"}')
    assert waited >= drain if signals == 1 else waited < drain
    assert not thread.is_alive() and sock.fileno() == -1
    stopping = [r.getMessage() for r in caplog.records if r.name == "train" and "stopping" in r.getMessage()]
    assert stopping[0] == f"stopping: requests in flight get up to {drain:g} s (a second signal stops at once)"


def test_a_client_that_asked_to_close_and_stops_sending_its_body_is_let_go_at_the_linger_end(monkeypatch):
    """Answered before its body was read, a request that asked to close lingers for the body's rest: a
    client that then sends nothing more is closed LINGER_SECONDS later, not held to uvicorn's keep-alive."""
    from train.serve import server as server_module

    monkeypatch.setattr(server_module, "LINGER_SECONDS", 0.3)
    with _uvicorn(_serve_app(), timeout_keep_alive=600) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client, client.makefile("rb") as answer:
            client.sendall(PREDICT + b"Connection: close\r\nContent-Length: 100\r\n\r\n{")
            assert answer.read().startswith(b"HTTP/1.1 503")  # to its end: closed (held, a timeout)


@pytest.mark.parametrize(
    "version, connection, asked",
    [
        ("1.1", [b"close"], True),
        ("1.1", [b"keep-alive,close"], True),  # tokens without a space after the comma
        ("1.1", [b"Keep-Alive, CLOSE "], True),
        ("1.1", [b"keep-alive", b"close"], True),  # in a header of its own
        ("1.0", [], True),  # h11 keeps no HTTP/1.0 connection open
        ("1.1", [], False),
        ("1.1", [b"keep-alive"], False),
        ("1.1", [b"closed, xclose"], False),
    ],
)
def test_a_request_asked_to_close_by_a_connection_token_or_by_http_1_0(version, connection, asked):
    from train.serve import server as server_module

    headers = [(b"host", b"x"), (b"x-connection", b"close"), *((b"connection", value) for value in connection)]
    assert server_module._asked_to_close({"http_version": version, "headers": headers}) is asked


def test_the_port_is_bound_listening_tcp_and_reusable_on_the_address_family_of_the_host():
    from train.serve.server import bind

    families = [("127.0.0.1", socket.AF_INET)] + ([("::1", socket.AF_INET6)] if ipv6_loopback() else [])
    with bind("0.0.0.0", 0) as everywhere:  # every interface, given as such: taken, not refused
        assert everywhere.getsockname()[0] == "0.0.0.0"
    for host, family in families:
        with bind(host, 0) as sock:
            assert (sock.family, sock.type, sock.proto) == (family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            socket.create_connection(sock.getsockname()[:2], timeout=_DEADLINE).close()  # waits in the backlog


def test_a_port_in_use_an_address_not_of_this_host_and_a_name_for_every_interface_are_refused_by_name():
    from train.errors import ConfigError
    from train.serve.server import bind

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            bind("127.0.0.1", port)
    assert str(refused.value) == (
        f"--port={port!r} is not valid: in use on 127.0.0.1 by another process: stop it or give another --port"
    )
    with pytest.raises(ConfigError) as refused:
        bind("192.0.2.1", 0)  # TEST-NET-1: an address of no host here
    assert str(refused.value) == (
        "--host='192.0.2.1' is not valid: cannot listen there (Cannot assign requested address): "
        "give an address of this host"
    )
    with pytest.raises(ConfigError) as refused:
        bind("0", 0)  # what the command refuses first; a host name can stand for 0.0.0.0 too
    assert str(refused.value) == (
        "--host='0' is not valid: its address is every interface (0.0.0.0 or ::): give 0.0.0.0 or :: itself if "
        "that is meant"
    )
