"""Reward components and how they combine into one score per trajectory.

Each component (a small class in :data:`COMPONENTS`) turns a group into named values per
trajectory: ``ruler`` (the judge's relative score), ``verifiable`` and ``verifiable_partial``
(the ground-truth check) and the penalties (``penalty_*``, zero or negative). The reward
mode picks the base (RULER only, verifiable only, or weighted), penalties are added, and the
result is clipped to [0, 1]. Every component computed is named in the response, so a trainer
or a human can see why a trajectory got its score.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from mcprl_common.wire import RewardConfig, ScoreGroupRequest, TrajectoryScore
from mcprl_judge.answers import final_answer
from mcprl_judge.judge_output import Judgement
from mcprl_judge.verifiable import check_answer


@dataclass
class GroupContext:
    """A request with its effective reward config and, when judged, one RULER verdict each."""

    request: ScoreGroupRequest
    config: RewardConfig
    ruler: list[Judgement] | None = None


@dataclass
class ComponentValue:
    values: dict[str, float]
    note: str = ""


@dataclass
class _Row:
    values: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class RewardComponent(ABC):
    name: ClassVar[str]

    def applies(self, ctx: GroupContext) -> bool:
        return True

    @abstractmethod
    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        """One value set per trajectory of the group, in order."""


COMPONENTS: dict[str, RewardComponent] = {}


def register(cls: type[RewardComponent]) -> type[RewardComponent]:
    COMPONENTS[cls.name] = cls()
    return cls


@register
class RulerComponent(RewardComponent):
    name = "ruler"

    def applies(self, ctx: GroupContext) -> bool:
        return ctx.ruler is not None

    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        assert ctx.ruler is not None
        return [ComponentValue({"ruler": j.score}, j.explanation) for j in ctx.ruler]


@register
class VerifiableComponent(RewardComponent):
    name = "verifiable"

    def applies(self, ctx: GroupContext) -> bool:
        return ctx.request.scenario.ground_truth is not None

    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        truth = ctx.request.scenario.ground_truth
        assert truth is not None
        out = []
        for trajectory in ctx.request.trajectories:
            result = check_answer(final_answer(trajectory), truth)
            out.append(ComponentValue(
                {"verifiable": 1.0 if result.correct else 0.0,
                 "verifiable_partial": result.partial},
                f"ground truth ({truth.kind}): {'correct' if result.correct else 'incorrect'}, "
                f"{result.detail}"))
        return out


@register
class MalformedToolCallPenalty(RewardComponent):
    name = "penalty_malformed_tool_calls"

    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        per_call = ctx.config.malformed_tool_call_penalty
        out = []
        for t in ctx.request.trajectories:
            value = -per_call * t.malformed_tool_calls
            note = f"{t.malformed_tool_calls} malformed tool call(s)" if value else ""
            out.append(ComponentValue({self.name: value}, note))
        return out


@register
class TurnLimitPenalty(RewardComponent):
    name = "penalty_turn_limit"

    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        out = []
        for t in ctx.request.trajectories:
            hit = t.finish_reason == "max_turns"
            out.append(ComponentValue({self.name: -ctx.config.turn_limit_penalty if hit else 0.0},
                                      "turn limit reached" if hit else ""))
        return out


@register
class NoAnswerPenalty(RewardComponent):
    name = "penalty_no_answer"

    def compute(self, ctx: GroupContext) -> list[ComponentValue]:
        out = []
        for t in ctx.request.trajectories:
            missing = not (t.final_answer or "").strip()
            out.append(ComponentValue({self.name: -ctx.config.no_answer_penalty if missing
                                       else 0.0}, "no final answer" if missing else ""))
        return out


def _base(values: dict[str, float], config: RewardConfig) -> float:
    verifiable_key = "verifiable_partial" if config.partial_credit else "verifiable"
    if config.mode == "ruler":
        return values["ruler"]
    if config.mode == "verifiable":
        return values[verifiable_key]
    if verifiable_key not in values:  # weighted, but this scenario has no ground truth
        return values["ruler"]
    return config.ruler_weight * values["ruler"] + config.verifiable_weight * values[
        verifiable_key]


def combine(ctx: GroupContext) -> list[TrajectoryScore]:
    """Compute every applicable component and combine them into one score per trajectory."""

    rows = [_Row() for _ in ctx.request.trajectories]
    for component in COMPONENTS.values():
        if not component.applies(ctx):
            continue
        for row, value in zip(rows, component.compute(ctx), strict=True):
            row.values.update(value.values)
            if value.note:
                row.notes.append(value.note)
    scores = []
    for row in rows:
        penalty = sum(v for k, v in row.values.items() if k.startswith("penalty_"))
        score = min(1.0, max(0.0, _base(row.values, ctx.config) + penalty))
        notes = list(row.notes)
        if ctx.config.mode == "weighted" and "verifiable" not in row.values:
            notes.append("no ground truth: RULER only")
        scores.append(TrajectoryScore(
            score=round(score, 6),
            explanation=" | ".join(notes),
            components={k: round(v, 6) + 0.0 for k, v in row.values.items()},  # no -0.0
        ))
    return scores
