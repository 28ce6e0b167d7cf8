"""``create_app(settings)``: one ASGI app serving the company-db MCP server over Streamable
HTTP (``/mcp``) and legacy SSE (``/sse`` + its ``/messages/`` endpoint) at the same time,
plus ``/healthz`` and ``/metrics``. Nothing is built at import time.

FastMCP builds one Starlette sub-app per transport (each with FastMCP's Host/Origin guard and
optional bearer auth); a FastAPI parent routes the MCP paths to them unchanged, owns the ops
routes (from mcprl_common) and runs both sub-apps' lifespans (FastMCP ref-counts its own).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import fastmcp
from fastapi import FastAPI
from fastmcp import FastMCP
from prometheus_client import Gauge
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mcprl_common.metrics import new_registry
from mcprl_common.service_app import add_ops_routes
from mcprl_mcp_server import __version__
from mcprl_mcp_server.auth import BearerTokenVerifier
from mcprl_mcp_server.db.readonly import Limits, ReadOnlyDatabase
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.metrics import McpMetrics, ToolMetricsMiddleware
from mcprl_mcp_server.settings import McpServerSettings
from mcprl_mcp_server.tools import CompanyTools

SERVICE = "mcp-server"
SERVER_NAME = "company-db"
MCP_PATH = "/mcp"
SSE_PATH = "/sse"
# One JSON-RPC message at most (a tool call's SQL is capped far lower, max_sql_chars); larger
# ones get a JSON-RPC error with HTTP 413 before they are parsed.
MAX_MESSAGE_BYTES = 1024 * 1024
INSTRUCTIONS = (
    "A read-only SQLite database about a company: departments (with location and budget), "
    "employees (department, role, salary, hire_date) and projects (department, lead "
    "employee, status, budget). Explore with list_tables and describe_table, then answer "
    "questions with run_query (SELECT / WITH only)."
)
log = logging.getLogger(__name__)


class _ConnectionCounter:
    """Counts requests (or SSE streams: one per session) open right now on one route."""

    def __init__(self, app: ASGIApp, gauge: Gauge | None = None) -> None:
        self.app = app
        self.gauge = gauge
        self.open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.open += 1
        if self.gauge is not None:
            self.gauge.inc()
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1
            if self.gauge is not None:
                self.gauge.dec()


def _streamable_sessions(app: Any) -> int:
    """Live Streamable HTTP sessions of a FastMCP http_app (0 before startup).

    Reads the SDK session manager's private ``_server_instances``: fastmcp 4.1.6 has no
    public session count or session-end hook (middleware sees ``on_initialize`` but no end;
    the per-connection exit stack is reachable only through private attributes), and
    fastmcp's own shutdown reads the same dict (``fastmcp/server/http.py``). A test fails if
    the count stops moving (``tests/mcp_server/test_limits_and_metrics.py``).
    """

    for route in getattr(app, "routes", ()):
        endpoint = getattr(route, "endpoint", None)
        for candidate in (endpoint, getattr(endpoint, "app", None)):
            manager = getattr(candidate, "session_manager", None)
            if manager is not None:
                return len(getattr(manager, "_server_instances", ()))
    return 0


def build_mcp(settings: McpServerSettings, db: ReadOnlyDatabase, metrics: McpMetrics) -> FastMCP:
    """The FastMCP server with its tools, metrics middleware and optional bearer auth."""

    token = settings.auth_token.get_secret_value() if settings.auth_token else None
    mcp = FastMCP(
        SERVER_NAME,
        instructions=INSTRUCTIONS,
        version=__version__,
        auth=BearerTokenVerifier(token) if token else None,
        middleware=[ToolMetricsMiddleware(metrics)],
        mask_error_details=False,
    )
    CompanyTools(db, max_concurrent=settings.max_concurrent_queries).register(mcp)
    return mcp


def create_app(settings: McpServerSettings | None = None) -> FastAPI:
    """Build the server for ``settings`` (the environment when omitted)."""

    settings = settings or McpServerSettings()
    limits = Limits(
        timeout_s=settings.query_timeout_s,
        max_rows=settings.max_rows,
        max_result_bytes=settings.max_result_bytes,
        max_sql_chars=settings.max_sql_chars,
    )
    db = ReadOnlyDatabase(settings.db_path, limits)
    registry = new_registry()
    metrics = McpMetrics(registry)
    mcp = build_mcp(settings, db, metrics)

    guard: dict[str, Any] = {
        "host_origin_protection": settings.host_origin_protection,
        "allowed_hosts": settings.allowed_hosts,
        "allowed_origins": settings.allowed_origins,
    }
    http_app = mcp.http_app(
        path=MCP_PATH,
        transport="http",
        session_idle_timeout=settings.session_idle_timeout_s,
        **guard,
    )
    sse_app = mcp.http_app(path=SSE_PATH, transport="sse", **guard)
    sse_streams = _ConnectionCounter(sse_app)
    metrics.track_sessions(lambda: _streamable_sessions(http_app) + sse_streams.open)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        created = await anyio.to_thread.run_sync(
            ensure_database, settings.db_path, settings.db_preset, settings.db_seed
        )
        log.info(
            "database ready",
            extra={"db_path": str(settings.db_path), "db_created": created,
                   "preset": settings.db_preset if created else "existing"},
        )  # fmt: skip
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(http_app.router.lifespan_context(http_app))
            await stack.enter_async_context(sse_app.router.lifespan_context(sse_app))
            try:
                yield
            finally:
                db.close()

    app = FastAPI(
        title="mcp-rl company-db MCP server",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    async def health() -> dict[str, Any]:
        tables = await anyio.to_thread.run_sync(db.tables)
        return {"ok": bool(tables), "tables": len(tables), "transports": ["/mcp", "/sse"]}

    add_ops_routes(app, service=SERVICE, registry=registry, health=health, version=__version__,
                   max_body_bytes=MAX_MESSAGE_BYTES,
                   jsonrpc_paths=(MCP_PATH, fastmcp.settings.message_path))
    # The sub-apps see the full path, so their own routes (and guards) apply unchanged.
    app.router.routes.extend(
        [
            Route(MCP_PATH, endpoint=_ConnectionCounter(http_app, metrics.in_flight)),
            Route(SSE_PATH, endpoint=sse_streams, methods=["GET"]),
            Route(
                fastmcp.settings.message_path,
                endpoint=_ConnectionCounter(sse_app, metrics.in_flight),
                methods=["POST"],
            ),
        ]
    )
    app.state.settings = settings
    app.state.db = db
    app.state.mcp = mcp
    app.state.metrics = metrics
    return app
