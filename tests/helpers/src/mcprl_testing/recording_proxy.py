"""A pass-through HTTP proxy in front of a real engine that keeps what went by: every
completion (the exact prompt ids, the token ids and log-probs the engine answered) and every
adapter load, with their times. Tests compare what the trainer trained on with what the
engine really returned, and which adapter it served when, without trusting the trainer's
own records; ``Recording.hold`` makes the engine slow on demand."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Exchange:
    path: str
    request: Any  # the JSON body (None when there was none)
    response: Any  # the JSON answer (None when not JSON)
    status: int
    started: float  # time.monotonic()
    ended: float


@dataclass
class Recording:
    exchanges: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # While set, completion requests wait in the proxy before going on (a slow engine).
    hold: threading.Event = field(default_factory=threading.Event)
    held: int = 0  # completion requests that waited

    def of(self, suffix: str) -> list[Exchange]:
        with self.lock:
            return [e for e in self.exchanges if e.path.endswith(suffix) and e.status == 200]


def recording_proxy(upstream_root: str) -> tuple[Starlette, Recording]:
    """An ASGI app forwarding every request to ``upstream_root`` (scheme://host:port)."""

    recording = Recording()
    client: dict[str, httpx.AsyncClient] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        client["c"] = httpx.AsyncClient(timeout=300)
        try:
            yield
        finally:
            await client["c"].aclose()

    async def forward(request: Request) -> Response:
        http = client["c"]
        body = await request.body()
        if recording.hold.is_set() and request.url.path.endswith("/completions"):
            recording.held += 1
            while recording.hold.is_set():  # noqa: ASYNC110 (set by the test's thread)
                await asyncio.sleep(0.05)
        started = time.monotonic()
        upstream = await http.request(
            request.method, f"{upstream_root}{request.url.path}",
            params=request.query_params, content=body,
            headers={k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS})
        ended = time.monotonic()
        try:
            answer = upstream.json()
        except ValueError:
            answer = None
        with recording.lock:
            recording.exchanges.append(Exchange(
                request.url.path, json.loads(body) if body else None, answer,
                upstream.status_code, started, ended))
        headers = {k: v for k, v in upstream.headers.items()
                   if k.lower() not in _HOP_HEADERS | {"content-encoding"}}
        return Response(upstream.content, upstream.status_code, headers=headers)

    methods = ["GET", "POST", "PUT", "DELETE"]
    app = Starlette(routes=[Route("/{path:path}", forward, methods=methods)],
                    lifespan=lifespan)
    return app, recording
