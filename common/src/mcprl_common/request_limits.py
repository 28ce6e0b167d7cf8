"""What every HTTP service refuses before its routes see a request, and how its OpenAPI
document says so.

- A body larger than ``max_body_bytes`` gets 413 with the JSON error body, whether it
  announces its length or streams it chunked (the body is counted as it arrives, never held
  beyond the limit). On JSON-RPC paths (an MCP server's ``/mcp``) the body is a JSON-RPC
  error instead, which MCP clients read as a protocol error.
- The OpenAPI document lists the error responses the services really send (400 for an
  invalid request, not FastAPI's default 422, and 404, 405, 409, 413, 429, 502, 503, 507),
  each with the one error shape, so clients and schema-driven fuzzers (schemathesis) can
  check them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcprl_common.errors import ErrorResponse, error_json

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ERROR_STATUSES: dict[int, str] = {
    400: "Invalid request: wrong types, missing fields, malformed JSON or bad values.",
    404: "No such resource (or model).",
    405: "Method not allowed on this path.",
    409: "The resource is not in a state that allows this (e.g. still running).",
    413: "Request body too large.",
    429: "Too many requests or jobs at once; retry later.",
    502: "An upstream answered something unusable.",
    503: "Not ready, or an upstream is down; retry after Retry-After seconds.",
    507: "The service cannot store its data (disk full or read-only volume).",
}


class BodyLimitMiddleware:
    """413 for request bodies over ``max_bytes`` (pure ASGI, so streaming routes are safe)."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 jsonrpc_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.jsonrpc_paths = jsonrpc_paths

    def _too_large(self, path: str) -> Any:
        message = f"request body larger than {self.max_bytes} bytes"
        if path.startswith(self.jsonrpc_paths) and self.jsonrpc_paths:
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32600, "message": f"Invalid Request: {message}"}}, status_code=413)
        return error_json(413, message, "PayloadTooLargeError")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                too_large = int(length) > self.max_bytes
            except ValueError:
                await error_json(400, "invalid Content-Length", "BadRequestError")(
                    scope, receive, send)
                return
            if too_large:
                await self._too_large(scope["path"])(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length announced (chunked): read it all here, counting, then replay it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(scope["path"])(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def document_errors(app: FastAPI) -> None:
    """Make ``app.openapi()`` list the error responses with the shared error body."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version=app.version, summary=app.summary,
                           description=app.description, routes=app.routes)
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in ErrorResponse.model_json_schema(
                ref_template="#/components/schemas/{model}").get("$defs", {}).items():
            schemas.setdefault(name, schema)
        body = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        body.pop("$defs", None)
        schemas["ErrorResponse"] = body
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        ref = {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                for status, text in ERROR_STATUSES.items():
                    responses.setdefault(str(status), {"description": text, **ref})
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
