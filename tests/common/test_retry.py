"""The one retry loop: caps by count and by time, retries only what is retryable, honours
Retry-After, and reports each retried attempt."""

from __future__ import annotations

import asyncio

import pytest

from mcprl_common.retry import FailedAttempt, RetryPolicy, retry_call

FAST = RetryPolicy(max_retries=3, backoff_initial_s=0.001, backoff_max_s=0.002)


class Flaky:
    def __init__(self, failures: int, exc: type[Exception] = ConnectionError) -> None:
        self.failures, self.exc, self.calls = failures, exc, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc(f"failure {self.calls}")
        return "ok"


def run(fn: Flaky, policy: RetryPolicy = FAST, **kw) -> str:
    return asyncio.run(retry_call(fn, policy, is_retryable=lambda e: isinstance(e, ConnectionError),
                                  **kw))


def test_retries_until_success_and_reports_each_attempt() -> None:
    seen: list[FailedAttempt] = []
    assert run(Flaky(2), on_retry=seen.append) == "ok"
    assert [a.number for a in seen] == [1, 2]
    assert all(isinstance(a.error, ConnectionError) and 0 < a.wait_s <= 0.002 for a in seen)


def test_gives_up_after_max_retries_with_the_last_error() -> None:
    fn = Flaky(10)
    with pytest.raises(ConnectionError, match="failure 4"):
        run(fn)
    assert fn.calls == 4


def test_not_retryable_fails_at_once() -> None:
    fn = Flaky(1, ValueError)
    with pytest.raises(ValueError):
        run(fn)
    assert fn.calls == 1


def test_window_zero_tries_once() -> None:
    fn = Flaky(1)
    with pytest.raises(ConnectionError):
        run(fn, RetryPolicy(max_retries=None, window_s=0.0))
    assert fn.calls == 1


def test_delay_honours_retry_after_capped_and_backs_off_with_jitter() -> None:
    policy = RetryPolicy(backoff_initial_s=1.0, backoff_max_s=4.0)
    assert policy.delay(0, "2") == 2.0 and policy.delay(0, "60") == 4.0
    assert 0.5 <= policy.delay(0) <= 1.0 and 2.0 <= policy.delay(5) <= 4.0
    assert 0.5 <= policy.delay(0, "soon") <= 1.0


def test_the_log_line_says_why_in_plain_text(caplog: pytest.LogCaptureFixture) -> None:
    """A bench's stderr keeps the message only, not the extras: the reason is in it."""

    with caplog.at_level("INFO", logger="mcprl_common.retry"):
        run(Flaky(1), what="held-out rollout sc-1")
    (record,) = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert record.getMessage().startswith("held-out rollout sc-1 failed, retrying in 0.0 s "
                                          "(attempt 1): ConnectionError: failure 1")
    assert record.reason == "ConnectionError: failure 1" and record.attempt == 1
