"""MCP connection: both transports, the stable tools hash, tool errors, unreachable URLs."""

from __future__ import annotations

import pytest

from mcprl_common.process import free_port
from mcprl_scenario_gen.errors import McpToolError, McpUnreachableError
from mcprl_scenario_gen.mcp_client import McpConnection, ToolInfo, tools_hash

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_sse_and_streamable_http_see_the_same_tools(company) -> None:
    url, _ = company
    async with McpConnection(url) as http_conn:
        http_info = await http_conn.discover()
    async with McpConnection(url.removesuffix("/mcp") + "/sse") as sse_conn:
        sse_info = await sse_conn.discover()
        tables = await sse_conn.call_json("list_tables")
    assert http_info.tool_names == sse_info.tool_names
    assert http_info.is_sql and sorted(tables) == ["departments", "employees", "projects"]
    assert http_info.tools_hash == sse_info.tools_hash


def test_tools_hash_is_order_independent_and_content_sensitive() -> None:
    a = ToolInfo("a", "first", {"type": "object"})
    b = ToolInfo("b", "second", {"type": "object", "properties": {"x": {"type": "string"}}})
    assert tools_hash([a, b]) == tools_hash([b, a])
    assert tools_hash([a, b]) != tools_hash([a, ToolInfo("b", "second!", b.input_schema)])


async def test_tool_errors_carry_the_server_message(company) -> None:
    url, _ = company
    async with McpConnection(url) as conn:
        result = await conn.call_json("run_query", {"sql": "SELECT COUNT(*) AS n FROM employees"})
        assert result["results"][0]["n"] > 0
        with pytest.raises(McpToolError, match=r"no such table|no_such_table"):
            await conn.call_json("run_query", {"sql": "SELECT * FROM no_such_table"})
        assert conn.tool_calls == 2


async def test_unreachable_and_wrong_path_are_named() -> None:
    with pytest.raises(McpUnreachableError, match="unreachable"):
        async with McpConnection(f"http://127.0.0.1:{free_port()}/mcp", connect_timeout_s=3):
            pass
    with pytest.raises(McpUnreachableError, match="must be http"):
        McpConnection("file:///etc/passwd")


async def test_wrong_path_says_404(company) -> None:
    url, _ = company
    with pytest.raises(McpUnreachableError, match="HTTP 404"):
        async with McpConnection(url.removesuffix("/mcp") + "/nope", connect_timeout_s=3):
            pass
