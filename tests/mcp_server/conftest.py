"""Fixtures: a real company-db server on a free loopback port, shared by the module's tests,
and a fastmcp Client over either transport (Streamable HTTP or SSE)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fastmcp import Client

from mcprl_mcp_server.loopback import serve_mcp

# Short, so runaway queries are cut quickly, but far above what a cheap query takes on a busy
# 2-core CI machine (a 1,000-row capped cross join once took over 0.5 s there).
QUERY_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def query_timeout_s() -> float:
    return QUERY_TIMEOUT_S


@pytest.fixture(scope="session")
def company_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(``/mcp`` URL, db path) of a default-preset server with a short query time limit."""

    with serve_mcp(tmp_path_factory.mktemp("mcp"), query_timeout_s=QUERY_TIMEOUT_S) as served:
        yield served


# (transport, fastmcp Client mode): the 2026 sessionless protocol (the Client's default),
# the handshake-era protocol with sessions (older clients), and legacy SSE.
TRANSPORTS = {
    "streamable-http": ("/mcp", "auto"),
    "streamable-http-legacy": ("/mcp", "legacy"),
    "sse": ("/sse", "auto"),
}


@pytest.fixture(params=list(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def client(transport: str, company_server: tuple[str, Path]) -> AsyncIterator[Client]:
    path, mode = TRANSPORTS[transport]
    url = company_server[0].removesuffix("/mcp") + path
    async with Client(url, timeout=30, mode=mode) as c:
        yield c


@pytest.fixture
def db_path(company_server: tuple[str, Path]) -> Path:
    return company_server[1]
