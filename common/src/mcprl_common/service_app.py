"""What every FastAPI service gets: error handlers, request metrics, ``/healthz``,
``/metrics``, and a uvicorn runner with graceful shutdown."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge

from mcprl_common.errors import install_error_handlers
from mcprl_common.logging import configure_logging
from mcprl_common.metrics import HttpMetricsMiddleware, metrics_response
from mcprl_common.process import KEEP_ALIVE_S, raise_open_files_limit
from mcprl_common.request_limits import (
    DEFAULT_MAX_BODY_BYTES,
    BodyLimitMiddleware,
    document_errors,
)
from mcprl_common.settings import ServiceSettings

HealthFn = Callable[[], Awaitable[dict[str, Any]]]
log = logging.getLogger(__name__)


def add_ops_routes(
    app: FastAPI,
    *,
    service: str,
    registry: CollectorRegistry,
    health: HealthFn | None = None,
    version: str = "0.1.0",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    jsonrpc_paths: tuple[str, ...] = (),
) -> None:
    """Install error handlers, HTTP metrics, a request body limit (413 above
    ``max_body_bytes``; a JSON-RPC error on ``jsonrpc_paths``), the error responses in the
    OpenAPI document, ``GET /healthz`` and ``GET /metrics``.

    ``health`` returns extra fields; raising or returning ``{"ok": False}`` makes the
    endpoint answer 503 so orchestrators (compose, Kubernetes) take the service out.
    """

    install_error_handlers(app)
    document_errors(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes,
                       jsonrpc_paths=jsonrpc_paths)
    app.add_middleware(HttpMetricsMiddleware, registry=registry, service=service)
    started = time.time()
    info = Gauge("mcprl_service_start_time_seconds", "Unix time the service started.",
                 ["service", "version"], registry=registry)
    info.labels(service, version).set(started)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "service": service, "version": version,
                                "uptime_s": round(time.time() - started, 3)}
        code = 200
        if health is not None:
            try:
                extra = await health()
            except Exception as exc:  # health must never raise to the client
                extra = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
            if extra.pop("ok", True) is False:
                body["status"], code = "unhealthy", 503
            body.update(extra)
        return JSONResponse(body, status_code=code)

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    async def metrics():
        return metrics_response(registry)


def run_service(app: Any, settings: ServiceSettings, service: str) -> None:
    """Serve ``app`` in the foreground; SIGINT/SIGTERM drain in-flight requests first."""

    configure_logging(service, settings.log_level, settings.log_json)
    raise_open_files_limit()  # one socket per client connection
    log.info("starting", extra={"host": settings.host, "port": settings.port})
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.graceful_shutdown_s) or None,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
    )
    uvicorn.Server(config).run()
