"""The judge model: any OpenAI-compatible chat API (OpenRouter, OpenAI, vLLM, our engine).

One place for what every upstream call needs: a per-request model, a timeout, retries with
backoff on 429/5xx and connection errors (honouring Retry-After), a concurrency limit, and
the token and cost account. Failures become the service errors clients understand: 503 with
Retry-After while the upstream is unreachable, 502 when it answers with something unusable.
The API key is never logged, and never echoed back from an upstream error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import openai

from mcprl_common.errors import BadRequestError, UpstreamError, UpstreamUnavailableError
from mcprl_common.http import RETRY_STATUS, openai_client
from mcprl_common.logging import redact
from mcprl_common.retry import retry_call
from mcprl_common.wire import Usage
from mcprl_judge.metrics import JudgeMetrics
from mcprl_judge.settings import JudgeSettings


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class StructuredOutputRejected(Exception):
    """The upstream refused a request that carried ``response_format`` (HTTP 400/422)."""


class _Transient(Exception):
    """One attempt failed in a way worth retrying; ``reason`` is safe to log and return."""

    def __init__(self, reason: str, retry_after: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def add_usage(usage: Usage, completion: Completion) -> None:
    usage.prompt_tokens += completion.prompt_tokens
    usage.completion_tokens += completion.completion_tokens
    usage.cost_usd = round(usage.cost_usd + completion.cost_usd, 10)
    usage.upstream_calls += 1


class JudgeUpstream:
    """Chat completions against the configured judge upstream."""

    def __init__(self, settings: JudgeSettings, metrics: JudgeMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        # The SDK's own retries are off: ours count failures and honour our backoff caps.
        self._client = openai_client(settings, max_retries=0)
        self._secret = settings.api_key.get_secret_value()
        self._policy = settings.retry_policy()
        self._semaphore = asyncio.Semaphore(settings.max_concurrency)

    async def aclose(self) -> None:
        await self._client.close()

    def scrub(self, text: str) -> str:
        """Upstream error text without our key (some providers echo part of it) or tokens."""

        if self._secret and self._secret != "EMPTY" and len(self._secret) >= 4:
            text = text.replace(self._secret, "***")
        return redact(text)[:500]

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str,
        response_format: dict[str, Any] | None,
        max_tokens: int,
        model_overridden: bool = False,
    ) -> Completion:
        """One chat completion, retried on transient failures; raises service errors."""

        kwargs: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        if self.settings.extra_body:
            kwargs["extra_body"] = self.settings.extra_body
        try:
            return await retry_call(
                lambda: self._attempt(kwargs, model, response_format, model_overridden),
                self._policy, is_retryable=lambda exc: isinstance(exc, _Transient),
                retry_after=lambda exc: getattr(exc, "retry_after", None),
                what="judge upstream call", log_extra={"model": model})
        except _Transient as last:
            hint = self.settings.retry_after_s
            if last.retry_after:
                with contextlib.suppress(ValueError):
                    hint = max(1, int(float(last.retry_after)))
            raise UpstreamUnavailableError(
                f"judge model upstream unavailable after {self.settings.max_retries + 1} "
                f"attempts: {last.reason}", retry_after_s=hint) from None

    async def _attempt(self, kwargs: dict[str, Any], model: str,
                       response_format: dict[str, Any] | None,
                       model_overridden: bool) -> Completion:
        """One upstream call; every outcome is counted (per attempt) before it is raised."""

        try:
            return await self._call(kwargs)
        except openai.APIConnectionError as exc:  # includes timeouts
            kind = "timeout" if isinstance(exc, openai.APITimeoutError) else "connection"
            self.metrics.upstream_requests.labels(f"{kind}_error").inc()
            self.metrics.failures.labels("upstream_unavailable").inc()
            raise _Transient(f"{kind} error ({type(exc).__name__})") from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            message = self.scrub(_status_message(exc))
            if status not in RETRY_STATUS:
                self.metrics.upstream_requests.labels("rejected").inc()
                self.metrics.failures.labels("upstream_rejected").inc()
                raise self._rejected(status, message, model, response_format,
                                     model_overridden) from None
            self.metrics.upstream_requests.labels(f"http_{status}").inc()
            self.metrics.failures.labels("upstream_status").inc()
            raise _Transient(f"HTTP {status}: {message}",
                             exc.response.headers.get("retry-after")) from None
        except openai.APIError as exc:  # an answer the SDK could not read
            self.metrics.upstream_requests.labels("unreadable").inc()
            self.metrics.failures.labels("upstream_rejected").inc()
            raise UpstreamError(
                f"the judge upstream sent an unreadable answer ({type(exc).__name__}): "
                f"{self.scrub(str(exc))}") from None

    async def _call(self, kwargs: dict[str, Any]) -> Completion:
        async with self._semaphore:
            self.metrics.upstream_inflight.inc()
            start = time.perf_counter()
            try:
                resp = await self._client.chat.completions.create(**kwargs)
            finally:
                self.metrics.upstream_inflight.dec()
                self.metrics.upstream_duration.observe(time.perf_counter() - start)
        self.metrics.upstream_requests.labels("ok").inc()
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        usage = resp.usage
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        cost = _reported_cost(usage)
        if cost is None:
            cost = (prompt_tokens * self.settings.cost_per_prompt_token_usd
                    + completion_tokens * self.settings.cost_per_completion_token_usd)
        self.metrics.upstream_tokens.labels("prompt").inc(prompt_tokens)
        self.metrics.upstream_tokens.labels("completion").inc(completion_tokens)
        self.metrics.cost.inc(cost)
        return Completion(text, choice.finish_reason if choice else None, prompt_tokens,
                          completion_tokens, cost)

    def _rejected(self, status: int, message: str, model: str,
                  response_format: dict[str, Any] | None, model_overridden: bool) -> Exception:
        if response_format is not None and status in (400, 422):
            return StructuredOutputRejected(f"HTTP {status}: {message}")
        if status == 404 and model_overridden:
            return BadRequestError(
                f"judge_model {model!r} is unknown to the judge upstream: {message}",
                param="judge_model")
        if status in (401, 403):
            return UpstreamError(
                f"the judge upstream rejected our credentials (HTTP {status}); check "
                f"JUDGE_API_KEY: {message}")
        return UpstreamError(f"the judge upstream answered HTTP {status}: {message}")


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(exc.message)


def _reported_cost(usage: Any) -> float | None:
    """OpenRouter reports the cost of a call in ``usage.cost``; other upstreams do not."""

    extra = getattr(usage, "model_extra", None) or {}
    cost = extra.get("cost")
    if isinstance(cost, int | float) and cost >= 0:
        return float(cost)
    return None
