"""Evaluation on the val split: ``samples`` rollouts per scenario with the current policy.

Success is the verifiable verdict (the judge's ``verifiable`` component, 0/1) when the
scenario has a ground truth, else ``score >= success_threshold``. Also: mean reward, mean
turns, tool error rate (errors per tool call attempt) and finish reasons.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from mcprl_common.wire import Scenario
from mcprl_trainer.groups import GroupBatch, GroupRunner, ScoredGroup
from mcprl_trainer.records import RolloutResult
from mcprl_trainer.rollout import RolloutSettings


def is_success(result: RolloutResult, threshold: float) -> bool:
    return success_of(result.reward, result.components,
                      result.scenario.ground_truth is not None, threshold)


def success_of(reward: float | None, components: dict[str, float], has_ground_truth: bool,
               threshold: float) -> bool:
    """Success as the module docstring defines it, on plain values (the run report reads
    them back from the rollouts JSONL)."""

    if reward is None:
        return False
    if has_ground_truth and "verifiable" in components:
        return components["verifiable"] >= 1.0
    return reward >= threshold


@dataclass
class RolloutStats:
    n: int = 0
    success_rate: float = 0.0
    mean_reward: float = 0.0
    mean_turns: float = 0.0
    tool_error_rate: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def rollout_stats(results: list[RolloutResult], threshold: float) -> RolloutStats:
    scored = [r for r in results if r.reward is not None]
    if not scored:
        return RolloutStats()
    attempts = sum(r.trajectory.tool_calls + r.trajectory.malformed_tool_calls for r in scored)
    errors = sum(r.trajectory.tool_errors for r in scored)
    n = len(scored)
    return RolloutStats(
        n=n,
        success_rate=sum(is_success(r, threshold) for r in scored) / n,
        mean_reward=sum(r.reward or 0.0 for r in scored) / n,
        mean_turns=sum(r.trajectory.num_turns for r in scored) / n,
        tool_error_rate=errors / attempts if attempts else 0.0,
        tool_calls=attempts,
        tool_errors=errors,
        finish_reasons=dict(Counter(r.trajectory.finish_reason for r in scored)),
    )


@dataclass
class EvalResult:
    step: int
    model: str
    stats: RolloutStats
    failed_groups: int
    seconds: float
    groups: list[ScoredGroup] = field(default_factory=list)  # the rollouts, for the report

    def as_dict(self) -> dict:
        return {"step": self.step, "model": self.model, **self.stats.as_dict(),
                "failed_groups": self.failed_groups, "seconds": round(self.seconds, 3)}


async def evaluate(runner: GroupRunner, scenarios: list[Scenario], *, step: int, model: str,
                   settings: RolloutSettings, seed: int, threshold: float,
                   samples: int = 1) -> EvalResult:
    """``samples`` rollouts per val scenario (one group each), scored by the judge; the
    same seeds at every eval, so before and after see the same sampling noise."""

    batch: GroupBatch = await runner.run(scenarios, group_size=samples, model=model,
                                         settings=settings, seed_parts=(seed, "eval"))
    results = [r for g in batch.ok for r in g.results]
    return EvalResult(step, model, rollout_stats(results, threshold), len(batch.failed),
                      batch.rollout_seconds + batch.judge_seconds, batch.groups)
