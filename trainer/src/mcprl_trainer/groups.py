"""Groups of rollouts: G per scenario, S scenarios per step, at most ``concurrency`` in flight.

Each group goes to the judge as soon as its own G rollouts are done, while other groups are
still sampling, so judging overlaps rollouts. A group whose rollouts or judgement failed
(infrastructure, not the agent) is dropped and counted; the step goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mcprl_common.wire import RewardConfig, Scenario
from mcprl_trainer.judge_client import JudgeClient
from mcprl_trainer.mcp_tools import open_session
from mcprl_trainer.records import RolloutResult, derive_seed
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

    @property
    def ok(self) -> list[ScoredGroup]:
        return [g for g in self.groups if g.error is None]


@dataclass(frozen=True)
class McpTarget:
    url: str
    auth_token: str | None = None
    timeout_s: float = 30.0


class GroupRunner:
    """Runs and scores groups of rollouts for one step (or one eval pass)."""

    def __init__(self, *, sampler: Sampler, renderer: ChatRenderer, mcp: McpTarget,
                 judge: JudgeClient, reward: RewardConfig, concurrency: int) -> None:
        self.sampler = sampler
        self.renderer = renderer
        self.mcp = mcp
        self.judge = judge
        self.reward = reward
        self.concurrency = concurrency

    async def _rollout(self, sem: asyncio.Semaphore, scenario: Scenario, model: str,
                       settings: RolloutSettings, seed: int) -> RolloutResult:
        async with sem, open_session(self.mcp.url, auth_token=self.mcp.auth_token,
                                     timeout_s=self.mcp.timeout_s) as session:
            return await run_rollout(scenario, sampler=self.sampler, model=model,
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

        async def one(gi: int, mi: int, scenario: Scenario) -> RolloutResult:
            result = await self._rollout(sem, scenario, model, settings,
                                         derive_seed(*seed_parts, gi, mi))
            last_rollout[0] = max(last_rollout[0], time.perf_counter())
            if on_rollout is not None:
                on_rollout(result)
            return result

        async def group(gi: int, scenario: Scenario) -> ScoredGroup:
            outcomes = await asyncio.gather(
                *(one(gi, mi, scenario) for mi in range(group_size)), return_exceptions=True
            )
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            results = [o for o in outcomes if isinstance(o, RolloutResult)]
            if failures:
                msg = f"{len(failures)} rollout(s) failed: {type(failures[0]).__name__}: " \
                      f"{failures[0]}"
                log.warning("group dropped", extra={"scenario": scenario.id, "reason": msg})
                scored = ScoredGroup(scenario, results, msg)
            else:
                scored = await self._score(scenario, results, judge_busy)
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
        )

    async def _score(self, scenario: Scenario, results: list[RolloutResult],
                     busy: list[float]) -> ScoredGroup:
        t0 = time.perf_counter()
        try:
            response = await self.judge.score_group(
                scenario, [r.trajectory for r in results], self.reward
            )
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
