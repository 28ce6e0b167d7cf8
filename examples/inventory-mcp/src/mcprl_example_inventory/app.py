"""The HTTP app: Streamable HTTP MCP at ``/mcp`` plus ``/healthz`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mcprl_common.metrics import new_registry
from mcprl_common.service_app import add_ops_routes
from mcprl_example_inventory import __version__
from mcprl_example_inventory.server import build_mcp
from mcprl_example_inventory.service import InventoryService
from mcprl_example_inventory.settings import InventorySettings

SERVICE = "inventory-mcp"


class BearerAuth:
    """Require ``Authorization: Bearer <token>`` on the MCP endpoint (ops routes stay open)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/mcp"):
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                body = {"error": {"message": "missing or wrong bearer token",
                                  "type": "AuthenticationError", "param": None, "code": 401}}
                await JSONResponse(body, status_code=401,
                                   headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: InventorySettings | None = None) -> FastAPI:
    """Build the app; the DB is created (seeded) here if it does not exist yet."""

    settings = settings or InventorySettings()
    registry = new_registry()
    service = InventoryService(
        settings.db_path, max_results=settings.max_results,
        busy_timeout_s=settings.busy_timeout_s, seed=settings.seed,
        warehouses=settings.warehouses, items=settings.items, movements=settings.movements,
    )
    mcp = build_mcp(service, registry, allow_writes=settings.allow_writes)
    mcp_app = mcp.http_app(
        path="/mcp",
        host_origin_protection="auto",
        allowed_hosts=settings.allowed_hosts or None,
        allowed_origins=settings.allowed_origins or None,
    )
    app = FastAPI(title="mcp-rl inventory example", version=__version__,
                  lifespan=mcp_app.lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.settings = settings

    async def health() -> dict[str, Any]:
        return await asyncio.to_thread(service.health)

    add_ops_routes(app, service=SERVICE, registry=registry, health=health, version=__version__)
    if settings.auth_token is not None:
        app.add_middleware(BearerAuth, token=settings.auth_token.get_secret_value())
    app.mount("/", mcp_app)
    return app
