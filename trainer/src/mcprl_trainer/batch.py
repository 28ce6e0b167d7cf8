"""Scored groups -> the step's training samples and statistics (pure, no I/O).

Each rollout's token record is flattened as sampled (ids, mask, sampler log-probs); its
advantage comes from its group. Zero-variance groups are skipped (when configured) and
counted, as are groups that failed (rollout or judge infrastructure).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mcprl_trainer.advantages import group_advantages, shuffled_group_rewards
from mcprl_trainer.config import TrainConfig
from mcprl_trainer.evaluate import rollout_stats
from mcprl_trainer.groups import GroupBatch
from mcprl_trainer.grpo import TrainSample


@dataclass
class StepBatch:
    samples: list[TrainSample]
    metrics: dict[str, float] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    tool_errors: dict[str, int] = field(default_factory=dict)


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def build_step_batch(batch: GroupBatch, train: TrainConfig, *, seed: int, step: int,
                     success_threshold: float) -> StepBatch:
    samples: list[TrainSample] = []
    zero_variance = 0
    rewards_all: list[float] = []
    results_all = []
    for gi, group in enumerate(batch.ok):
        rewards = group.rewards
        rewards_all += rewards
        results_all += group.results
        if train.shuffle_rewards:
            rewards = shuffled_group_rewards(rewards, seed=seed, step=step, group=gi)
        adv = group_advantages(rewards, scale=train.scale_advantages)
        for result, a in zip(group.results, adv.advantages, strict=True):
            result.advantage = a  # recorded with the rollout, trained on or not
        if adv.zero_variance:
            zero_variance += 1
            if train.skip_zero_variance:
                continue
        for result, a in zip(group.results, adv.advantages, strict=True):
            ids, mask, lps = result.tokens.flatten()
            if ids:
                samples.append(TrainSample(ids, mask, lps, a))
    stats = rollout_stats(results_all, success_threshold)
    reward_mean, reward_std = _mean_std(rewards_all)
    advs = [s.advantage for s in samples]
    adv_mean, adv_std = _mean_std(advs)
    sampled = sum(r.tokens.sampled_tokens for r in results_all)
    tool_errors: Counter = Counter()
    for r in results_all:
        tool_errors.update(r.tool_errors)
    metrics = {
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "success_rate": stats.success_rate,
        "mean_turns": stats.mean_turns,
        "tool_error_rate": stats.tool_error_rate,
        "rollouts": float(len(results_all)),
        "groups_total": float(len(batch.groups)),
        "groups_failed": float(len(batch.failed)),
        "groups_zero_variance": float(zero_variance),
        "groups_trained": float(len(batch.ok) - (zero_variance if train.skip_zero_variance
                                                 else 0)),
        "adv_mean": adv_mean,
        "adv_std": adv_std,
        "adv_abs_mean": sum(abs(a) for a in advs) / len(advs) if advs else 0.0,
        "sampled_tokens": float(sampled),
        "rollout_tokens_per_s": sampled / batch.rollout_seconds if batch.rollout_seconds else 0.0,
        "rollout_seconds": batch.rollout_seconds,
        "judge_seconds": batch.judge_seconds,
        "judge_busy_seconds": batch.judge_busy_seconds,
    }
    return StepBatch(samples, metrics, stats.finish_reasons, dict(tool_errors))
