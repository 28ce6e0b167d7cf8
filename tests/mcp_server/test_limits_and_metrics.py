"""Runaway queries stop at the time limit without blocking other sessions; the result-size
cap truncates; /metrics shows tool calls, durations, rows, sessions and timeouts."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx
import pytest
from fastmcp import Client

from mcprl_mcp_server.db.readonly import Limits, QueryError, ReadOnlyDatabase
from mcprl_testing.mcp_server import tool_error, tool_json

pytestmark = pytest.mark.timeout(60)
RUNAWAY = [
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
    "SELECT n FROM r ORDER BY n DESC LIMIT 1",
    "SELECT count(*) FROM employees a, employees b, employees c, employees d",
]


@pytest.mark.parametrize("sql", RUNAWAY, ids=["recursive-count", "recursive-sort", "cross-4x"])
async def test_runaway_query_stops_at_the_limit(
    client: Client, sql: str, query_timeout_s: float
) -> None:
    start = time.perf_counter()
    res = await client.call_tool("run_query", {"sql": sql}, raise_on_error=False)
    took = time.perf_counter() - start
    msg = tool_error(res)
    assert f"stopped after {query_timeout_s:g} s" in msg
    assert query_timeout_s * 0.9 <= took < query_timeout_s + 3.0
    ok = tool_json(await client.call_tool("run_query", {"sql": "SELECT 1 AS one"}))
    assert ok["results"] == [{"one": 1}]


async def test_long_query_does_not_block_other_sessions(
    company_server: tuple[str, Path], query_timeout_s: float
) -> None:
    url, _ = company_server
    fast_latencies: list[float] = []

    async def runaway() -> None:
        async with Client(url, timeout=30) as c:
            res = await c.call_tool("run_query", {"sql": RUNAWAY[0]}, raise_on_error=False)
            assert res.is_error

    async def fast() -> None:
        async with Client(url, timeout=30) as c:
            await anyio.sleep(0.1)  # let the runaway start first
            for _ in range(5):
                t = time.perf_counter()
                await c.call_tool("list_tables", {})
                fast_latencies.append(time.perf_counter() - t)

    async with anyio.create_task_group() as tg:
        tg.start_soon(runaway)
        tg.start_soon(fast)
    assert len(fast_latencies) == 5
    assert max(fast_latencies) < query_timeout_s, fast_latencies


def test_result_size_cap_truncates(db_path: Path) -> None:
    db = ReadOnlyDatabase(db_path, Limits(max_rows=10_000, max_result_bytes=4096))
    try:
        res = db.query("SELECT * FROM employees")
        assert res.truncated is True and 0 < res.row_count < 150
        assert res.row_count == len(res.results)
        capped = ReadOnlyDatabase(db_path, Limits(max_rows=7)).query("SELECT id FROM employees")
        assert capped.truncated is True and capped.row_count == 7
        exact = ReadOnlyDatabase(db_path, Limits(max_rows=8)).query("SELECT id FROM departments")
        assert exact.truncated is False and exact.row_count == 8
    finally:
        db.close()


def test_values_are_json_safe(db_path: Path) -> None:
    db = ReadOnlyDatabase(db_path)
    try:
        res = db.query("SELECT x'00ff' AS b, 1e999 AS inf, -1e999 AS ninf, NULL AS n, 'é' AS s")
        assert res.results == [{"b": "x'00ff'", "inf": "inf", "ninf": "-inf", "n": None, "s": "é"}]
        with pytest.raises(QueryError) as err:
            db.query("SELECT " + "1," * 20_000 + "1")
        assert "too long" in err.value.message
    finally:
        db.close()


async def test_metrics_show_tool_calls(company_server: tuple[str, Path]) -> None:
    url, _ = company_server
    base = url.removesuffix("/mcp")
    sse_url = f"{base}/sse"
    async with Client(url, timeout=30, mode="legacy") as c, Client(sse_url, timeout=30) as sse:
        await sse.call_tool("list_tables", {})
        await c.call_tool("list_tables", {})
        await c.call_tool("run_query", {"sql": "SELECT id FROM departments"})
        await c.call_tool("run_query", {"sql": "DELETE FROM employees"}, raise_on_error=False)
        await c.call_tool("run_query", {"sql": RUNAWAY[0]}, raise_on_error=False)
        async with httpx.AsyncClient(timeout=5) as http:
            text = (await http.get(f"{base}/metrics")).text
    values = _samples(text)
    assert values['mcprl_mcp_tool_calls_total{outcome="ok",tool="list_tables"}'] >= 1
    assert values['mcprl_mcp_tool_calls_total{outcome="ok",tool="run_query"}'] >= 1
    assert values['mcprl_mcp_tool_calls_total{outcome="refused",tool="run_query"}'] >= 1
    assert values['mcprl_mcp_tool_calls_total{outcome="timeout",tool="run_query"}'] >= 1
    assert values["mcprl_mcp_queries_timed_out_total"] >= 1
    assert values["mcprl_mcp_rows_returned_total"] >= 8
    assert values['mcprl_mcp_tool_call_duration_seconds_count{tool="run_query"}'] >= 3
    assert values["mcprl_mcp_active_sessions"] >= 2  # the two clients above were still open
    assert "mcprl_mcp_requests_in_flight" in values
    assert any(k.startswith("mcprl_http_requests_total{") and 'route="/mcp"' in k for k in values)


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
