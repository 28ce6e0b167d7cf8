"""Host/Origin protection (DNS rebinding) with an allow-list, and the optional bearer token,
on both transports of a real server."""

from __future__ import annotations

from pathlib import Path

import httpx
import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.shared.exceptions import MCPError

from mcprl_mcp_server.loopback import serve_mcp
from mcprl_testing.mcp_server import tool_json

pytestmark = pytest.mark.timeout(60)
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _initialize(url: str, **headers: str) -> httpx.Response:
    return httpx.post(url, json=INIT, headers={**MCP_HEADERS, **headers}, timeout=10)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with serve_mcp(
        tmp_path_factory.mktemp("guarded"),
        preset="tutorial",
        allowed_hosts=["mcp-server"],
        allowed_origins=["https://app.example.com"],
    ) as served:
        yield served


def test_foreign_origin_is_refused(guarded: tuple[str, Path]) -> None:
    url, _ = guarded
    resp = _initialize(url, Origin="http://evil.example")
    assert resp.status_code == 403
    sse = httpx.get(url.removesuffix("/mcp") + "/sse", headers={"Origin": "http://evil.example"},
                    timeout=10)  # fmt: skip
    assert sse.status_code == 403


def test_foreign_host_is_refused(guarded: tuple[str, Path]) -> None:
    url, _ = guarded
    assert _initialize(url, Host="evil.example").status_code == 421
    assert _initialize(url, Host="evil.example:8903").status_code == 421


@pytest.mark.parametrize(
    "headers",
    [
        {},  # non-browser clients send no Origin
        {"Origin": "https://app.example.com"},  # allow-listed
        {"Origin": "http://localhost:5173"},  # loopback origin on a loopback host
        {"Host": "mcp-server:8903"},  # allow-listed host (e.g. the compose service name)
    ],
)
def test_allowed_hosts_and_origins_pass(guarded: tuple[str, Path], headers: dict) -> None:
    url, _ = guarded
    resp = _initialize(url, **headers)
    assert resp.status_code == 200, resp.text
    assert "company-db" in resp.text


async def test_client_with_allowed_origin_works(guarded: tuple[str, Path]) -> None:
    url, _ = guarded
    transport = StreamableHttpTransport(url, headers={"Origin": "https://app.example.com"})
    async with Client(transport, timeout=30) as client:
        assert tool_json(await client.call_tool("list_tables", {})) == [
            "departments", "employees", "projects"
        ]  # fmt: skip


def test_health_and_metrics_stay_reachable_for_probes(guarded: tuple[str, Path]) -> None:
    base = guarded[0].removesuffix("/mcp")
    for path in ("/healthz", "/metrics"):
        resp = httpx.get(f"{base}{path}", headers={"Host": "prometheus:8903"}, timeout=5)
        assert resp.status_code == 200


TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def with_token(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with serve_mcp(tmp_path_factory.mktemp("token"), preset="tutorial", auth_token=TOKEN) as s:
        yield s


def test_bearer_token_required_when_set(with_token: tuple[str, Path]) -> None:
    url, _ = with_token
    base = url.removesuffix("/mcp")
    assert _initialize(url).status_code == 401
    assert _initialize(url, Authorization="Bearer wrong").status_code == 401
    assert httpx.get(f"{base}/sse", timeout=5).status_code == 401
    assert _initialize(url, Authorization=f"Bearer {TOKEN}").status_code == 200
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("path", ["/mcp", "/sse"])
async def test_clients_with_the_token_work(with_token: tuple[str, Path], path: str) -> None:
    url = with_token[0].removesuffix("/mcp") + path
    with pytest.raises((MCPError, httpx2.HTTPStatusError)):
        async with Client(url, timeout=10) as client:
            await client.list_tools()
    async with Client(url, timeout=30, auth=TOKEN) as client:
        res = await client.call_tool("run_query", {"sql": "SELECT COUNT(*) AS n FROM projects"})
        assert tool_json(res)["results"] == [{"n": 8}]
