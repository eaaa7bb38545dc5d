"""The HTTP endpoints: TensorFlow Serving's REST API, the Open Inference Protocol and /predict.

One Starlette app around one ServedModel and its Batcher. Every refused request is a RequestError
answered as {"error": "..."} with its status (400, 404 for an unknown model or version, 413 for a
body over SERVE_MAX_BODY_MB or images over SERVE_MAX_PIXELS, 503 before the model is ready or
while the decoding threads, or the slots a large body is read in, are busy); the body is read in
chunks and refused as soon as it passes the limit, never read whole first. Parsing and image
decoding run in the Decoder's threads (train.serve.work), the model in the Batcher's: the event loop
only moves bytes. Every request in flight is known (Drain), so that when the server stops it can
answer each one as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import numpy as np
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from . import payloads
from .batcher import Batcher
from .model import ServedModel
from .payloads import RequestError
from .work import LIGHT_BYTES, Decoder

log = logging.getLogger("train")
VERSION = "1"  # an export is one model version; TF Serving numbers a single version 1 as well
# A client that stops sending its body (or never starts it) would hold its connection and the bytes it sent
# for as long as it likes, and a SIGTERM's whole drain: let go once no byte came for this long (408).
BODY_IDLE_SECONDS = 30.0
# Nor may it send a byte now and then: a large body holds one of few reading slots. As Apache's
# mod_reqtimeout does, each BODY_MIN_RATE bytes that came buy one more second past BODY_IDLE_SECONDS.
BODY_MIN_RATE = 50_000  # bytes a second: a 15 MB body may take 330 s


class _Segment(Convertor):
    """A model name or version in a path: no "/" and no ":", so that `GET .../model:predict` is the
    `:predict` route's 405, not a model named "model:predict"."""

    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("segment", _Segment())


class State:
    """What the endpoints share: the model, its batcher once ready, the limits."""

    def __init__(self, model: ServedModel, max_batch: int, max_wait_ms: float, max_body: int, max_pixels: int):
        self.model, self.max_batch, self.max_wait_ms, self.max_body = model, max_batch, max_wait_ms, max_body
        self.decoder = Decoder(max_pixels)
        self.batcher: Batcher | None = None  # set once the model is loaded and warmed up: ready from then on
        self.in_flight: set[asyncio.Task] = set()  # the requests being answered, each its own task
        self.stopping = False  # set when the drain's time is up: what is still in flight is answered 503

    def cut_off(self) -> None:
        """The drain's time is up (or a second signal came): each request in flight is answered 503 now,
        whatever it waits for (a decode, the model, the rest of its body)."""
        self.stopping = True
        if self.in_flight:
            log.info(
                "answering the %d request(s) still in flight with 503: the server is stopping", len(self.in_flight)
            )
        for task in list(self.in_flight):
            task.cancel()

    def running(self) -> int:
        """Calls still running in worker threads (decoding, the model), whatever became of their requests."""
        return self.decoder.running + (self.batcher.pool.running if self.batcher is not None else 0)

    @property
    def ready(self) -> bool:
        return self.batcher is not None


