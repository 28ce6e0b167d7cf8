"""HTTP clients with timeouts and retries, in one place.

Every call between services goes through :func:`request_json` (or an OpenAI client made by
:func:`openai_client`, whose calls go through :func:`openai_call`), so each network call has
a timeout and retries with exponential backoff and jitter on connection errors, 429 and 5xx,
honouring ``Retry-After`` (the loop is :func:`mcprl_common.retry.retry_call`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import openai
from openai import AsyncOpenAI

from mcprl_common.errors import error_message
from mcprl_common.retry import RETRY_STATUS, FailedAttempt, RetryPolicy, retry_call
from mcprl_common.settings import UpstreamSettings

__all__ = ["RETRY_STATUS", "RetryPolicy", "ServiceCallError", "openai_call", "openai_client",
           "request_json"]
log = logging.getLogger(__name__)
T = TypeVar("T")


class ServiceCallError(Exception):
    """A call to another service failed for good (after retries); carries status and message."""

    def __init__(self, url: str, status: int | None, message: str,
                 retry_after: str | None = None) -> None:
        super().__init__(f"{url}: {status or 'no response'}: {message}")
        self.url = url
        self.status = status
        self.message = message
        self.retry_after = retry_after


def _retryable_call_error(exc: BaseException) -> bool:
    return isinstance(exc, ServiceCallError) and (exc.status is None
                                                  or exc.status in RETRY_STATUS)


async def request_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    json: Any = None,
    params: dict[str, Any] | None = None,
    timeout: float | None = None,
    retry: RetryPolicy = RetryPolicy(),
) -> Any:
    """Send a request and return the decoded JSON body, retrying transient failures."""

    async def attempt() -> Any:
        try:
            resp = await client.request(
                method, url, json=json, params=params,
                timeout=timeout if timeout is not None else client.timeout,
            )
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            raise ServiceCallError(url, None, f"{type(exc).__name__}: {exc}") from None
        if resp.status_code < 400:
            return resp.json() if resp.content else None
        try:
            message = error_message(resp.json())
        except ValueError:
            message = resp.text[:500]
        raise ServiceCallError(url, resp.status_code, message, resp.headers.get("retry-after"))

    return await retry_call(attempt, retry, is_retryable=_retryable_call_error,
                            retry_after=lambda exc: getattr(exc, "retry_after", None),
                            what=f"{method} {url}", log_extra={"url": url})


def openai_retryable(exc: BaseException) -> bool:
    """What the OpenAI SDK itself would retry: no answer, a timeout, 408/409/429/5xx."""

    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in RETRY_STATUS


def _openai_retry_after(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return response.headers.get("retry-after") if response is not None else None


async def openai_call(fn: Callable[[], Awaitable[T]], retry: RetryPolicy, *, what: str,
                      on_retry: Callable[[FailedAttempt], None] | None = None) -> T:
    """``await fn()`` (one call of an :func:`openai_client` made with ``max_retries=0``),
    retried by the common policy instead of the SDK's own loop."""

    return await retry_call(fn, retry, is_retryable=openai_retryable,
                            retry_after=_openai_retry_after, on_retry=on_retry, what=what)


def openai_client(upstream: UpstreamSettings, **overrides: Any) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` client with the upstream's timeout and retries (the SDK backs off)."""

    return AsyncOpenAI(
        base_url=overrides.get("base_url", upstream.base_url),
        api_key=overrides.get("api_key", upstream.api_key.get_secret_value()),
        timeout=overrides.get("timeout", upstream.timeout_s),
        max_retries=overrides.get("max_retries", upstream.max_retries),
    )
