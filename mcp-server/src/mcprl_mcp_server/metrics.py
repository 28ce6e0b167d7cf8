"""Prometheus metrics of the MCP server (one registry per app) and the FastMCP middleware
that records every tool call: outcome, duration and rows returned."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastmcp.exceptions import FastMCPError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mcprl_common.metrics import LATENCY_BUCKETS_S

OUTCOMES = ("ok", "truncated", "error", "refused", "timeout")
log = logging.getLogger(__name__)


class McpMetrics:
    """The server's own series; HTTP request metrics come from mcprl_common's middleware."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.tool_calls = Counter(
            "mcprl_mcp_tool_calls",
            "MCP tool calls by tool and outcome (ok, truncated, error, refused, timeout).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "mcprl_mcp_tool_call_duration_seconds",
            "Time spent in a tool call, by tool.",
            ["tool"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.rows = Counter(
            "mcprl_mcp_rows_returned", "Rows returned by run_query.", registry=registry
        )
        self.timeouts = Counter(
            "mcprl_mcp_queries_timed_out",
            "Queries stopped by the time limit.",
            registry=registry,
        )
        self.active_sessions = Gauge(
            "mcprl_mcp_active_sessions",
            "Open stateful MCP sessions: handshake-era Streamable HTTP sessions plus SSE "
            "streams (2026-era Streamable HTTP is sessionless: see requests_in_flight).",
            registry=registry,
        )
        self.in_flight = Gauge(
            "mcprl_mcp_requests_in_flight",
            "MCP HTTP requests being served on /mcp and /messages/.",
            registry=registry,
        )

    def track_sessions(self, count: Callable[[], float]) -> None:
        """Read the session count when Prometheus scrapes (no bookkeeping to drift)."""

        self.active_sessions.set_function(count)


class ToolMetricsMiddleware(Middleware):
    """Count, time and classify every ``tools/call`` (errors carry a ``kind``)."""

    def __init__(self, metrics: McpMetrics) -> None:
        self.metrics = metrics

    async def on_call_tool(
        self,
        context: MiddlewareContext[Any],
        call_next: CallNext[Any, ToolResult],
    ) -> ToolResult:
        tool = str(getattr(context.message, "name", "unknown"))
        start = time.perf_counter()
        outcome = "error"
        try:
            result = await call_next(context)
            outcome = "ok"
            data = getattr(result, "structured_content", None)
            if isinstance(data, dict) and "row_count" in data:
                self.metrics.rows.inc(int(data.get("row_count") or 0))
                if data.get("truncated"):
                    outcome = "truncated"
            return result
        except FastMCPError as exc:
            outcome = getattr(exc, "kind", "error")
            if outcome == "timeout":
                self.metrics.timeouts.inc()
            raise
        finally:
            took = time.perf_counter() - start
            self.metrics.tool_calls.labels(tool, outcome).inc()
            self.metrics.duration.labels(tool).observe(took)
            log.debug("tool call", extra={"tool": tool, "outcome": outcome,
                                          "duration_ms": round(took * 1000, 3)})  # fmt: skip
