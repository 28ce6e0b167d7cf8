"""A rollout's MCP client drops idle connections before a server closes them.

uvicorn (our MCP server, FastMCP's) closes a connection idle for 5 s, and httpx kept one for
5 s too: a tool call sent on a pooled connection as the server closed it came back as
"MCP server dropped the session: Connection closed" (2 of 128 sessions with ~5 s agent
turns in bench/bench_mcp_idle_race.py, 82 in one GPU learning run). The client now reuses a
connection only within ``KEEPALIVE_EXPIRY_S`` of its last use; this test watches the client
port of each request on the real server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from mcprl_common.mcp_transport import KEEPALIVE_EXPIRY_S
from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_mcp_server.app import create_app
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.settings import McpServerSettings
from mcprl_trainer.mcp_tools import open_session

pytestmark = pytest.mark.timeout(60)
TURN_S = 2.0  # an agent turn, shorter than the server's 5 s: it would keep the connection


def recording_ports(app: Any, ports: list[int]) -> Any:
    """The app, noting the client port of every POST (one MCP message each)."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            ports.append(scope["client"][1])
        await app(scope, receive, send)

    return wrapped


def test_an_idle_connection_is_not_reused_after_the_expiry(tmp_path: Path) -> None:
    db = tmp_path / "company.db"
    ensure_database(db, "default", 42)
    ports: list[int] = []
    app = create_app(McpServerSettings(host="127.0.0.1", port=0, db_path=db))
    with UvicornThread(recording_ports(app, ports)) as server:
        wait_healthy(f"{server.url}/healthz", timeout_s=30)

        async def rollout() -> list[int]:
            async with open_session(f"{server.url}/mcp", timeout_s=10) as session:
                await session.call("list_tables", {})
                first = len(ports)
                await session.call("list_tables", {})  # right after: the same connection
                await asyncio.sleep(TURN_S)
                await session.call("list_tables", {})
                return ports[first - 1:]

        burst_then_idle = asyncio.run(rollout())
    assert KEEPALIVE_EXPIRY_S < TURN_S
    assert len(burst_then_idle) == 3, ports
    before, right_after, after_idle = burst_then_idle
    assert right_after == before  # connections are pooled within the expiry
    assert after_idle != before  # and a new one carries the call after an idle turn
