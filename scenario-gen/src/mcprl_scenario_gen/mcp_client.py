"""Talking to any MCP server through the fastmcp ``Client``.

One :class:`McpConnection` per generation: connect (Streamable HTTP, or SSE for ``.../sse``
URLs), list tools and resources, and call tools with a timeout, turning every failure into
an error that names the server and the problem.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx
from fastmcp import Client
from fastmcp.client import SSETransport, StreamableHttpTransport
from mcp.shared.exceptions import MCPError

from mcprl_common.mcp_transport import TransportKind, mcp_transport
from mcprl_scenario_gen.errors import McpConnectionLost, McpToolError, McpUnreachableError

log = logging.getLogger(__name__)
SQL_TOOLS = ("list_tables", "describe_table", "run_query")


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema}


@dataclass(frozen=True)
class ResourceInfo:
    uri: str
    name: str
    description: str
    mime_type: str | None = None


@dataclass
class ServerInfo:
    """What discovery found: enough to choose a strategy and to write the manifest."""

    url: str
    tools: list[ToolInfo]
    resources: list[ResourceInfo] = field(default_factory=list)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    @property
    def tools_hash(self) -> str:
        return tools_hash(self.tools)

    @property
    def is_sql(self) -> bool:
        return all(name in self.tool_names for name in SQL_TOOLS)


def tools_hash(tools: list[ToolInfo]) -> str:
    """sha256 of the tool schemas sorted by name: equal tool lists hash equal, in any order."""

    canonical = sorted((t.as_dict() for t in tools), key=lambda d: d["name"])
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


def pick_transport(
    url: str, kind: TransportKind = "auto", auth_token: str | None = None
) -> StreamableHttpTransport | SSETransport:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise McpUnreachableError(f"MCP URL must be http(s)://host[:port]/path, got {url!r}",
                                  param="mcp_url")
    return mcp_transport(url, kind, auth_token)


class McpConnection:
    """An open MCP session; use as ``async with McpConnection(url) as conn``."""

    def __init__(
        self,
        url: str,
        *,
        auth_token: str | None = None,
        transport: TransportKind = "auto",
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._auth_token = auth_token
        self._transport = pick_transport(url, transport, auth_token)
        self._client: Client | None = None
        self.tool_calls = 0

    async def __aenter__(self) -> McpConnection:
        client = Client(self._transport, timeout=self.timeout_s,
                        init_timeout=self.connect_timeout_s)
        try:
            async with asyncio.timeout(self.connect_timeout_s + 1):
                await client.__aenter__()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # connection failures arrive as groups, runtime errors
            reason = await self._diagnose() or _describe(exc)
            raise McpUnreachableError(
                f"MCP server at {self.url} is unreachable: {reason}", param="mcp_url"
            ) from None
        self._client = client
        return self

    async def _diagnose(self) -> str | None:
        """A plainer reason than the MCP client gives for HTTP-level refusals (401, 404)."""

        headers = {"Accept": "application/json, text/event-stream"}
        if self._auth_token:
            headers["Authorization"] = f"Bearer {self._auth_token}"
        try:
            async with httpx.AsyncClient(timeout=3.0) as client:
                resp = await client.post(self.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 0, "method": "ping"})
        except httpx.HTTPError:
            return None
        if resp.status_code in (401, 403):
            given = "the given bearer token" if self._auth_token else "requests without a token"
            return f"it refused {given} (HTTP {resp.status_code}); set auth_token"
        if resp.status_code == 404:
            return "nothing is served at this path (HTTP 404); MCP endpoints are usually /mcp " \
                   "or /sse"
        return None

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            async with asyncio.timeout(5):
                await client.__aexit__(None, None, None)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # closing must never hide the real outcome
            log.debug("closing MCP client failed: %s", _describe(err))

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("McpConnection used outside 'async with'")
        return self._client

    async def list_tools(self) -> list[ToolInfo]:
        try:
            tools = await self.client.list_tools()
        except Exception as exc:
            raise McpUnreachableError(f"listing tools of {self.url} failed: {_describe(exc)}",
                                      param="mcp_url") from None
        return [ToolInfo(t.name, t.description or "", dict(t.input_schema or {})) for t in tools]

    async def list_resources(self) -> list[ResourceInfo]:
        """Resources, or none when the server does not offer the capability."""

        try:
            items = await self.client.list_resources()
        except Exception as exc:
            log.info("server lists no resources: %s", _describe(exc))
            return []
        return [ResourceInfo(str(r.uri), r.name or "", r.description or "",
                             getattr(r, "mime_type", None)) for r in items]

    async def read_text_resource(self, uri: str, max_chars: int = 2000) -> str | None:
        try:
            contents = await self.client.read_resource(uri)
        except Exception as exc:
            log.info("reading resource failed", extra={"uri": uri, "reason": _describe(exc)})
            return None
        texts = [c.text for c in contents if hasattr(c, "text")]
        return "\n".join(texts)[:max_chars] if texts else None

    async def discover(self) -> ServerInfo:
        tools = await self.list_tools()
        resources = await self.list_resources()
        return ServerInfo(url=self.url, tools=tools, resources=resources)

    async def call_json(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call a tool and decode its result (JSON text, else structured content, else text).

        A tool error (``isError``) raises :class:`McpToolError` carrying the server's message.
        """

        self.tool_calls += 1
        try:
            result = await self.client.call_tool_mcp(name, arguments or {},
                                                     timeout=self.timeout_s)
        except MCPError as exc:  # a JSON-RPC error: the server answered, the call failed
            raise McpToolError(f"calling {name} on {self.url} failed: {_describe(exc)}") from None
        except Exception as exc:
            raise McpConnectionLost(
                f"lost the MCP server at {self.url} while calling {name}: {_describe(exc)}"
            ) from None
        text = "".join(getattr(block, "text", "") for block in result.content or [])
        if result.is_error:
            raise McpToolError(f"{name} returned an error: {text[:500] or 'no message'}")
        if text:
            try:
                return json.loads(text)
            except ValueError:
                pass
        structured = result.structured_content
        if isinstance(structured, dict):
            meta = result.meta or {}
            wrapped = (meta.get("fastmcp") or {}).get("wrap_result")
            if wrapped or (set(structured) == {"result"}):
                return structured.get("result")
            return structured
        return text


def _describe(exc: BaseException) -> str:
    """A one-line reason, unwrapping exception groups down to the first leaf."""

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        message = "timed out"
    return f"{type(exc).__name__}: {message}"[:300]
