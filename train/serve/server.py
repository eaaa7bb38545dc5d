"""Run the app on uvicorn: the port bound first, the model loaded after, a drain on SIGTERM.

The socket is bound before anything loads, so a port in use fails at once (exit 2). The server
then answers /v2/health/live at once and /v2/health/ready with 503 until the model is loaded and
warmed up in a worker thread. SIGTERM or SIGINT stops accepting connections, lets the requests in
flight finish (up to GRACE seconds) and returns 0: what `docker stop` and Kubernetes expect.
(uvicorn re-raises a caught signal after its shutdown, which would end the process by that signal
instead; this server does not.)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket

import uvicorn

from ..errors import ConfigError, TemplateError
from .address import bound_everywhere, listen_address, url_host
from .app import State, build_app
from .batcher import Batcher
from .model import ServedModel

log = logging.getLogger("train")
GRACE = 30  # seconds the requests in flight get after SIGTERM (Kubernetes' default grace period is 30)


class _Server(uvicorn.Server):
    def handle_exit(self, sig, frame) -> None:
        # A second signal forces the exit, as uvicorn does; neither is re-raised afterwards.
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    host = listen_address(host)  # never every interface by an empty or shorthand value
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
    host = listen_address(host)
    sock = bind(host, port)
    body = int(settings.serve_max_body_mb * 1e6)
    state = State(model, settings.serve_max_batch, settings.serve_max_wait_ms, body, settings.serve_max_pixels)
    failed: list[TemplateError] = []
    server: _Server

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loading = asyncio.get_running_loop().create_task(_load(state, server, failed))
        log.info(
            "serving on http://%s:%d (model %s; ready once loaded)", url_host(host), sock.getsockname()[1], model.name
        )
        yield
        loading.cancel()
        if state.batcher is not None:
            await state.batcher.stop()

    app = build_app(state)
    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app, log_level="info", timeout_graceful_shutdown=GRACE, access_log=False, lifespan="on", server_header=False
    )
    server = _Server(config)
    server.run(sockets=[sock])
    if failed:
        raise failed[0]
    return 0


async def _load(state: State, server: _Server, failed: list) -> None:
    try:
        await asyncio.to_thread(state.model.load, state.max_batch)
    except TemplateError as exc:
        failed.append(exc)
        server.should_exit = True
        return
    batcher = Batcher(state.model.run, state.max_batch, state.max_wait_ms / 1000)
    batcher.start()
    state.batcher = batcher
    log.info("ready: batches of up to %d images, waiting up to %g ms", state.max_batch, state.max_wait_ms)
