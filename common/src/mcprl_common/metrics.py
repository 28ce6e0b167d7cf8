"""Prometheus helpers: a registry per app (so tests can build many apps in one process),
HTTP request metrics as middleware, and the ``/metrics`` response.

Names follow Prometheus conventions: the ``mcprl_`` prefix, base units (seconds, bytes) and
``_total`` on counters (prometheus-client appends it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class HttpMetricsMiddleware:
    """Counts requests and times them by route template and status (pure ASGI, streams safe)."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry, service: str) -> None:
        self.app = app
        self.service = service
        self.requests = Counter(
            "mcprl_http_requests",
            "HTTP requests served, by route and status code.",
            ["service", "method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "mcprl_http_request_duration_seconds",
            "HTTP request latency until the response started, by route.",
            ["service", "method", "route"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def _send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or _collapse(scope.get("path", ""))
            method = scope.get("method", "GET")
            self.requests.labels(self.service, method, path, str(status["code"])).inc()
            self.latency.labels(self.service, method, path).observe(time.perf_counter() - start)


def _collapse(path: str) -> str:
    """Unmatched paths (404s, mounted sub-apps) share one label to keep cardinality bounded."""

    known = ("/mcp", "/sse", "/messages", "/metrics", "/healthz", "/health")
    for prefix in known:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix
    return "other"


HealthCheck = Callable[[], Awaitable[dict]]
