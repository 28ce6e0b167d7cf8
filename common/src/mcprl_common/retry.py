"""One retry loop for every client: exponential backoff with jitter, honouring Retry-After.

A policy caps the retries by count (``max_retries``), by time since the first failure
(``window_s``), or both. What counts as transient is the caller's (``is_retryable``): the
HTTP client retries connection errors, 408/429/5xx; the judge its upstream's answers; the
trainer a service being restarted. ``on_retry`` sees every failed attempt that is retried
(metrics, counters); the loop logs it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry; ``max_retries=None`` leaves it to ``window_s``."""

    max_retries: int | None = 3
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 8.0
    window_s: float | None = None

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """The wait after failed attempt ``attempt`` (0-based): the server's Retry-After
        (capped) when it sent one, else exponential backoff with jitter in [50%, 100%]."""

        if retry_after:
            try:
                return min(float(retry_after), self.backoff_max_s)
            except ValueError:
                pass
        base = min(self.backoff_initial_s * (2**attempt), self.backoff_max_s)
        return base * (0.5 + random.random() / 2)


@dataclass(frozen=True)
class FailedAttempt:
    """A failed attempt about to be retried (1-based ``number``)."""

    number: int
    error: BaseException
    wait_s: float


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    is_retryable: Callable[[BaseException], bool],
    retry_after: Callable[[BaseException], str | None] = lambda _: None,
    on_retry: Callable[[FailedAttempt], None] | None = None,
    what: str = "call",
    log_level: int = logging.INFO,
    log_extra: Mapping[str, Any] | None = None,
) -> T:
    """``await fn()``, again after each retryable failure while the policy allows; the last
    failure (or the first one that is not retryable) is raised as it came."""

    first_failure: float | None = None
    attempt = 0
    while True:
        try:
            return await fn()
        except Exception as exc:
            if not is_retryable(exc):
                raise
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            elapsed = now - first_failure
            if policy.max_retries is not None and attempt >= policy.max_retries:
                raise
            if policy.window_s is not None and elapsed >= policy.window_s:
                raise
            wait = policy.delay(attempt, retry_after(exc))
            if policy.window_s is not None:
                wait = min(wait, policy.window_s - elapsed)
            wait = max(wait, 0.0)
            reason = f"{type(exc).__name__}: {exc}"[:300]
            # The reason is in the message too: a plain-text log (a bench's stderr) keeps no
            # extras, and "failed, retrying" alone cannot be acted on.
            log.log(log_level, "%s failed, retrying in %.1f s (attempt %d): %s", what, wait,
                    attempt + 1, reason, extra={
                        **(log_extra or {}), "attempt": attempt + 1, "wait_s": round(wait, 3),
                        "reason": reason})
            if on_retry is not None:
                on_retry(FailedAttempt(attempt + 1, exc, wait))
            attempt += 1
            await asyncio.sleep(wait)
