"""HTTP clients with timeouts and retries, in one place.

Every call between services goes through :func:`request_json` (or an OpenAI client made by
:func:`openai_client`), so each network call has a timeout and retries with exponential
backoff and jitter on connection errors, 429 and 5xx, honouring ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx
from openai import AsyncOpenAI

from mcprl_common.errors import error_message
from mcprl_common.settings import UpstreamSettings

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 8.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.backoff_max_s)
            except ValueError:
                pass
        base = min(self.backoff_initial_s * (2**attempt), self.backoff_max_s)
        return base * (0.5 + random.random() / 2)


class ServiceCallError(Exception):
    """A call to another service failed for good (after retries); carries status and message."""

    def __init__(self, url: str, status: int | None, message: str) -> None:
        super().__init__(f"{url}: {status or 'no response'}: {message}")
        self.url = url
        self.status = status
        self.message = message


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

    last: ServiceCallError | None = None
    for attempt in range(retry.max_retries + 1):
        try:
            resp = await client.request(
                method, url, json=json, params=params,
                timeout=timeout if timeout is not None else client.timeout,
            )
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            last = ServiceCallError(url, None, f"{type(exc).__name__}: {exc}")
            retry_after = None
        else:
            if resp.status_code < 400:
                return resp.json() if resp.content else None
            try:
                message = error_message(resp.json())
            except ValueError:
                message = resp.text[:500]
            last = ServiceCallError(url, resp.status_code, message)
            if resp.status_code not in RETRY_STATUS:
                raise last
            retry_after = resp.headers.get("retry-after")
        if attempt < retry.max_retries:
            wait = retry.delay(attempt, retry_after)
            log.info("retrying", extra={"url": url, "attempt": attempt + 1, "wait_s": wait,
                                        "reason": last.message})
            await asyncio.sleep(wait)
    assert last is not None
    raise last


def openai_client(upstream: UpstreamSettings, **overrides: Any) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` client with the upstream's timeout and retries (the SDK backs off)."""

    return AsyncOpenAI(
        base_url=overrides.get("base_url", upstream.base_url),
        api_key=overrides.get("api_key", upstream.api_key.get_secret_value()),
        timeout=overrides.get("timeout", upstream.timeout_s),
        max_retries=overrides.get("max_retries", upstream.max_retries),
    )
