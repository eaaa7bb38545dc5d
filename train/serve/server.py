"""Run the app on uvicorn: the port bound first, the model loaded after, a drain on SIGTERM.

The socket is bound before anything loads, so a port in use fails at once (exit 2). The server
then answers /v2/health/live at once and /v2/health/ready with 503 until the model is loaded and
warmed up in a worker thread. SIGTERM, SIGINT or SIGHUP (the terminal of a `serve` started by hand
went away; under nohup it stays ignored) stops accepting connections and lets the requests
in flight finish for up to SERVE_DRAIN_SECONDS; those still running then are answered 503 (JSON), at
once on a second signal. The process then exits 0, what `docker stop` and Kubernetes expect, without
waiting for a decode or a model call still running in a thread: none can be interrupted, and Python
would join their threads at exit for as long as they run. (uvicorn re-raises a caught signal after
its shutdown, which would end the process by that signal instead; this server does not.)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import threading

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ConfigError, TemplateError
from ..run.train_log import terminal_gone
from .address import bound_everywhere, url_host
from .app import State, build_app
from .batcher import Batcher
from .model import ServedModel
from .work import Pool

log = logging.getLogger("train")
BACKSTOP = 5  # seconds past the drain before uvicorn cancels what our cut-off did not end (a stuck send)
HEADERS_SECONDS = 30.0  # a request's headers come whole within this long of the connection or their first byte
LINGER_SECONDS = 30.0  # answered before its body was read: the rest may come this long, then the connection closes


class _Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with two waits bounded that uvicorn leaves without end (its
    keep-alive timeout starts only after a response, and stops at the next byte):
    - a request's headers must come whole within HEADERS_SECONDS, else the connection is closed: a
      client that connects and sends nothing, or a byte now and then, would hold its connection and
      file descriptor as long as it likes. (No answer is sent: HTTP has none before a request's headers.)
    - a request answered before its body was read (a 404, a 413 by Content-Length, a 503 before the
      model is ready) has the rest of its body read and dropped for LINGER_SECONDS at most, as nginx's
      lingering close does, then the connection is closed: a client trickling the rest held it. Closing
      at once instead would drop the answer of a client still uploading (a reset before it reads it).
      A request that asked to close (`Connection: close`, as urllib sends, or HTTP/1.0), which uvicorn
      closes at once after its answer, lingers too: its body's rest is dropped unread until the
      client closes, stays silent for uvicorn's keep-alive timeout, or LINGER_SECONDS have passed.
    The body's own wait, in a request that reads it, is the app's 408."""

    _late: asyncio.TimerHandle | None = None
    _linger: asyncio.TimerHandle | None = None
    _dropping = False  # answered, closing: what the client still sends is dropped unread

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            self._unset_keepalive_if_required()  # still sending: uvicorn's idle timeout is for silence
            return
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's headers begun, not yet whole
            self._await_headers()
        elif self._late is not None:
            self._late.cancel()
            self._late = None

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a new request: uvicorn's close after its answer goes through ours
            self.cycle.transport = _ClosedByAnswer(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._body_unread() and not self.transport.is_closing():
            self._linger_then(self._linger_over)

    def connection_lost(self, exc) -> None:
        for timer in (self._late, self._linger):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self._late is None:
            self._late = self.loop.call_later(HEADERS_SECONDS, self._headers_late)

    def _headers_late(self) -> None:
        self._late = None
        if self.conn.their_state is h11.IDLE:
            self.transport.close()

    def _linger_then(self, callback) -> None:
        """`callback` LINGER_SECONDS from now, in place of any linger still pending on this connection."""
        if self._linger is not None:
            self._linger.cancel()
        self._linger = self.loop.call_later(LINGER_SECONDS, callback)

    def _body_unread(self) -> bool:
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY

    def _linger_over(self) -> None:
        self._linger = None
        if self._body_unread():  # else the rest came in time: the connection lives on
            self.transport.close()

    def close_after_answer(self) -> None:
        """uvicorn closing once an answer is sent: at once, unless the client is still sending the body
        of a request that asked to close. (Not when the server stops, its `keep_alive` then off, nor
        when the app's answer closes a request that kept alive: a 408's client is trickling.)"""
        still_sending = self.conn.their_state is h11.SEND_BODY and self.cycle.response_complete
        asked = still_sending and self.cycle.keep_alive and _asked_to_close(self.cycle.scope)
        if asked and not self.transport.is_closing():
            self._dropping = True
            self._linger_then(self.transport.close)
        else:
            self.transport.close()


def _asked_to_close(scope) -> bool:
    """The request's own `Connection: close`, or HTTP/1.0 (h11 keeps no HTTP/1.0 connection open)."""
    tokens = b",".join(value for name, value in scope["headers"] if name == b"connection").lower().split(b",")
    return scope["http_version"] == "1.0" or b"close" in (token.strip() for token in tokens)


class _ClosedByAnswer:
    """The transport as a request's cycle holds it: its close is _Protocol.close_after_answer."""

    def __init__(self, protocol: _Protocol):
        self._protocol = protocol

    def close(self) -> None:
        self._protocol.close_after_answer()

    def __getattr__(self, name: str):
        return getattr(self._protocol.transport, name)


class _Server(uvicorn.Server):
    """uvicorn's server with this module's drain: the first signal starts it and sets the cut-off
    SERVE_DRAIN_SECONDS later, a second one cuts off at once; neither is re-raised afterwards."""

    def __init__(self, config: uvicorn.Config, state: State, drain: float):
        super().__init__(config)
        self.state, self.drain = state, drain
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the app's shutdown when forced; the event loop's end would then cancel it
            # with a traceback. Ours waits for nothing (the batcher's call is not waited for).
            await self.lifespan.shutdown()

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn's own are SIGINT and SIGTERM. Without SIGHUP, an SSH connection that drops kills a
        # `serve` started by hand at once, the requests in flight cut off; nohup's SIG_IGN is kept. Only
        # the main thread may set a handler: run in another, uvicorn sets none, and neither does this.
        with super().capture_signals():
            elsewhere = threading.current_thread() is not threading.main_thread()
            if elsewhere or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)

    def handle_exit(self, sig, frame) -> None:
        # A signal handler: the loop is reached through its thread-safe door, and logs from there.
        if sig == signal.SIGHUP:
            terminal_gone()  # every write to a terminal that hung up fails: the drain's lines go nowhere
        second = self.should_exit
        self.force_exit = self.force_exit or second
        self.should_exit = True
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop, second)

    def _stop(self, second: bool) -> None:
        if second:
            self.state.cut_off()
            return
        log.info("stopping: requests in flight get up to %g s (a second signal stops at once)", self.drain)
        self.loop.call_later(self.drain, self.state.cut_off)


