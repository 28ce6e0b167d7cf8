"""Scoring a group: validate, judge (cached, deduplicated), check answers, combine.

No web framework here: routes call :meth:`JudgeService.score_group` and the common error
handlers turn the service errors it raises into JSON with the right status.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Any

from prometheus_client import CollectorRegistry

from mcprl_common.errors import (
    BadRequestError,
    PayloadTooLargeError,
    ServiceError,
    UpstreamError,
    UpstreamUnavailableError,
)
from mcprl_common.wire import RewardConfig, ScoreGroupRequest, ScoreGroupResponse, Usage
from mcprl_judge.cache import JudgementCache, cache_key
from mcprl_judge.combine import GroupContext, combine
from mcprl_judge.judge_output import JudgeAnswer, Judgement
from mcprl_judge.metrics import JudgeMetrics
from mcprl_judge.ruler import (
    DEFAULT_RUBRIC,
    RulerJudge,
    RulerPrompt,
    RulerVerdict,
    build_prompt,
)
from mcprl_judge.settings import JudgeSettings
from mcprl_judge.upstream import JudgeUpstream
from mcprl_judge.validate import check_request

log = logging.getLogger(__name__)


class JudgeService:
    """The judge's logic, one instance per app."""

    def __init__(self, settings: JudgeSettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.metrics = JudgeMetrics(registry)
        self.upstream = JudgeUpstream(settings, self.metrics)
        self.ruler = RulerJudge(settings, self.upstream, self.metrics)
        self.cache: JudgementCache | None = None
        self.cache_error: str | None = None
        if settings.cache_enabled:
            try:
                self.cache = JudgementCache(settings.cache_path, settings.cache_ttl_s)
            except (OSError, sqlite3.Error) as exc:  # read-only or full volume: judge uncached
                self.cache_error = f"{type(exc).__name__}: {exc}"
                self.metrics.failures.labels("cache").inc()
                log.error("judge cache unusable, scoring without it", extra={
                    "cache_path": str(settings.cache_path), "reason": self.cache_error})
        self._inflight: dict[str, asyncio.Future[RulerVerdict]] = {}

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.cache is not None:
            self.cache.close()

    @property
    def rubric(self) -> str:
        return self.settings.default_rubric or DEFAULT_RUBRIC

    def effective_config(self, req: ScoreGroupRequest) -> RewardConfig:
        """The request's reward config, with the deployment's mode when it names none."""

        explicit = "reward" in req.model_fields_set and "mode" in req.reward.model_fields_set
        if explicit:
            return req.reward
        return req.reward.model_copy(update={"mode": self.settings.default_mode})

    async def score_group(self, req: ScoreGroupRequest) -> ScoreGroupResponse:
        start = time.perf_counter()
        outcome = "error"
        try:
            resp = await self._score(req)
            outcome = "ok"
            for s in resp.scores:
                self.metrics.score.observe(s.score)
            return resp
        except (BadRequestError, PayloadTooLargeError):
            outcome = "bad_request"
            raise
        except UpstreamUnavailableError:
            outcome = "upstream_unavailable"
            raise
        except UpstreamError:
            outcome = "upstream_error"
            raise
        except ServiceError as exc:
            outcome = "bad_request" if exc.status_code < 500 else "error"
            raise
        finally:
            self.metrics.requests.labels(outcome).inc()
            self.metrics.duration.observe(time.perf_counter() - start)

    async def _score(self, req: ScoreGroupRequest) -> ScoreGroupResponse:
        config = self.effective_config(req)
        check_request(req, config.mode, self.settings.max_group_size)
        ctx = GroupContext(request=req, config=config)
        usage = Usage()
        cached = False
        judge_model = None
        if config.mode in ("ruler", "weighted"):
            judge_model = (req.judge_model or self.settings.model).strip()
            prompt = self._prompt(req)
            verdict, cached = await self._judge(prompt, judge_model,
                                                model_overridden=req.judge_model is not None,
                                                use_cache=req.use_cache)
            usage = verdict.usage if not cached else Usage()
            ctx.ruler = [verdict.judgements[u] for u in prompt.assignment]
        scores = combine(ctx)
        log.info("scored group", extra={
            "scenario": req.scenario.id, "mode": config.mode, "trajectories": len(scores),
            "cached": cached, "upstream_calls": usage.upstream_calls,
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens})
        return ScoreGroupResponse(scores=scores, judge_model=judge_model, cached=cached,
                                  usage=usage)

    def _prompt(self, req: ScoreGroupRequest) -> RulerPrompt:
        prompt = build_prompt(req.scenario.task, req.trajectories, req.rubric or self.rubric,
                              self.settings.explanation_max_chars)
        if prompt.chars > self.settings.max_request_chars:
            raise PayloadTooLargeError(
                f"trajectories: the group serialises to {prompt.chars} characters for the "
                f"judge, at most {self.settings.max_request_chars} (JUDGE_MAX_REQUEST_CHARS)",
                param="trajectories")
        return prompt

    async def _judge(self, prompt: RulerPrompt, model: str, *, model_overridden: bool,
                     use_cache: bool) -> tuple[RulerVerdict, bool]:
        """RULER's verdict for the group: from the cache, a concurrent twin, or the judge."""

        key = cache_key(model, prompt.messages)
        if self.cache is not None and use_cache:
            hit = await self._cache_get(key)
            if hit is not None and len(hit.judgements) == prompt.unique:
                self.metrics.cache_hits.inc()
                return RulerVerdict(hit.judgements), True
        self.metrics.cache_misses.inc()
        twin = self._inflight.get(key)
        if twin is not None:  # the same group is being judged right now: share the answer
            shared = await asyncio.shield(twin)
            return RulerVerdict(shared.judgements), True
        future: asyncio.Future[RulerVerdict] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            verdict = await self.ruler.judge(prompt, model, model_overridden=model_overridden)
            future.set_result(verdict)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: twins re-raise it, nobody else must
            raise
        finally:
            self._inflight.pop(key, None)
        if self.cache is not None:
            await self._cache_put(key, model, verdict.judgements)
        return verdict, False

    async def _cache_get(self, key: str) -> JudgeAnswer | None:
        assert self.cache is not None
        try:
            return await self.cache.get(key)
        except Exception as exc:  # a broken cache must not fail scoring
            self.metrics.failures.labels("cache").inc()
            log.warning("cache read failed", extra={"reason": f"{type(exc).__name__}: {exc}"})
            return None

    async def _cache_put(self, key: str, model: str, judgements: list[Judgement]) -> None:
        assert self.cache is not None
        try:
            await self.cache.put(key, model, JudgeAnswer(judgements=judgements))
        except Exception as exc:
            self.metrics.failures.labels("cache").inc()
            log.warning("cache write failed", extra={"reason": f"{type(exc).__name__}: {exc}"})

    def defaults(self) -> dict[str, Any]:
        s = self.settings
        return {"judge_model": s.model, "rubric": self.rubric, "mode": s.default_mode,
                "max_group_size": s.max_group_size, "structured_output": s.structured_output,
                "cache_enabled": s.cache_enabled}

    async def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"judge_model": self.settings.model,
                               "cache_enabled": self.cache is not None}
        if self.cache_error:
            out["cache_error"] = self.cache_error
        return out
