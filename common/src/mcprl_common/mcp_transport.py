"""The MCP client transport of every mcp-rl client (the trainer's rollouts, scenario-gen's
discovery): fastmcp's Streamable HTTP or SSE transport over an httpx client whose idle
connections expire before a server closes them.

uvicorn, FastMCP's own server and Node close an idle connection after 5 s, and httpx keeps
one for 5 s as well. A tool call sent on a pooled connection as the server closed it failed
with "Connection closed": 2 of 128 sessions whose calls came after ~5 s pauses
(bench/bench_mcp_idle_race.py), 82 retried rollouts in one GPU learning run. So idle
connections are dropped after :data:`KEEPALIVE_EXPIRY_S`; a call after a longer turn opens a
new connection, which costs less than the turn.

Imports fastmcp, which the packages that use this module depend on (common itself does not).
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlparse

import httpx2
from fastmcp.client.transports import SSETransport, StreamableHttpTransport

KEEPALIVE_EXPIRY_S = 1.0
TransportKind = Literal["auto", "http", "sse"]


def http_client(**kwargs: Any) -> httpx2.AsyncClient:
    """The MCP SDK's client (its 30 s timeouts, 300 s reads, unless the transport passes
    its own) with idle connections expiring after :data:`KEEPALIVE_EXPIRY_S`."""

    kwargs.setdefault("timeout", httpx2.Timeout(30.0, read=300.0))
    return httpx2.AsyncClient(limits=httpx2.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S),
                              **kwargs)


def mcp_transport(url: str, kind: TransportKind = "auto", auth_token: str | None = None
                  ) -> StreamableHttpTransport | SSETransport:
    """``auto``: SSE for a URL whose path ends in ``/sse``, else Streamable HTTP (as fastmcp
    infers it)."""

    if kind == "auto":
        kind = "sse" if urlparse(url).path.rstrip("/").endswith("/sse") else "http"
    transport_type = SSETransport if kind == "sse" else StreamableHttpTransport
    return transport_type(url, auth=auth_token or None, httpx_client_factory=http_client)
