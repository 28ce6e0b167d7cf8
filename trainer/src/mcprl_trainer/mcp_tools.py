"""The agent's tools: an MCP server's tools as OpenAI tool schemas, plus ``complete_task``.

One fastmcp ``Client`` session per rollout, opened once and kept across its turns (servers
may keep per-session state). Tool failures come back as results the model sees, never as
exceptions: the agent learns from "no such table" like from any other observation. The
server itself failing (connection refused or dropped, the process killed) is not the agent's
doing: it raises :class:`McpUnavailableError`, so the rollout is started again instead of
being trained on with an error the agent did not cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastmcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

from mcprl_common.mcp_transport import mcp_transport
from mcprl_trainer.recovery import ServiceUnavailableError

log = logging.getLogger(__name__)
COMPLETE_TASK = "complete_task"
COMPLETE_TASK_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": COMPLETE_TASK,
        "description": "Finish the task and give the final answer. Call it exactly once, "
        "when you know the answer.",
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {
                    "type": "string",
                    "description": "The final answer only: a number, a name, or a "
                    "comma-separated list of names.",
                }
            },
            "required": ["answer"],
        },
    },
}


def mcp_tool_to_openai(tool: Any) -> dict[str, Any]:
    """An MCP ``Tool`` (name, description, inputSchema) as an OpenAI function tool."""

    raw = getattr(tool, "input_schema", None)
    if raw is None:
        raw = getattr(tool, "inputSchema", None)
    schema = dict(raw or {"type": "object", "properties": {}})
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": (tool.description or "").strip(),
            "parameters": schema,
        },
    }


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool
    error_kind: str | None = None  # tool_error | unknown_tool | bad_arguments | timeout | protocol


class McpUnavailableError(ServiceUnavailableError):
    """The MCP server could not be reached or dropped the session (not the agent's fault)."""


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if text is not None else json.dumps(block.model_dump(mode="json")))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def _unsendable(arguments: Any) -> str | None:
    """Why ``arguments`` cannot go out as a ``tools/call`` (None: they can). The client would
    fail on them before sending and report a broken session, which the rollout's retry takes
    for the server's fault: a JSON string with a lone surrogate escape (``"\\ud83d"``, valid
    JSON, not encodable as UTF-8) closed the session in a test."""

    if not isinstance(arguments, dict):
        return f"must be a JSON object, not {type(arguments).__name__}"
    try:
        json.dumps(arguments, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return f"cannot be sent as JSON text ({type(exc).__name__}: {str(exc)[:120]})"
    return None


class McpSession:
    """One open MCP session: lists tools once and calls them with a timeout."""

    def __init__(self, client: Client, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.tools: list[dict[str, Any]] = []
        self.names: set[str] = set()

    async def load_tools(self) -> list[dict[str, Any]]:
        tools = await self.client.list_tools()
        self.tools = [mcp_tool_to_openai(t) for t in tools]
        self.names = {t["function"]["name"] for t in self.tools}
        return self.tools

    def agent_tools(self) -> list[dict[str, Any]]:
        """What the model is offered: the server's tools and ``complete_task``."""

        return [*self.tools, COMPLETE_TASK_SCHEMA]

    async def call(self, name: str, arguments: dict[str, Any] | None) -> ToolResult:
        if name not in self.names:
            known = ", ".join(sorted(self.names | {COMPLETE_TASK}))
            return ToolResult(f"Error: unknown tool {name!r}. Available tools: {known}.",
                              True, "unknown_tool")
        arguments = {} if arguments is None else arguments
        problem = _unsendable(arguments)
        if problem is not None:  # the agent's mistake: never sent, so never a dropped session
            return ToolResult(f"Error: the arguments of {name!r} {problem}.", True,
                              "bad_arguments")
        try:
            result = await asyncio.wait_for(
                self.client.call_tool(name, arguments, raise_on_error=False,
                                      timeout=self.timeout_s),
                timeout=self.timeout_s + 5,
            )
        except TimeoutError:
            return ToolResult(f"Error: tool {name!r} timed out after {self.timeout_s:.0f}s.",
                              True, "timeout")
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise McpUnavailableError(f"MCP server dropped the session: {exc}") from exc
            if exc.code == REQUEST_TIMEOUT:  # the client's own timeout: as the wait_for one
                return ToolResult(f"Error: tool {name!r} timed out after "
                                  f"{self.timeout_s:.0f}s.", True, "timeout")
            kind = "bad_arguments" if "argument" in str(exc).lower() else "protocol"
            return ToolResult(f"Error: {exc}", True, kind)  # a JSON-RPC error the call caused
        except Exception as exc:  # connection refused or reset, client closed under us
            raise McpUnavailableError(f"MCP server unavailable: {type(exc).__name__}: "
                                      f"{exc}") from exc
        text = _result_text(result)
        if result.is_error:
            kind = "bad_arguments" if "validation error" in text.lower() else "tool_error"
            return ToolResult(text if text.lower().startswith("error") else f"Error: {text}",
                              True, kind)
        return ToolResult(text, False)


@asynccontextmanager
async def open_session(url: str, *, auth_token: str | None = None,
                       timeout_s: float = 30.0) -> AsyncIterator[McpSession]:
    """A fresh MCP session with the tools loaded; closed when the rollout ends.

    Failing to connect or to list the tools raises :class:`McpUnavailableError`; failing to
    close a session whose server went away is logged, not raised (the rollout is complete).
    """

    client = Client(mcp_transport(url, auth_token=auth_token), timeout=timeout_s,
                    init_timeout=timeout_s)
    try:
        await client.__aenter__()
        session = McpSession(client, timeout_s)
        await session.load_tools()
    except Exception as exc:
        with contextlib.suppress(Exception):
            await client.__aexit__(None, None, None)
        raise McpUnavailableError(f"cannot open an MCP session at {url}: "
                                  f"{type(exc).__name__}: {exc}") from exc
    try:
        yield session
    finally:
        try:
            await client.__aexit__(None, None, None)
        except Exception as exc:
            log.debug("closing the MCP session failed", extra={"reason": repr(exc)})
