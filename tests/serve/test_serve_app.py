"""The app in-process (plain ASGI calls, no sockets): a model call that fails answers 500 as JSON and
the next request is served."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from train.serve.app import State, build_app
from train.serve.batcher import Batcher
from train.serve.model import ServedModel


async def _call(app, path: str, doc) -> tuple[int, dict]:
    body = json.dumps(doc).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8501),
    }
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


def test_a_failing_model_call_is_a_json_500_and_the_server_goes_on():
    calls = []

    def run(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("out of memory\nmore lines")
        return np.tile([0.25, 0.75], (len(batch), 1)).astype(np.float32)

    model = ServedModel("model", None, "run", ["a", "b"], (2, 2, 1), run)
    state = State(model, max_batch=4, max_wait_ms=0, max_body=10_000)
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