def bind(host: str, port: int) -> socket.socket:
    """A socket listening on `host`, an address as listen_address gives it (the command checked --host), and `port`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without
    # it a response's second small write waits for the client's delayed ACK (about 40 ms a request).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                "--port", port, f"in use on {host} by another process: stop it or give another --port"
            ) from None
        raise ConfigError(
            "--host", host, f"cannot listen there ({exc.strerror}): give an address of this host"
        ) from None
    if bound_everywhere(host, sock.getsockname()[0]):
        sock.close()
        raise ConfigError(
            "--host", host, "its address is every interface (0.0.0.0 or ::): give 0.0.0.0 or :: itself if that is meant"
        )
    sock.listen(2048)  # connections wait in the backlog from now on, never refused while uvicorn starts
    return sock


def serve(model: ServedModel, host: str, port: int, settings) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean drain, the error's exit code when the model fails to load."""
    sock = bind(host, port)
    body = int(settings.serve_max_body_mb * 1e6)
    state = State(model, settings.serve_max_batch, settings.serve_max_wait_ms, body, settings.serve_max_pixels)
    failed: list[TemplateError] = []
    loader = Pool(1, "load")
    server: _Server

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loading = asyncio.get_running_loop().create_task(_load(state, server, loader, failed))
        log.info(
            "serving on http://%s:%d (model %s; ready once loaded)", url_host(host), sock.getsockname()[1], model.name
        )
        yield
        loading.cancel()
        if state.batcher is not None:
            await state.batcher.stop()
        state.decoder.shutdown()
        loader.shutdown()

    app = build_app(state)
    app.router.lifespan_context = lifespan
    drain = settings.serve_drain_seconds
    config = uvicorn.Config(
        app,
        log_level="info",
        log_config=None,  # uvicorn's lines go through the root handler serve set up: one format, not two
        timeout_graceful_shutdown=drain + BACKSTOP,
        access_log=False,
        lifespan="on",
        server_header=False,
        http=_Protocol,
    )
    server = _Server(config, state, drain)
    server.run(sockets=[sock])
    if failed:
        raise failed[0]
    running = state.running() + loader.running
    if running:
        log.info("stopped; not waiting for %d call(s) still running in worker threads (decoding or the model)", running)
        sys.stderr.flush()
        os._exit(0)  # sys.exit would join those threads for as long as they run
    return 0


async def _load(state: State, server: _Server, loader: Pool, failed: list) -> None:
    try:
        await loader.run(state.model.load, state.max_batch)
    except TemplateError as exc:
        failed.append(exc)
        server.should_exit = True
        return
    batcher = Batcher(state.model.run, state.max_batch, state.max_wait_ms / 1000)
    batcher.start()
    state.batcher = batcher
    log.info("ready: batches of up to %d images, waiting up to %g ms", state.max_batch, state.max_wait_ms)
