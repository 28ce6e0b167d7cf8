"""One error shape for every service: OpenAI's (and vLLM's) ``{"error": {...}}`` body.

Services raise :class:`ServiceError` subclasses from their logic; the handlers installed by
:func:`install_error_handlers` turn them, request validation failures and anything unexpected
into JSON with the right status code, so no request ever ends in an HTML page or a dropped
connection.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ServiceError(Exception):
    """Base of the errors a service reports to its client."""

    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def headers(self) -> dict[str, str]:
        return {}

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(
                message=self.message, type=self.error_type, param=self.param, code=self.status_code
            )
        )


class BadRequestError(ServiceError):
    status_code = 400
    error_type = "BadRequestError"


class NotFoundError(ServiceError):
    status_code = 404
    error_type = "NotFoundError"


class ConflictError(ServiceError):
    status_code = 409
    error_type = "ConflictError"


class PayloadTooLargeError(ServiceError):
    status_code = 413
    error_type = "PayloadTooLargeError"


class UnauthorizedError(ServiceError):
    status_code = 401
    error_type = "AuthenticationError"


class UpstreamUnavailableError(ServiceError):
    """The service depends on an upstream that is down; the client should retry later."""

    status_code = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, *, retry_after_s: int = 5, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class UpstreamError(ServiceError):
    """The upstream answered, but with something unusable (after retries)."""

    status_code = 502
    error_type = "BadGatewayError"


def error_json(
    status: int, message: str, error_type: str, param: str | None = None
) -> JSONResponse:
    info = ErrorInfo(message=message, type=error_type, param=param, code=status)
    body = ErrorResponse(error=info)
    return JSONResponse(body.model_dump(), status_code=status)


def _describe_validation(exc: RequestValidationError) -> tuple[str, str | None]:
    parts: list[str] = []
    first_param: str | None = None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) or "body"
        first_param = first_param or where
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", first_param


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure a JSON error body (4xx for the client's mistakes, 5xx otherwise)."""

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        if exc.status_code >= 500:
            log.warning("request failed: %s", exc.message, extra={"status": exc.status_code})
        resp = JSONResponse(exc.to_response().model_dump(), status_code=exc.status_code)
        resp.headers.update(exc.headers())
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_validation(exc)
        return error_json(400, message, "BadRequestError", param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        resp = error_json(exc.status_code, str(exc.detail), kind)
        if exc.headers:
            resp.headers.update(exc.headers)
        return resp

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_json(500, f"internal error: {type(exc).__name__}", "InternalServerError")


def error_message(body: Any) -> str:
    """Pull the human message out of an error body from any of our services (or OpenAI's)."""

    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    return str(body)
