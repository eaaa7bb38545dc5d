"""The app in-process (plain ASGI calls, no sockets): a model call that fails answers 500 as JSON and
the next request is served."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import numpy as np
import pytest

from train.serve.app import State, build_app
from train.serve.batcher import Batcher
from train.serve.model import ServedModel


async def _call(app, path: str, doc) -> tuple[int, dict]:
    return await _send(app, path, json.dumps(doc).encode(), "application/json")


async def _send(app, path: str, body: bytes, content_type: str, headers=()) -> tuple[int, dict]:
    status, _, doc = await _exchange(app, path, body, content_type, headers)
    return status, doc


async def _exchange(
    app,
    path: str,
    body: bytes,
    content_type: str | None,
    headers=(),
    method="POST",
    cut_short=False,
    stall=False,
    trickle=0.0,
    asked: list | None = None,
    length: str | None = "",
    raw: bool = False,
) -> tuple[int, dict, dict]:
    """(status, response headers, JSON body) of one request; `cut_short`: the client goes away after
    half its body; `stall`: it sends half its body, then nothing more and stays; `trickle`: it sends
    a byte each so many seconds; `asked` notes each time the server asks for the body; `length`: the
    Content-Length sent ("": the body's, None: none, as a chunked body has); `content_type` None: none sent;
    `raw`: the body's bytes, not parsed."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            *([(b"content-type", content_type.encode())] if content_type is not None else []),
            *([(b"content-length", (length or str(len(body))).encode())] if length is not None else []),
            *((k.encode(), v.encode()) for k, v in headers),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8501),
    }
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    if cut_short or stall:
        messages = [{"type": "http.request", "body": body[: len(body) // 2], "more_body": True}]
    if trickle:
        messages = [{"type": "http.request", "body": body[i : i + 1], "more_body": True} for i in range(len(body))]
        messages[-1]["more_body"] = False

    async def receive():
        if asked is not None:
            asked.append("body")
        if trickle and messages:
            await asyncio.sleep(trickle)
        if stall and not messages:
            await asyncio.Event().wait()  # never set: the rest of the body never comes
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    answer = {k.decode(): v.decode() for k, v in start["headers"]}
    if raw:
        return start["status"], answer, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    if not any(m.get("body") for m in sent):
        return start["status"], answer, {}
    return (
        start["status"],
        answer,
        json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")),
    )


async def _with_batcher(state, call):
    """`call()`'s result with the model's batcher running, as a ready server has it."""
    state.batcher = Batcher(state.model.run, 4, 0)
    state.batcher.start()
    try:
        return await call()
    finally:
        await state.batcher.stop()


def test_a_failing_model_call_is_a_json_500_and_the_server_goes_on():
    calls = []

    def run(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("out of memory\nmore lines")
        return np.tile([0.25, 0.75], (len(batch), 1)).astype(np.float32)

    model = ServedModel("model", None, "run", ["a", "b"], (2, 2, 1), run)
    state = State(model, max_batch=4, max_wait_ms=0, max_body=10_000, max_pixels=1_000_000)
    app = build_app(state)
    request = {"instances": [np.zeros((2, 2, 1), int).tolist()]}

    async def scenario():
        state.batcher = Batcher(run, 4, 0)
        state.batcher.start()
        try:
            return [await _call(app, "/v1/models/model:predict", request) for _ in range(2)]
        finally:
            await state.batcher.stop()

    (status, doc), (again, answer) = asyncio.run(scenario())
    assert status == 500 and list(doc) == ["error"] and "RuntimeError: out of memory" in doc["error"]
    assert "\n" not in doc["error"]
    assert again == 200 and answer == {"predictions": [[0.25, 0.75]]}


def test_accepted_connections_send_small_writes_at_once():
    """TCP_NODELAY on every accepted connection: a response's header and body writes are not held
    back for the client's delayed ACK."""
    import socket

    from train.serve.server import bind

    sock = bind("127.0.0.1", 0)

    async def scenario():
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                accepted.set_result(
                    transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                )

        server = await loop.create_server(Probe, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        try:
            return await accepted
        finally:
            writer.close()
            server.close()

    assert asyncio.run(scenario()) != 0


# -- a request is counted before any of it is decoded ------------------------------------------------
def _app(max_batch=4, max_pixels=1_000_000, probs=(0.5, 0.5)):
    model = ServedModel("model", None, "run", ["a", "b"], (2, 2, 1), lambda b: np.tile(probs, (len(b), 1)))
    state = State(model, max_batch=max_batch, max_wait_ms=0, max_body=64_000_000, max_pixels=max_pixels)
    return state, build_app(state)


def _serve(requests, max_batch=4):
    """Each (path, body, content type, headers) answered in-process, in order: [(status, doc)]."""
    state, app = _app(max_batch)

    async def scenario():
        state.batcher = Batcher(state.model.run, max_batch, 0)
        state.batcher.start()
        try:
            return [await _send(app, *r) for r in requests]
        finally:
            await state.batcher.stop()

    return asyncio.run(scenario())


def _png(side: int = 2) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.zeros((side, side), np.uint8)).save(out, format="PNG")
    return out.getvalue()


def _multipart(parts, boundary="b0undary") -> tuple[bytes, str]:
    """A form-data body of (name, filename or None, bytes) parts."""
    chunks = []
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        chunks.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(chunks) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _v2_binary(dims, elements) -> tuple[bytes, tuple]:
    import struct

    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    head = json.dumps(
        {
            "inputs": [
                {"name": "images", "datatype": "BYTES", "shape": dims, "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    return head + raw, (("inference-header-content-length", str(len(head))),)


@pytest.fixture
def decoded(monkeypatch):
    """Every image the server decodes, by name: a refused request must have none."""
    from train.serve import payloads

    seen = []
    real = payloads.image_file
    monkeypatch.setattr(payloads, "image_file", lambda raw, shape, what: seen.append(what) or real(raw, shape, what))
    return seen


def test_an_oversized_request_of_any_protocol_is_refused_before_an_image_is_decoded(decoded):
    import time

    tiny = base64.b64encode(_png()).decode()
    many_fields, form = _multipart([(f"f{i}", None, b"") for i in range(50_000)])
    many_files, files_form = _multipart([(f"f{i}", f"{i}.png", b"") for i in range(5)])
    nested_inner, inner_type = _multipart([(f"f{i}", None, b"") for i in range(50_000)], boundary="inner")
    nested, nested_form = _multipart([("x", None, f"Content-Type: {inner_type}\r\n\r\n".encode() + nested_inner)])
    headers_only = b"--b0undary\r\n" + b"X-A: b\r\n" * 1_000_000 + b"--b0undary--\r\n"
    v2_body, v2_headers = _v2_binary([1_000_000], [b""] * 1_000_000)
    short_body, short_headers = _v2_binary([1], [b""] * 1_000_000)
    started = time.monotonic()
    answers = _serve(
        [
            (
                "/v1/models/model:predict",
                json.dumps({"instances": [{"b64": tiny}] * 10_000}).encode(),
                "application/json",
            ),
            ("/v1/models/model:predict", json.dumps({"inputs": [{"b64": tiny}] * 10_000}).encode(), "application/json"),
            ("/predict", many_fields, form),
            ("/predict", many_files, files_form),
            ("/predict", nested, nested_form),
            ("/predict", headers_only, form),
            ("/v2/models/model/infer", v2_body, "application/octet-stream", v2_headers),
            ("/v2/models/model/infer", short_body, "application/octet-stream", short_headers),
        ]
    )
    assert time.monotonic() - started < 20  # minutes before: every image decoded, every part parsed
    statuses = [status for status, _ in answers]
    assert statuses == [400] * 8, answers
    assert all("SERVE_MAX_BATCH=4" in doc["error"] for _, doc in answers[:4]), answers
    assert "no file in the upload" in answers[4][1]["error"]  # the nested form is not walked
    assert "bytes of part headers" in answers[5][1]["error"]
    assert "SERVE_MAX_BATCH=4" in answers[6][1]["error"] and "inputs[0].shape" in answers[7][1]["error"]
    assert decoded == []


@pytest.mark.parametrize(
    "dims", [[True, 2, 2, 1], [2**60 + 1, 2, 2, 1], [2, 2**60 + 1, 2, 1], [1.0, 2, 2, 1], [1] * 1000]
)
def test_a_v2_shape_that_is_no_batch_is_a_400_naming_it(dims):
    doc = {"inputs": [{"name": "images", "datatype": "UINT8", "shape": dims, "data": [0, 0, 0, 0]}]}
    ((status, answer),) = _serve([("/v2/models/model/infer", json.dumps(doc).encode(), "application/json")])
    assert status == 400 and answer["error"].startswith("inputs[0].shape") and "\n" not in answer["error"], answer


def test_a_form_with_files_and_fields_is_still_served(decoded):
    body, form = _multipart([("note", None, b"hello"), ("file", "a.png", _png()), ("file", "b.png", _png())])
    ((status, answer),) = _serve([("/predict", body, form)])
    assert status == 200 and [row["file"] for row in answer["predictions"]] == ["a.png", "b.png"], answer
    assert decoded == ["a.png", "b.png"]


# -- heavy requests neither delay small ones nor queue without end ------------------------------------
def test_heavy_requests_do_not_delay_a_small_one_and_past_their_lane_are_refused_with_retry_after(monkeypatch):
    """A PNG of a few KB can declare millions of pixels (seven such requests once held every decoding
    thread for 20 s). Their decodes are held here: a small request is answered meanwhile, and the heavy
    ones past what their lane holds are refused at once instead of queueing."""
    import os
    import threading
    import time

    from train.serve import payloads

    release, held = threading.Event(), []
    real = payloads.image_file

    def decode(raw, shape, what):
        if what.startswith("big"):
            held.append(what)
            release.wait(60)
        return real(raw, shape, what)

    monkeypatch.setattr(payloads, "image_file", decode)
    state, app = _app(max_pixels=10_000_000)
    big, form = _multipart([("file", "big.png", _png(2100))])  # 4.4 million pixels in a few KB
    small, small_form = _multipart([("file", "small.png", _png())])
    heavy = len(os.sched_getaffinity(0)) + 40  # more than any default thread pool holds

    async def scenario():
        state.batcher = Batcher(state.model.run, 4, 0)
        state.batcher.start()
        try:
            loads = [asyncio.ensure_future(_exchange(app, "/predict", big, form)) for _ in range(heavy)]
            deadline = time.monotonic() + 60
            while not held:  # a heavy decode under way (or every heavy request answered: a failure below)
                if time.monotonic() > deadline or all(load.done() for load in loads):
                    break
                await asyncio.sleep(0.01)
            light = await asyncio.wait_for(_exchange(app, "/predict", small, small_form), 30)
            release.set()
            return light, await asyncio.gather(*loads)
        finally:
            release.set()
            await state.batcher.stop()

    (status, _, doc), answers = asyncio.run(scenario())
    assert status == 200 and doc["predictions"][0]["file"] == "small.png", doc
    refused = [(headers, doc) for status, headers, doc in answers if status == 503]
    assert refused and all(status in (200, 503) for status, _, _ in answers), answers
    assert all(h["retry-after"] == "1" and "busy with large requests" in d["error"] for h, d in refused), refused
    running = max(1, len(os.sched_getaffinity(0)) // 2)  # half the cores (one on a single core), as many waiting
    assert len(answers) - len(refused) <= 2 * running


def test_large_bodies_past_their_reading_slots_are_refused_unread():
    """Each large body was read whole before its lane could refuse it: 40 clients posting 15 MB at once
    took the server's peak from 528 MB to 1,529 MB. Clients holding every slot (and every place in line) with a
    large body they are still sending: one more large request is refused with 503 before a byte is read."""
    import time

    state, app = _app()
    body = b"0" * 3_000_000  # over a light request's 1 MB
    slots = state.decoder.reading.limit  # the lane's own size (work.Decoder): as many reading as waiting
    asked: list[str] = []

    async def scenario():
        stalled = [
            asyncio.ensure_future(_exchange(app, "/predict", body, "application/octet-stream", stall=True))
            for _ in range(2 * slots)
        ]
        deadline = time.monotonic() + 60
        try:
            while state.decoder.reading._waiting < slots:  # every slot taken and every place in line
                assert not any(s.done() for s in stalled), [s.result() for s in stalled if s.done()]
                assert time.monotonic() < deadline, "the stalled clients never took the reading slots"
                await asyncio.sleep(0.01)
            one_more = _exchange(app, "/predict", body, "application/octet-stream", asked=asked)
            return await asyncio.wait_for(one_more, 60)  # not refused: it waits for a slot, a failure not a hang
        finally:
            for s in stalled:
                s.cancel()
            await asyncio.gather(*stalled, return_exceptions=True)

    status, headers, answer = asyncio.run(_with_batcher(state, scenario))
    assert status == 503 and headers["retry-after"] == "1", answer
    assert "busy with large requests" in answer["error"] and asked == [], (answer, asked)


@pytest.mark.parametrize("path", ["/v1/models/model:predict", "/v2/models/model/infer"])
def test_json_with_more_values_than_a_full_batch_holds_is_refused_before_it_is_parsed(path, monkeypatch):
    """16 MB of small nested lists parsed into about 500 MB of Python objects before the batch was counted."""
    from train.serve import payloads

    parsed, loads = [], json.loads
    monkeypatch.setattr(payloads.json, "loads", lambda body: parsed.append(body) or loads(body))
    values = [[[0]] * 2] * 2  # one 2x2x1 image of _app's model; 4 a batch (SERVE_MAX_BATCH), 1,016 commas at most
    rows = [values] * 300
    tensor = {"name": "images", "datatype": "UINT8", "shape": [300, 2, 2, 1], "data": rows}
    doc = {"instances": rows} if path.startswith("/v1") else {"inputs": [tensor]}
    body = json.dumps(doc).encode()
    ((status, answer),) = _serve([(path, body, "application/json")])
    assert status == 400 and body not in parsed, answer  # (the answer itself is parsed by the test)
    assert answer["error"] == (
        "body (over 1,016 values): more than SERVE_MAX_BATCH=4 images of 2x2x1 hold; split the request"
    ), answer


def test_images_declaring_more_pixels_than_the_budget_are_refused_before_any_is_decoded(decoded):
    # 2 images of 1,000 x 1,000 declare 2,000,000 pixels: over SERVE_MAX_PIXELS=1,000,000 of _app.
    image = {"b64": base64.b64encode(_png(1000)).decode()}
    request = json.dumps({"instances": [image, image]}).encode()
    ((status, answer),) = _serve([("/v1/models/model:predict", request, "application/json")])
    assert status == 413 and "SERVE_MAX_PIXELS=1,000,000" in answer["error"] and "2x2x1" in answer["error"], answer
    assert decoded == []


# -- odd requests get their own answer ---------------------------------------------------------------
def test_get_on_a_predict_path_is_a_405_not_a_model_named_model_predict():
    state, app = _app()
    for path in ("/v1/models/model:predict", "/v1/models/model/versions/1:predict"):
        status, _, doc = asyncio.run(_exchange(app, path, b"", "application/json", method="GET"))
        assert (status, doc) == (405, {"error": "method (GET): not served here; see docs/serving.md"}), path


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("PUT", "/v1/models/model:predict", {"POST"}),
        ("OPTIONS", "/v2/health/ready", {"GET", "HEAD"}),
        ("PUT", "/predict", {"POST"}),
    ],
)
def test_a_405_says_in_its_allow_header_which_methods_the_path_takes(method, path, allow):
    state, app = _app()
    status, headers, doc = asyncio.run(_exchange(app, path, b"", "application/json", method=method))
    taken = set(headers.get("allow", "").split(", ")) - {""}  # Starlette lists them in no fixed order
    assert status == 405 and taken == allow and doc["error"].startswith(f"method ({method})"), headers


def test_an_unknown_path_is_named_cut_short_not_echoed_whole():
    state, app = _app()
    path = "/" + "a" * 100_000
    status, _, doc = asyncio.run(_exchange(app, path, b"", "application/json", method="GET"))
    assert status == 404 and doc["error"] == f"path (/{'a' * 79}): not served here; see docs/serving.md", doc["error"][
        :300
    ]


@pytest.mark.parametrize(
    "doc, named",
    [
        ({"parameters": 7}, "parameters (int)"),
        ({"inputs": [{"parameters": 7}]}, "inputs[0].parameters (int)"),
        ({"outputs": [{"name": "probabilities", "parameters": 7}]}, "outputs[0].parameters (int)"),
    ],
)
def test_v2_parameters_that_are_no_object_are_named_by_where_they_are(doc, named):
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": [0, 0, 0, 0]}
    request = {**doc, "inputs": [{**tensor, **(doc.get("inputs") or [{}])[0]}]}
    ((status, answer),) = _serve([("/v2/models/model/infer", json.dumps(request).encode(), "application/json")])
    assert status == 400 and answer["error"].startswith(named + ": "), answer


@pytest.mark.parametrize(
    "doc, named",
    [
        ({"parameters": {"binary_data_output": "false"}}, "parameters.binary_data_output (false)"),
        ({"parameters": {"binary_data_output": 1}}, "parameters.binary_data_output (1)"),
        (
            {"outputs": [{"name": "probabilities", "parameters": {"binary_data": "no"}}]},
            "outputs[0].parameters.binary_data (no)",
        ),
    ],
)
def test_v2_binary_flags_that_are_no_boolean_are_a_400_not_taken_as_true(doc, named):
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": [0, 0, 0, 0]}
    request = {**doc, "inputs": [tensor]}
    ((status, answer),) = _serve([("/v2/models/model/infer", json.dumps(request).encode(), "application/json")])
    assert status == 400 and answer["error"] == f"{named}: true or false (a JSON boolean)", answer


@pytest.mark.parametrize(
    "request_id, answered", [("r-1", 200), (None, 200), (7, 400), ({"a": 1}, 400), ([], 400), (0, 400)]
)
def test_a_v2_id_is_a_string_echoed_back_anything_else_a_400(request_id, answered):
    """The protocol's id is a string a client matches answers by: a number or an object was echoed back."""
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": [0, 0, 0, 0]}
    request = json.dumps({"id": request_id, "inputs": [tensor]}).encode()
    ((status, answer),) = _serve([("/v2/models/model/infer", request, "application/json")])
    assert status == answered, answer
    if answered == 200:
        assert answer.get("id") == request_id  # null: as if left out
    else:
        assert answer["error"] == f"id ({json.dumps(request_id)}): a string, or left out", answer


def test_a_client_gone_mid_body_is_one_log_line_without_a_traceback_and_the_server_goes_on(caplog):
    state, app = _app()
    body = json.dumps({"instances": [np.zeros((2, 2, 1), int).tolist()]}).encode()

    async def scenario():
        gone = await _exchange(app, "/v1/models/model:predict", body, "application/json", cut_short=True)
        return gone[0], (await _send(app, "/v1/models/model:predict", body, "application/json"))[0]

    with caplog.at_level("INFO", logger="train"):
        gone_status, status = asyncio.run(_with_batcher(state, scenario))
    assert (gone_status, status) == (400, 200)  # 400 in uvicorn's access line: no one reads it
    gone = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert gone == ["POST /v1/models/model:predict: the client went away before sending its whole body"]
    assert not any(r.exc_info for r in caplog.records), caplog.text


def test_a_client_that_stops_sending_its_body_is_answered_408_and_let_go(monkeypatch):
    """It held its connection and the bytes it sent for as long as it liked, and a SIGTERM's whole drain."""
    from train.serve import app as app_module

    monkeypatch.setattr(app_module, "BODY_IDLE_SECONDS", 0.2)
    monkeypatch.setattr(app_module, "BODY_MIN_RATE", 1e-9)  # the pause alone, not the rate: it sent 20 bytes at once
    state, app = _app()
    body = json.dumps({"instances": [np.zeros((2, 2, 1), int).tolist()]}).encode()
    stalled = _exchange(app, "/v1/models/model:predict", body, "application/json", stall=True)
    status, _, answer = asyncio.run(_with_batcher(state, lambda: stalled))
    assert status == 408, answer
    assert answer["error"] == (
        f"body ({len(body) // 2} bytes): no byte came for 0.2 s; send the whole body without pausing"
    ), answer


def test_a_client_that_sends_its_body_a_byte_now_and_then_is_answered_408(monkeypatch):
    """A byte within each pause allowed held a large body's reading slot as long as the client liked."""
    from train.serve import app as app_module

    monkeypatch.setattr(app_module, "BODY_IDLE_SECONDS", 1.0)
    monkeypatch.setattr(app_module, "BODY_MIN_RATE", 1000)  # the client: 20 bytes a second
    state, app = _app()
    body = json.dumps({"instances": [np.zeros((2, 2, 1), int).tolist()]}).encode()
    slow = _exchange(app, "/v1/models/model:predict", body, "application/json", trickle=0.05)
    status, _, answer = asyncio.run(_with_batcher(state, lambda: slow))
    assert status == 408, answer
    assert re.fullmatch(
        r"body \(\d+ bytes\): it came at under 1 kB/s past its first 1 s; send the whole body without pausing",
        answer["error"],
    ), answer


def test_v2_classification_output_is_a_400_naming_it_not_ignored():
    """Triton's top-k-as-text output parameter: refused, rather than answered as if it were not asked for."""
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": [0, 0, 0, 0]}
    request = {"inputs": [tensor], "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}]}
    ((status, answer),) = _serve([("/v2/models/model/infer", json.dumps(request).encode(), "application/json")])
    assert status == 400 and answer["error"] == (
        'outputs[0].parameters.classification (3): not supported here: ask for "probabilities" and take the top '
        "classes from its probabilities"
    ), answer


@pytest.mark.parametrize(
    "pixel, says",
    [
        (300, "pixels outside 0..255"),
        (10**30, "pixels outside 0..255"),  # beyond int64: not "mixed values"
        (0.5, "holds floats"),
        ("a", "holds strings"),
    ],
)
def test_v1_pixels_that_are_no_uint8_are_a_400_saying_what_they_are(pixel, says):
    image = [[[0], [0]], [[0], [pixel]]]
    ((status, answer),) = _serve(
        [("/v1/models/model:predict", json.dumps({"instances": [image]}).encode(), "application/json")]
    )
    assert status == 400 and says in answer["error"], answer


def test_an_image_within_a_raised_serve_max_pixels_is_decoded_whatever_max_image_pixels_default_is():
    """SERVE_MAX_PIXELS bounds the request; a raised one let an 8000x8000 image through to the decoder,
    which refused it at MAX_IMAGE_PIXELS's default (50,000,000), a setting serve does not read."""
    import struct
    import zlib

    from train.serve.payloads import image_file

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 8000, 8000, 8, 0, 0, 0, 0)  # 64 million grayscale pixels, all zero
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 8001 * 8000))
    image = image_file(png + chunk(b"IEND", b""), (2, 2, 1), "file 0")
    assert image.shape == (2, 2, 1) and not image.any()


# -- the model a path names, and the body's limits -------------------------------------------------------
def _get(state, app, path: str) -> tuple[int, dict, dict]:
    return asyncio.run(_exchange(app, path, b"", "application/json", method="GET"))


def test_status_and_metadata_answer_for_the_model_and_its_one_version():
    state, app = _app()
    loading = {"version": "1", "state": "LOADING", "status": {"error_code": "OK", "error_message": ""}}
    assert _get(state, app, "/v1/models/model")[::2] == (200, {"model_version_status": [loading]})
    assert _get(state, app, "/v2/models/model/versions/1/ready")[::2] == (503, {"name": "model", "ready": False})
    assert _get(state, app, "/v2/health/ready")[::2] == (503, {"ready": False})
    state.batcher = Batcher(state.model.run, 4, 0)  # ready (never started: these calls do not run the model)
    available = {**loading, "state": "AVAILABLE"}
    assert _get(state, app, "/v1/models/model/versions/1")[::2] == (200, {"model_version_status": [available]})
    assert _get(state, app, "/v2/models/model/ready")[::2] == (200, {"name": "model", "ready": True})
    assert _get(state, app, "/v2/health/ready")[::2] == (200, {"ready": True})
    assert _get(state, app, "/v2/health/live")[::2] == (200, {"live": True})
    from train import __version__

    server = {"name": "train-serve", "version": __version__, "extensions": ["binary_tensor_data"]}
    assert _get(state, app, "/v2")[::2] == (200, server)
    assert _get(state, app, "/v2/models/model")[::2] == (
        200,
        {
            "name": "model",
            "versions": ["1"],
            "platform": "tensorflow_savedmodel",
            "inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, 2, 2, 1]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}],
        },
    )

    def tensor(name, dtype, dims):
        return {
            "dtype": dtype,
            "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False},
            "name": name,
        }

    signature = {
        "inputs": {"images": tensor("serving_default_images:0", "DT_UINT8", [-1, 2, 2, 1])},
        "outputs": {"probabilities": tensor("StatefulPartitionedCall:0", "DT_FLOAT", [-1, 2])},
        "method_name": "tensorflow/serving/predict",
    }
    assert _get(state, app, "/v1/models/model/versions/1/metadata")[::2] == (
        200,
        {
            "model_spec": {"name": "model", "signature_name": "", "version": "1"},
            "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}},
        },
    )


MODEL_PATHS = [
    ("GET", "/v1/models/{}"),
    ("GET", "/v1/models/{}/metadata"),
    ("POST", "/v1/models/{}:predict"),
    ("GET", "/v2/models/{}"),
    ("GET", "/v2/models/{}/ready"),
    ("POST", "/v2/models/{}/infer"),
]


@pytest.mark.parametrize("method, path", MODEL_PATHS)
def test_another_model_or_version_is_a_404_naming_the_one_served(method, path):
    state, app = _app()
    state.batcher = Batcher(state.model.run, 4, 0)  # ready: the name is checked first all the same
    status, headers, doc = asyncio.run(_exchange(app, path.format("other"), b"{}", "application/json", method=method))
    assert (status, doc) == (404, {"error": 'model (other): not served here; the model is "model"'})
    versioned = path.format("model/versions/2")
    status, headers, doc = asyncio.run(_exchange(app, versioned, b"{}", "application/json", method=method))
    assert (status, doc) == (404, {"error": "version (2): not served here; the one version is 1"})
    assert "retry-after" not in headers


@pytest.mark.parametrize("method, path", [*MODEL_PATHS[1:4], MODEL_PATHS[5], ("POST", "/predict")])
def test_before_the_model_is_ready_its_endpoints_answer_503_without_reading_the_body(method, path):
    state, app = _app()
    asked: list[str] = []
    status, headers, doc = asyncio.run(
        _exchange(app, path.format("model"), b"{}", "application/json", method=method, asked=asked)
    )
    assert (status, doc) == (503, {"error": "model (model): still loading; retry when /v2/health/ready answers 200"})
    assert "retry-after" not in headers and asked == []


def _read(body: bytes, max_body: int, **kwargs) -> tuple[int, dict, dict]:
    """One plain upload of `body` to a ready app whose SERVE_MAX_BODY_MB is `max_body` bytes."""
    state, app = _app()
    state.max_body = max_body
    return asyncio.run(_with_batcher(state, lambda: _exchange(app, "/predict", body, "image/png", **kwargs)))


def test_a_body_up_to_the_limit_is_read_one_byte_more_is_a_413_before_or_while_it_is_read():
    png = _png()
    for length in ("", None):  # declared, or chunked
        status, _, doc = _read(png, len(png), length=length)
        assert status == 200 and doc["predictions"][0]["file"] == "body", doc
    fix = "the limit is SERVE_MAX_BODY_MB (0.0012 MB); send fewer or smaller images"
    asked: list[str] = []
    status, _, doc = _read(png + b"\0" * (1201 - len(png)), 1200, asked=asked)
    assert (status, doc, asked) == (413, {"error": f"body (1201 bytes): {fix}"}, [])
    status, _, doc = _read(png + b"\0" * (1201 - len(png)), 1200, length=None)
    assert (status, doc) == (413, {"error": f"body (over 1200 bytes): {fix}"})


@pytest.mark.parametrize("length", ["-5", "12abc", "1e3"])
def test_a_content_length_that_is_no_number_is_not_trusted_and_the_body_is_counted(length):
    png = _png()
    status, _, doc = _read(png, len(png), length=length)
    assert status == 200 and doc["predictions"][0]["file"] == "body", doc
    status, _, doc = _read(png + b"\0", len(png), length=length)
    fix = f"the limit is SERVE_MAX_BODY_MB ({len(png) / 1e6:g} MB); send fewer or smaller images"
    assert (status, doc) == (413, {"error": f"body (over {len(png)} bytes): {fix}"})


def test_only_a_body_over_light_bytes_waits_for_a_reading_slot():
    """Every reading slot and place in line held: a body of LIGHT_BYTES is still read (and refused as no
    image), one byte more is refused 503: unread when it declares its length, once past LIGHT_BYTES when
    chunked."""
    from train.serve.work import LIGHT_BYTES

    state, app = _app()
    lane = state.decoder.reading

    async def scenario():
        go = asyncio.Event()

        async def hold():
            async with lane.slot():
                await go.wait()

        held = [asyncio.ensure_future(hold()) for _ in range(2 * lane.limit)]
        while lane._waiting < lane.limit:
            await asyncio.sleep(0.01)
        answers = []
        try:
            for size, length in (
                (LIGHT_BYTES, ""),
                (LIGHT_BYTES, None),
                (LIGHT_BYTES + 1, ""),
                (LIGHT_BYTES + 1, None),
            ):
                asked: list[str] = []
                status, headers, doc = await _exchange(
                    app, "/predict", b"0" * size, "application/octet-stream", asked=asked, length=length
                )
                answers.append((status, headers.get("retry-after"), doc, len(asked)))
        finally:
            go.set()
            await asyncio.gather(*held)
        return answers

    no_image = {"error": "body: not an image the model reads (send JPEG, PNG, GIF (first frame) or BMP)"}
    busy = {"error": "server: busy with large requests (over 1 MB or 4 million pixels); retry in a second"}
    assert asyncio.run(_with_batcher(state, scenario)) == [
        (400, None, no_image, 1),
        (400, None, no_image, 1),
        (503, "1", busy, 0),
        (503, "1", busy, 1),
    ]


def _read_in_chunks(state, chunks: list[bytes], length: int | None = None):
    """read_body of a request whose body comes in `chunks`: (the body or the refusal's (message, status),
    the reading slots it took)."""
    from starlette.requests import Request

    from train.serve.app import read_body
    from train.serve.payloads import RequestError

    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/predict", "headers": headers, "query_string": b""}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    taken, slot = [], state.decoder.reading.slot

    def counted():
        taken.append(1)
        assert len(taken) == 1, "a second reading slot for the same body"  # would wait for itself
        return slot()

    state.decoder.reading.slot = counted

    async def read():
        try:
            return await read_body(state, Request(scope, receive))
        except RequestError as exc:
            return str(exc), exc.status

    return asyncio.run(read()), len(taken)


def test_a_large_body_in_many_chunks_takes_one_reading_slot_whether_its_length_is_declared_or_not():
    from train.serve.work import LIGHT_BYTES

    chunks = [b"0" * LIGHT_BYTES] * 3
    for length in (None, 3 * LIGHT_BYTES):
        body, slots = _read_in_chunks(_app()[0], chunks, length)
        assert (len(body), slots) == (3 * LIGHT_BYTES, 1)


def test_a_body_over_the_limit_in_small_chunks_is_refused_once_their_sum_passes_it():
    state, _ = _app()
    state.max_body = 100
    assert _read_in_chunks(state, [b"0" * 60] * 3) == (
        ("body (over 100 bytes): the limit is SERVE_MAX_BODY_MB (0.0001 MB); send fewer or smaller images", 413),
        0,
    )


# -- each answer whole, and a failure's -------------------------------------------------------------------
@pytest.mark.parametrize(
    "message, shown",
    [("", ""), ("\n  out of memory\nmore lines", "out of memory"), ("x" * 300, "x" * 200)],
)
def test_a_failing_model_call_names_the_first_line_of_its_error_cut_to_200_characters_and_logs_the_traceback(
    message, shown, caplog
):
    def run(batch):
        raise RuntimeError(message)

    model = ServedModel("model", None, "run", ["a", "b"], (2, 2, 1), run)
    state = State(model, max_batch=4, max_wait_ms=0, max_body=10_000, max_pixels=1_000_000)
    request = {"instances": [np.zeros((2, 2, 1), int).tolist()]}
    with caplog.at_level("ERROR", logger="train"):
        status, doc = asyncio.run(
            _with_batcher(state, lambda: _call(build_app(state), "/v1/models/model:predict", request))
        )
    error = f"the server failed on this request (RuntimeError: {shown}); its log has the traceback"
    assert (status, doc) == (500, {"error": error})
    logged = [(r.getMessage(), r.exc_info[0]) for r in caplog.records if r.name == "train"]
    assert logged == [("POST /v1/models/model:predict failed", RuntimeError)]


def test_each_protocol_answers_its_whole_document_with_its_content_type():
    """Rows or columns as asked (TF Serving), binary outputs with their header length (v2), and /predict's
    rows naming the likeliest class, for an upload of files or one image file sent with no Content-Type."""
    state, app = _app(probs=(0.25, 0.75))
    image = np.zeros((2, 2, 1), int).tolist()
    tensor = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": [0, 0, 0, 0]}
    binary = {"inputs": [tensor], "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}
    form, form_type = _multipart([("file", "a.png", _png())])
    requests = [
        ("/v1/models/model:predict", json.dumps({"instances": [image]}).encode(), "application/json"),
        ("/v1/models/model:predict", json.dumps({"inputs": [image]}).encode(), "application/json"),
        ("/v2/models/model/infer", json.dumps({"inputs": [tensor]}).encode(), "application/json"),
        ("/v2/models/model/infer", json.dumps(binary).encode(), "application/json"),
        ("/predict", form, form_type),
        ("/predict", _png(), None),
    ]

    async def scenario():
        return [await _exchange(app, *r, raw=True) for r in requests]

    answers = asyncio.run(_with_batcher(state, scenario))
    assert [status for status, _, _ in answers] == [200] * 6, answers
    types = [headers["content-type"] for _, headers, _ in answers]
    assert types == ["application/json"] * 3 + ["application/octet-stream"] + ["application/json"] * 2
    docs = [json.loads(body) for _, _, body in answers[:3]]
    assert docs[0] == {"predictions": [[0.25, 0.75]]} and docs[1] == {"outputs": [[0.25, 0.75]]}
    assert docs[2]["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}]
    _, headers, body = answers[3]
    head = int(headers["inference-header-content-length"])
    assert np.frombuffer(body[head:], "<f4").tolist() == [0.25, 0.75]
    row = {"class": "b", "index": 1, "probability": 0.75, "probabilities": {"a": 0.25, "b": 0.75}}
    assert json.loads(answers[4][2]) == {"predictions": [{"file": "a.png", **row}]}
    assert json.loads(answers[5][2]) == {"predictions": [{"file": "body", **row}]}


# -- the drain: each request in flight is known, and answered 503 once cut off ----------------------------
def _scope(path: str = "/v2/health/live") -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
    }


def test_a_request_is_in_flight_while_it_is_answered_and_no_longer_once_answered():
    state, app = _app()
    seen = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        seen.append(state.in_flight == {asyncio.current_task()})

    asyncio.run(app(_scope(), receive, send))
    assert seen == [True, True] and state.in_flight == set()


def test_a_lifespan_passes_the_drain_to_starlette_and_is_no_request_in_flight():
    """serve runs its model's loading in the app's lifespan: the drain must hand it on untouched."""
    state, app = _app()
    events, sent, in_flight = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}], [], []

    async def receive():
        in_flight.append(len(state.in_flight))
        return events.pop(0)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"] and in_flight == [0, 0]


@pytest.mark.parametrize("held", ["http.response.start", "http.response.body"])
def test_a_request_cut_off_while_its_answer_waits_for_the_client_gets_a_503_only_if_none_was_started(held):
    """uvicorn's send waits while the client reads nothing before it writes anything: cut off there, the
    answer's start was never written and the 503 is, but a body cut off after its start gets no second start."""
    state, app = _app()
    written: list[dict] = []

    async def scenario():
        waiting, once = asyncio.Event(), []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            if message["type"] == held and not once:
                once.append(message)
                waiting.set()
                await asyncio.Event().wait()  # the client reads nothing: cancelled here by the cut-off
            written.append(message)

        task = asyncio.create_task(app(_scope(), receive, send))
        await waiting.wait()
        assert state.in_flight == {task}  # else the cut-off below reaches nothing and this waits for good
        state.cut_off()
        await task  # answered, not cancelled: the drain ends the cancellation

    asyncio.run(scenario())
    starts = [(m["status"], dict(m["headers"])) for m in written if m["type"] == "http.response.start"]
    if held == "http.response.body":
        assert [status for status, _ in starts] == [200] and len(written) == 1, written
        return
    error = b'{"error":"server: stopping before this request was done; send it again (to another replica)"}'
    assert [(status, headers[b"retry-after"]) for status, headers in starts] == [(503, b"1")], written
    assert written[1] == {"type": "http.response.body", "body": error}
