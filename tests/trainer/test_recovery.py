"""Which failures the run waits out (a service down) and which it does not (a mistake), and
the retry window itself. The kill tests in tests/faults show it against real services."""

from __future__ import annotations

import asyncio
import time

import pytest

from mcprl_common.http import ServiceCallError
from mcprl_trainer.mcp_tools import McpUnavailableError
from mcprl_trainer.policy import PolicyError
from mcprl_trainer.recovery import RetryWindow, is_transient

pytestmark = pytest.mark.timeout(30)


def _chained(outer: Exception, cause: BaseException) -> Exception:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(("exc", "transient"), [
    (ServiceCallError("u", None, "ConnectError"), True),
    (ServiceCallError("u", 503, "down"), True),
    (ServiceCallError("u", 429, "slow down"), True),
    (ServiceCallError("u", 400, "bad request"), False),
    (ServiceCallError("u", 404, "no such model"), False),
    (PolicyError("engine down", status=None), False),  # no cause: an unusable answer
    (_chained(PolicyError("x", status=None), ServiceCallError("u", None, "refused")), True),
    (PolicyError("x", status=502), True),
    (McpUnavailableError("dropped"), True),
    (ConnectionRefusedError(), True),
    (TimeoutError(), True),
    (FileNotFoundError("no such scenario dir"), False),
    (ValueError("judge returned 3 scores for 4 trajectories"), False),
    (_chained(RuntimeError("wrapped"), ConnectionResetError()), True),
])
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


async def test_window_retries_until_the_service_is_back() -> None:
    calls: list[float] = []
    seen: list[BaseException] = []

    async def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise ServiceCallError("u", None, "refused")
        return "ok"

    window = RetryWindow(window_s=10, backoff_initial_s=0.01, backoff_max_s=0.05)
    assert await window.call(flaky, what="x", on_retry=seen.append) == "ok"
    assert len(calls) == 4 and len(seen) == 3


async def test_window_gives_up_after_its_time_and_never_retries_mistakes() -> None:
    attempts = [0]

    async def down() -> None:
        attempts[0] += 1
        raise ServiceCallError("u", 503, "down")

    started = time.monotonic()
    with pytest.raises(ServiceCallError):
        await RetryWindow(window_s=0.3, backoff_initial_s=0.02, backoff_max_s=0.05).call(
            down, what="x")
    assert 0.3 <= time.monotonic() - started < 2 and attempts[0] > 2

    attempts[0] = 0

    async def wrong() -> None:
        attempts[0] += 1
        raise ServiceCallError("u", 400, "bad")

    with pytest.raises(ServiceCallError):
        await RetryWindow(window_s=5).call(wrong, what="x")
    assert attempts[0] == 1
    with pytest.raises(asyncio.CancelledError):  # cancellation is never swallowed
        async def cancelled() -> None:
            raise asyncio.CancelledError
        await RetryWindow(window_s=5).call(cancelled, what="x")
