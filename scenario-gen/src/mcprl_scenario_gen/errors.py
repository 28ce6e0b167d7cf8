"""Failures of a generation, each with a ``kind`` (the label of the failures metric).

They subclass :class:`mcprl_common.errors.ServiceError`, so when one happens while a request
is being answered (the pre-flight of ``POST /v1/scenario-sets``) the client gets the right
status and a JSON body naming the problem (the common class first in the bases gives the
status and type); in a background generation the same message ends
up in the manifest's ``error``.
"""

from __future__ import annotations

from mcprl_common.errors import (
    BadRequestError,
    ServiceError,
    UpstreamError,
    UpstreamUnavailableError,
)


class GenerationError(ServiceError):
    """Base of what can stop a generation. ``kind`` labels metrics and manifests."""

    status_code = 500
    error_type = "GenerationError"
    kind = "internal"


class McpUnreachableError(BadRequestError, GenerationError):
    """The MCP server URL did not answer (refused, timed out, not an MCP endpoint)."""

    kind = "mcp_unreachable"


class NoToolsError(BadRequestError, GenerationError):
    kind = "no_tools"


class UnsupportedServerError(BadRequestError, GenerationError):
    """The strategy needs tools the server lacks (``sql`` without ``run_query``)."""

    kind = "unsupported_server"


class McpToolError(UpstreamError, GenerationError):
    """A tool call failed (``isError``) where the generation needed it to work."""

    kind = "mcp_tool"


class NothingGeneratedError(GenerationError):
    """The strategy ran but every candidate was rejected (or none could be made)."""

    status_code = 422
    error_type = "UnprocessableEntityError"
    kind = "nothing_generated"


class McpConnectionLost(UpstreamError, GenerationError):
    """The MCP session broke mid-generation (server stopped, network gone)."""

    kind = "mcp_connection"


class LlmOutputError(UpstreamError, GenerationError):
    """The generator LLM kept answering something that is not a valid scenario batch."""

    kind = "llm_output"


class LlmUnavailableError(UpstreamUnavailableError, GenerationError):
    """The generator LLM could not be reached or refused the request for good."""

    kind = "llm_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 10) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class TooManyJobsError(ServiceError):
    status_code = 429
    error_type = "RateLimitError"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class StorageError(GenerationError):
    """The data directory cannot be written (disk full, read-only volume, no permission)."""

    status_code = 507
    error_type = "InsufficientStorageError"
    kind = "storage"


def failure_kind(exc: BaseException) -> str:
    """The metrics label of any exception that ended a generation."""

    if isinstance(exc, GenerationError):
        return exc.kind
    return "internal"
