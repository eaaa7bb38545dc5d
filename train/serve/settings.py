"""The serve extra's settings (`python -m train serve`): batching and the request size."""

from __future__ import annotations

from dataclasses import dataclass

from ..sections import setting


@dataclass(frozen=True)
class Section:
    """serving an export (`python -m train serve`; docs/serving.md)"""

    serve_max_batch: int = setting(
        32,
        "serve: the most images gathered into one model call (1: no batching); a larger request is refused",
        min=1,
        max=4096,
        kind="invocation",
    )
    serve_max_wait_ms: float = setting(
        5.0,
        "serve: how long the first request of a batch waits for others to join it, in milliseconds",
        min=0.0,
        max=10000.0,
        kind="invocation",
    )
    serve_max_body_mb: float = setting(
        16.0,
        "serve: the largest request body accepted, in MB; a larger one is refused with 413 before it is read",
        min=0.001,
        max=4096.0,
        kind="invocation",
    )
    serve_max_pixels: int = setting(
        50_000_000,
        "serve: the most pixels the image files of one request may declare in all (decoding costs time and "
        "memory by the pixel); a request over it is refused with 413 before any image is decoded",
        min=1,
        max=2_000_000_000,
        kind="invocation",
    )
    serve_drain_seconds: float = setting(
        30.0,
        "serve: after SIGTERM, how long the requests in flight get to finish; those still running are then "
        "answered 503 and the server exits (keep it under the orchestrator's grace period)",
        min=0.0,
        max=3600.0,
        kind="invocation",
    )