def _error_headers(exc: RequestError) -> dict[str, str]:
    """Retry-After for a refusal that passes with time (503). A 408 closes the connection (RFC 9110
    15.5.9): uvicorn would go on reading the rest of the body the client stalled or trickled, on the
    same connection and for as long as it sends (each byte stops uvicorn's keep-alive timer)."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    if exc.status == 408:
        headers["Connection"] = "close"
    return headers


def build_app(state: State) -> Starlette:
    def route(path, fn, methods=("GET",)):
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(state, request)
            except RequestError as exc:
                return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=_error_headers(exc))
            except ClientDisconnect:  # gone before its body was whole: no one to answer, nothing failed here
                log.info("%s %s: the client went away before sending its whole body", request.method, request.url.path)
                return Response(status_code=400)
            except Exception as exc:  # noqa: BLE001  (a failed model call: this request fails, the server lives on)
                log.exception("%s %s failed", request.method, request.url.path)
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                error = f"the server failed on this request ({type(exc).__name__}: {first}); its log has the traceback"
                return JSONResponse({"error": error}, status_code=500)

        return Route(path, endpoint, methods=list(methods))

    def both(path: str, suffix: str, endpoint, methods=("GET",)) -> list[Route]:
        # Each model route also answers under /versions/{version} (the one version there is).
        return [
            route(path + suffix, endpoint, methods),
            route(path + "/versions/{version:segment}" + suffix, endpoint, methods),
        ]

    v1, v2 = "/v1/models/{name:segment}", "/v2/models/{name:segment}"
    routes = [
        *both(v1, "", tf_status),
        *both(v1, "/metadata", tf_metadata),
        *both(v1, ":predict", tf_predict, ("POST",)),
        route("/v2", v2_server),
        route("/v2/health/live", v2_live),
        route("/v2/health/ready", v2_ready),
        *both(v2, "", v2_metadata),
        *both(v2, "/ready", v2_model_ready),
        *both(v2, "/infer", v2_infer, ("POST",)),
        route("/predict", plain_predict, ("POST",)),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Drain, state=state)])

    async def not_found(request, exc):
        # Starlette's own 404/405 answer as every other refusal: one JSON error. A 405 keeps the
        # Allow header Starlette gives it (HTTP requires it: what the path takes). The path is shown
        # as a RequestError shows a value, cut short: a URL of 100 KB is not echoed whole.
        status = exc.status_code  # Starlette's HTTPException: status_code and headers
        what = "method" if status == 405 else "path"
        value = request.method if status == 405 else request.url.path
        error = RequestError(what, value, "not served here; see docs/serving.md", status)
        return JSONResponse({"error": str(error)}, status_code=status, headers=exc.headers)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    return app


class Drain:
    """Each request in flight is registered in `state.in_flight` while it is answered. Cancelled by
    State.cut_off (or by the event loop's own end after a second signal), it answers 503 as JSON:
    never uvicorn's plain-text 500 and a CancelledError traceback in the log."""

    def __init__(self, app, state: State):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        task, started = asyncio.current_task(), False

        async def sending(message) -> None:
            nonlocal started
            await send(message)
            # Only once sent: uvicorn's send first waits while a client reads nothing, and a cancellation
            # there leaves the answer unstarted, to be answered 503 below (else uvicorn's plain-text 500).
            started = started or message["type"] == "http.response.start"

        self.state.in_flight.add(task)
        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if not self.state.stopping:
                raise
            task.uncancel()  # answered below: the cancellation ends here
            if not started:
                error = "server: stopping before this request was done; send it again (to another replica)"
                await JSONResponse({"error": error}, 503, {"Retry-After": "1"})(scope, receive, send)
        finally:
            self.state.in_flight.discard(task)


def _check_model(state: State, request: Request) -> ServedModel:
    name, version = request.path_params["name"], request.path_params.get("version", VERSION)
    if name != state.model.name:
        raise RequestError("model", name, f'not served here; the model is "{state.model.name}"', status=404)
    if version != VERSION:
        raise RequestError("version", version, f"not served here; the one version is {VERSION}", status=404)
    return state.model


def _require_ready(state: State) -> Batcher:
    if state.batcher is None:
        raise RequestError("model", state.model.name, "still loading; retry when /v2/health/ready answers 200", 503)
    return state.batcher


async def read_body(state: State, request: Request) -> bytes:
    """The body, refused with 413 once it passes the limit: by its Content-Length before reading, else while
    read. A heavy body is read in a slot of the decoder's `reading` lane (503 when none is free): taken by its
    Content-Length before a byte is read, or when a chunked body passes LIGHT_BYTES."""
    limit = state.max_body
    fix = f"the limit is SERVE_MAX_BODY_MB ({limit / 1e6:g} MB); send fewer or smaller images"
    declared = request.headers.get("content-length")
    declared = int(declared) if declared is not None and declared.isascii() and declared.isdigit() else None
    if declared is not None and declared > limit:
        raise RequestError("body", f"{declared} bytes", fix, status=413)
    async with contextlib.AsyncExitStack() as held:
        heavy = False
        if declared is not None and declared > LIGHT_BYTES:
            await held.enter_async_context(state.decoder.reading.slot())
            heavy = True
        chunks, size = [], 0
        stream = aiter(request.stream())
        clock = asyncio.get_running_loop().time
        start = clock()
        while True:
            wait = min(BODY_IDLE_SECONDS, max(start + BODY_IDLE_SECONDS + size / BODY_MIN_RATE - clock(), 0))
            try:
                chunk = await asyncio.wait_for(anext(stream), wait)
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                why = (
                    f"no byte came for {BODY_IDLE_SECONDS:g} s"
                    if wait == BODY_IDLE_SECONDS  # else the average rate's deadline came first
                    else f"it came at under {BODY_MIN_RATE / 1000:g} kB/s past its first {BODY_IDLE_SECONDS:g} s"
                )
                raise RequestError(
                    "body", f"{size} bytes", f"{why}; send the whole body without pausing", 408
                ) from None
            size += len(chunk)
            if size > limit:
                raise RequestError("body", f"over {limit} bytes", fix, status=413)
            chunks.append(chunk)
            if size > LIGHT_BYTES and not heavy:
                await held.enter_async_context(state.decoder.reading.slot())
                heavy = True
        return b"".join(chunks)


async def _predict(state: State, images: np.ndarray) -> np.ndarray:
    return await _require_ready(state).predict(images)


# --- TensorFlow Serving REST API ---


async def tf_status(state: State, request: Request) -> Response:
    _check_model(state, request)
    status = "AVAILABLE" if state.ready else "LOADING"
    return JSONResponse(
        {
            "model_version_status": [
                {"version": VERSION, "state": status, "status": {"error_code": "OK", "error_message": ""}}
            ]
        }
    )


async def tf_metadata(state: State, request: Request) -> Response:
    model = _check_model(state, request)
    _require_ready(state)

    def tensor(name, dtype, dims):
        shape = {"dim": [{"size": str(d), "name": ""} for d in dims], "unknown_rank": False}
        return {"dtype": dtype, "tensor_shape": shape, "name": name}

    signature = {
        "inputs": {payloads.INPUT: tensor(f"serving_default_{payloads.INPUT}:0", "DT_UINT8", [-1, *model.shape])},
        "outputs": {model.output_name: tensor("StatefulPartitionedCall:0", "DT_FLOAT", [-1, len(model.labels)])},
        "method_name": "tensorflow/serving/predict",
    }
    return JSONResponse(
        {
            "model_spec": {"name": model.name, "signature_name": "", "version": VERSION},
            "metadata": {"signature_def": {"signature_def": {"serving_default": signature}}},
        }
    )


async def tf_predict(state: State, request: Request) -> Response:
    model = _check_model(state, request)
    _require_ready(state)
    body = await read_body(state, request)
    images, columnar = await state.decoder.images(
        len(body),
        lambda: payloads.tf_serving_images(
            payloads.parse_json(body, model.shape, state.max_batch), model.shape, state.max_batch
        ),
    )
    probs = (await _predict(state, images)).tolist()
    return JSONResponse({"outputs": probs} if columnar else {"predictions": probs})


# --- Open Inference Protocol (KServe v2) ---


async def v2_server(state: State, request: Request) -> Response:
    return JSONResponse({"name": "train-serve", "version": __version__, "extensions": ["binary_tensor_data"]})


async def v2_live(state: State, request: Request) -> Response:
    return JSONResponse({"live": True})


async def v2_ready(state: State, request: Request) -> Response:
    return JSONResponse({"ready": state.ready}, status_code=200 if state.ready else 503)


async def v2_model_ready(state: State, request: Request) -> Response:
    model = _check_model(state, request)
    return JSONResponse({"name": model.name, "ready": state.ready}, status_code=200 if state.ready else 503)


async def v2_metadata(state: State, request: Request) -> Response:
    model = _check_model(state, request)
    _require_ready(state)
    return JSONResponse(
        {
            "name": model.name,
            "versions": [VERSION],
            "platform": "tensorflow_savedmodel",
            "inputs": [{"name": payloads.INPUT, "datatype": "UINT8", "shape": [-1, *model.shape]}],
            "outputs": [{"name": model.output_name, "datatype": "FP32", "shape": [-1, len(model.labels)]}],
        }
    )


async def v2_infer(state: State, request: Request) -> Response:
    model = _check_model(state, request)
    _require_ready(state)
    body = await read_body(state, request)
    header = request.headers.get("inference-header-content-length")
    images, meta = await state.decoder.images(
        len(body), lambda: payloads.v2_request(body, header, model.shape, model.output_name, state.max_batch)
    )
    content, headers = payloads.v2_response(model, await _predict(state, images), meta)
    return Response(content, headers=headers)


# --- plain upload ---


async def plain_predict(state: State, request: Request) -> Response:
    model = state.model
    _require_ready(state)
    body = await read_body(state, request)
    ctype = request.headers.get("content-type", "")
    images, names = await state.decoder.images(
        len(body), lambda: payloads.uploads(body, ctype, model.shape, state.max_batch)
    )
    probs = await _predict(state, images)
    rows = []
    for name, p in zip(names, probs):
        k = int(np.argmax(p))
        rows.append(
            {
                "file": name,
                "class": model.labels[k],
                "index": k,
                "probability": float(p[k]),
                "probabilities": {label: float(v) for label, v in zip(model.labels, p)},
            }
        )
    return Response(json.dumps({"predictions": rows}), media_type="application/json")
