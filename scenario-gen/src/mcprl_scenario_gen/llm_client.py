"""The generator LLM: one batch of scenarios per call, structured output or a robust fallback.

With ``json_schema`` support (OpenAI, vLLM, our engine) the reply is constrained to the batch
schema. Without it (many OpenRouter models, old servers) the prompt carries the schema, the
reply is mined for JSON (:mod:`mcprl_scenario_gen.extract`) and validated, and an invalid
reply goes back to the model with the validation error for a bounded number of repairs.
``auto`` starts with json_schema and switches to the fallback for good when the provider
answers 400 about ``response_format``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import openai

from mcprl_common.http import openai_call, openai_client
from mcprl_common.settings import UpstreamSettings
from mcprl_scenario_gen.errors import LlmOutputError, LlmUnavailableError
from mcprl_scenario_gen.extract import ExtractionError, ParsedBatch, batch_json_schema, parse_batch
from mcprl_scenario_gen.metrics import GenMetrics
from mcprl_scenario_gen.settings import JsonSchemaMode
from mcprl_scenario_gen.strategies.base import Progress

log = logging.getLogger(__name__)
_FORMAT_WORDS = ("response_format", "json_schema", "structured output", "guided_json",
                 "response format")

REPAIR = (
    "That reply could not be used: {error}.\n"
    "Reply again with only the JSON object, exactly of the form "
    '{{"scenarios": [{{"task": "...", "difficulty": 3}}]}} (difficulty an integer 1-5), '
    "no prose and no code fences."
)
FALLBACK_FORMAT = (
    "\n\nReply with only a JSON object valid against this JSON schema, with no prose before "
    "or after it and no code fences:\n{schema}"
)


def mentions_response_format(exc: openai.APIStatusError) -> bool:
    text = f"{exc.message} {exc.body}".lower()
    return any(word in text for word in _FORMAT_WORDS)


class GeneratorLLM:
    """Calls the generator and counts calls and tokens into ``progress`` and ``metrics``."""

    def __init__(
        self,
        upstream: UpstreamSettings,
        *,
        model: str | None = None,
        mode: JsonSchemaMode = "auto",
        max_repairs: int = 2,
        max_tokens: int = 3000,
        temperature: float = 1.0,
        task_max_chars: int = 400,
        progress: Progress | None = None,
        metrics: GenMetrics | None = None,
        support_cache: dict[str, bool] | None = None,
    ) -> None:
        self.upstream = upstream
        # The SDK's own retries are off: the common policy retries (and logs) each attempt.
        self.client = openai_client(upstream, max_retries=0)
        self.retry = upstream.retry_policy()
        self.model = model or upstream.model
        self.mode = mode
        self.max_repairs = max_repairs
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.task_max_chars = task_max_chars
        self.progress = progress or Progress()
        self.metrics = metrics
        self._cache = support_cache if support_cache is not None else {}
        self._cache_key = f"{upstream.base_url}|{self.model}"
        self.use_schema = mode == "on" or (mode == "auto" and self._cache.get(self._cache_key,
                                                                               True))

    def schema(self, max_items: int) -> dict[str, Any]:
        schema = batch_json_schema(max_items)
        item = schema["properties"]["scenarios"]["items"]["properties"]["task"]
        item["maxLength"] = self.task_max_chars
        return schema

    def _count(self, outcome: str, usage: Any = None) -> None:
        self.progress.llm_calls += 1
        if outcome != "ok":
            self.progress.llm_failed_calls += 1
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        self.progress.prompt_tokens += prompt
        self.progress.completion_tokens += completion
        if self.metrics is not None:
            self.metrics.llm_calls.labels(outcome).inc()
            self.metrics.llm_tokens.labels("prompt").inc(prompt)
            self.metrics.llm_tokens.labels("completion").inc(completion)

    def _messages(self, messages: list[dict[str, str]], max_items: int) -> list[dict[str, str]]:
        if self.use_schema:
            return messages
        out = [dict(m) for m in messages]
        first_user = next(i for i, m in enumerate(out) if m["role"] == "user")
        out[first_user]["content"] += FALLBACK_FORMAT.format(
            schema=json.dumps(self.schema(max_items), separators=(",", ":")))
        return out

    async def _complete(self, messages: list[dict[str, str]], max_items: int,
                        seed: int | None) -> tuple[str, str | None, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model, "messages": self._messages(messages, max_items),
            "max_tokens": self.max_tokens, "temperature": self.temperature,
        }
        if seed is not None:
            kwargs["seed"] = seed
        if self.use_schema:
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "scenario_batch", "schema": self.schema(max_items), "strict": True}}
        try:
            resp = await openai_call(lambda: self.client.chat.completions.create(**kwargs),
                                     self.retry, what="generator call")
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            if self.use_schema and self.mode == "auto" and mentions_response_format(exc):
                log.warning("generator rejects json_schema; switching to the fallback",
                            extra={"model": self.model, "status": exc.status_code})
                self._count("unsupported")
                self.use_schema = False
                self._cache[self._cache_key] = False
                return await self._complete(messages, max_items, seed)
            self._count("error")
            raise LlmUnavailableError(
                f"the generator model {self.model!r} rejected the request "
                f"({exc.status_code}): {exc.message}") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            self._count("error")
            raise LlmUnavailableError(
                f"the generator at {self.upstream.base_url} is unreachable: "
                f"{type(exc).__name__}: {exc}") from None
        except openai.APIStatusError as exc:
            self._count("error")
            raise LlmUnavailableError(
                f"the generator at {self.upstream.base_url} answered {exc.status_code}: "
                f"{exc.message}") from None
        if not resp.choices:
            self._count("invalid", resp.usage)
            return "", None, resp.usage
        choice = resp.choices[0]
        return choice.message.content or "", choice.finish_reason, resp.usage

    async def ask_batch(self, messages: list[dict[str, str]], max_items: int,
                        seed: int | None = None) -> ParsedBatch:
        """A validated batch, repairing invalid replies in the conversation; else
        :class:`LlmOutputError` naming the last problem."""

        convo = [dict(m) for m in messages]
        problem = "no reply"
        attempts = 1 + self.max_repairs
        for attempt in range(attempts):
            text, finish, usage = await self._complete(
                convo, max_items, None if seed is None else seed * 100 + attempt)
            try:
                parsed = parse_batch(text)
            except ExtractionError as exc:
                self._count("invalid", usage)
                problem = str(exc)
                if finish == "length":
                    problem += " (the reply was cut off at max_tokens: write fewer, shorter tasks)"
                log.info("invalid generator reply", extra={"attempt": attempt + 1,
                                                           "problem": problem[:300]})
                convo += [{"role": "assistant", "content": text[:4000] or "(empty reply)"},
                          {"role": "user", "content": REPAIR.format(error=problem)}]
                continue
            self._count("ok", usage)
            return parsed
        mode = "json_schema" if self.use_schema else "prompt-only fallback"
        raise LlmOutputError(
            f"the generator model {self.model!r} returned no valid scenario batch in "
            f"{attempts} attempts ({mode}); last problem: {problem}")

    async def close(self) -> None:
        await self.client.close()
