"""Riding out a service that is down or restarting (a crash, a redeploy, an OOM kill).

The HTTP client already retries a request a few times within a second or two; a service
that is being restarted takes longer. What the run needs from a service (a rollout, a
judgement, an adapter load, the scenario set) is therefore retried with backoff for a time
window (``retry.window_s``) before it is given up. Only transient failures are retried:
no answer, a dropped connection, 408/429/5xx. A 4xx that names the caller's mistake fails
at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from mcprl_common.http import RETRY_STATUS, ServiceCallError
from mcprl_common.retry import RetryPolicy, retry_call

log = logging.getLogger(__name__)
T = TypeVar("T")
# Exception class names of the HTTP stacks in use (httpx for our clients, httpx2 inside
# fastmcp): a failed connection or a connection dropped mid-request.
_TRANSPORT_NAMES = frozenset({
    "TransportError", "NetworkError", "ConnectError", "ReadError", "WriteError", "CloseError",
    "RemoteProtocolError", "ProtocolError", "TimeoutException", "ConnectTimeout", "ReadTimeout",
    "WriteTimeout", "PoolTimeout", "ClosedResourceError", "BrokenResourceError",
    "EndOfStream",
})


class ServiceUnavailableError(RuntimeError):
    """A service the run depends on failed (infrastructure, not the agent): retried."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a service being down rather than a mistake."""

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ServiceUnavailableError):
            return True
        status = getattr(current, "status", None)
        if isinstance(current, ServiceCallError) or status is not None:
            return status is None or status in RETRY_STATUS
        if isinstance(current, ConnectionError | TimeoutError):
            return True
        if any(cls.__name__ in _TRANSPORT_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class RetryWindow:
    """Retry transient failures with exponential backoff until ``window_s`` has passed since
    the first one; ``window_s=0`` tries once."""

    window_s: float = 90.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 5.0

    @property
    def policy(self) -> RetryPolicy:
        """The common retry policy this window is: no cap on attempts, a cap on time."""

        return RetryPolicy(max_retries=None, backoff_initial_s=self.backoff_initial_s,
                           backoff_max_s=self.backoff_max_s, window_s=self.window_s)

    async def call(self, fn: Callable[[], Awaitable[T]], *, what: str,
                   on_retry: Callable[[BaseException], None] | None = None) -> T:
        """``await fn()``, again after each transient failure while the window lasts."""

        return await retry_call(
            fn, self.policy, is_retryable=is_transient, what=what, log_level=logging.WARNING,
            on_retry=None if on_retry is None else (lambda failed: on_retry(failed.error)))
