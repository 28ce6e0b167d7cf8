"""Groups of rollouts: G per scenario, S scenarios per step, at most ``concurrency`` in flight.

Each group goes to the judge as soon as its own G rollouts are done, while other groups are
still sampling, so judging overlaps rollouts. A rollout or judgement cut by a failing
service (infrastructure, not the agent) is started again from scratch while the retry window
lasts (:mod:`mcprl_trainer.recovery`), so nothing half-made is ever trained on; a group that
still fails is dropped and counted, and the step goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mcprl_common.wire import RewardConfig, Scenario
from mcprl_trainer.judge_client import JudgeClient
from mcprl_trainer.mcp_tools import McpUnavailableError, open_session
from mcprl_trainer.policy import PolicyError
from mcprl_trainer.records import RolloutResult, derive_seed
from mcprl_trainer.recovery import RetryWindow
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.rollout import RolloutSettings, Sampler, run_rollout

log = logging.getLogger(__name__)


@dataclass
class ScoredGroup:
    scenario: Scenario
    results: list[RolloutResult]
    error: str | None = None

    @property
    def rewards(self) -> list[float]:
        return [r.reward if r.reward is not None else 0.0 for r in self.results]


@dataclass
class GroupBatch:
    groups: list[ScoredGroup]
    rollout_seconds: float = 0.0  # until the last rollout finished
    judge_seconds: float = 0.0  # judging left after the last rollout (not overlapped)
    judge_busy_seconds: float = 0.0  # summed time of all judge calls
    failed: list[ScoredGroup] = field(default_factory=list)
    rollouts_retried: int = 0  # attempts cut by a failing service and started again
    rollouts_dropped: int = 0  # rollouts given up after the retry window
    judge_retried: int = 0

    @property
    def ok(self) -> list[ScoredGroup]:
        return [g for g in self.groups if g.error is None]


@dataclass(frozen=True)
class McpTarget:
    url: str
    auth_token: str | None = None
    timeout_s: float = 30.0


def failure_source(exc: BaseException) -> str:
    """Which service an infrastructure failure came from: engine | mcp | other."""

    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, PolicyError):
            return "engine"
        if isinstance(current, McpUnavailableError):
            return "mcp"
        current = current.__cause__
    return "other"


# What the trainer hears about recovery: (event, source), e.g. ("rollout_retried", "mcp").
RecoveryHook = Callable[[str, str], None]


class GroupRunner:
    """Runs and scores groups of rollouts for one step (or one eval pass)."""

    def __init__(self, *, sampler: Sampler, renderer: ChatRenderer, mcp: McpTarget,
                 judge: JudgeClient, reward: RewardConfig, concurrency: int,
                 retry: RetryWindow | None = None,
                 on_recovery: RecoveryHook | None = None) -> None:
        self.sampler = sampler
        self.renderer = renderer
        self.mcp = mcp
        self.judge = judge
        self.reward = reward
        self.concurrency = concurrency
        self.retry = retry or RetryWindow(window_s=0.0)
        self.on_recovery = on_recovery

    def _event(self, event: str, exc: BaseException, source: str | None = None) -> None:
        if self.on_recovery is not None:
            self.on_recovery(event, source or failure_source(exc))

    async def _rollout(self, sem: asyncio.Semaphore, scenario: Scenario, model: str,
                       settings: RolloutSettings, seed: int, sampler: Sampler) -> RolloutResult:
        async with sem, open_session(self.mcp.url, auth_token=self.mcp.auth_token,
                                     timeout_s=self.mcp.timeout_s) as session:
            return await run_rollout(scenario, sampler=sampler, model=model,
                                     renderer=self.renderer, session=session,
                                     settings=settings, seed=seed)

    async def run(
        self,
        scenarios: list[Scenario],
        *,
        group_size: int,
        model: str,
        settings: RolloutSettings,
        seed_parts: tuple,
        on_rollout: Callable[[RolloutResult], None] | None = None,
        on_group: Callable[[ScoredGroup], Awaitable[None] | None] | None = None,
    ) -> GroupBatch:
        sem = asyncio.Semaphore(self.concurrency)
        started = time.perf_counter()
        last_rollout = [started]
        judge_busy = [0.0]
        counts = {"retried": 0, "dropped": 0, "judge_retried": 0}

        def rollout_retried(exc: BaseException) -> None:
            counts["retried"] += 1
            self._event("rollout_retried", exc)

        async def one(gi: int, mi: int, scenario: Scenario, sampler: Sampler) -> RolloutResult:
            seed = derive_seed(*seed_parts, gi, mi)
            try:  # every attempt starts from scratch: a new session, the same seeds
                result = await self.retry.call(
                    lambda: self._rollout(sem, scenario, model, settings, seed, sampler),
                    what="rollout", on_retry=rollout_retried)
            except Exception as exc:
                counts["dropped"] += 1
                self._event("rollout_dropped", exc)
                raise
            last_rollout[0] = max(last_rollout[0], time.perf_counter())
            if on_rollout is not None:
                on_rollout(result)
            return result

        async def group(gi: int, scenario: Scenario) -> ScoredGroup:
            # With several engines a group samples on one (its shared prompt cached there).
            bound = self.sampler.for_group() if hasattr(self.sampler, "for_group") \
                else self.sampler
            try:
                outcomes = await asyncio.gather(
                    *(one(gi, mi, scenario, bound) for mi in range(group_size)),
                    return_exceptions=True)
            finally:
                if hasattr(bound, "release"):
                    bound.release()
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            results = [o for o in outcomes if isinstance(o, RolloutResult)]
            if failures:
                msg = f"{len(failures)} rollout(s) failed: {type(failures[0]).__name__}: " \
                      f"{failures[0]}"
                log.warning("group dropped", extra={"scenario": scenario.id, "reason": msg})
                scored = ScoredGroup(scenario, results, msg)
            else:
                scored = await self._score(scenario, results, judge_busy, counts)
            if on_group is not None:
                maybe = on_group(scored)
                if asyncio.iscoroutine(maybe):
                    await maybe
            return scored

        groups = await asyncio.gather(*(group(gi, s) for gi, s in enumerate(scenarios)))
        done = time.perf_counter()
        return GroupBatch(
            groups=list(groups),
            rollout_seconds=last_rollout[0] - started,
            judge_seconds=max(0.0, done - last_rollout[0]),
            judge_busy_seconds=judge_busy[0],
            failed=[g for g in groups if g.error is not None],
            rollouts_retried=counts["retried"],
            rollouts_dropped=counts["dropped"],
            judge_retried=counts["judge_retried"],
        )

    async def _score(self, scenario: Scenario, results: list[RolloutResult],
                     busy: list[float], counts: dict[str, int]) -> ScoredGroup:
        def retried(exc: BaseException) -> None:
            counts["judge_retried"] += 1
            self._event("judge_retried", exc, "judge")

        t0 = time.perf_counter()
        try:
            response = await self.retry.call(
                lambda: self.judge.score_group(scenario, [r.trajectory for r in results],
                                               self.reward),
                what="judging a group", on_retry=retried)
        except Exception as exc:  # the judge being down must not kill the step
            log.warning("judge failed", extra={"scenario": scenario.id, "reason": str(exc)})
            return ScoredGroup(scenario, results, f"judge: {type(exc).__name__}: {exc}")
        finally:
            busy[0] += time.perf_counter() - t0
        for result, score in zip(results, response.scores, strict=True):
            result.reward = score.score
            result.components = dict(score.components)
            result.explanation = score.explanation
        return ScoredGroup(scenario, results)
