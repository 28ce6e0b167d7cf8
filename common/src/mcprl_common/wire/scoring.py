"""The judge's ``POST /v1/score-group`` request and response."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, model_validator

from mcprl_common.wire.scenario import Scenario
from mcprl_common.wire.trajectory import Trajectory

RewardMode = Literal["ruler", "verifiable", "weighted"]


class RewardConfig(BaseModel):
    """How reward components combine into one score in [0, 1] (strict scalars: a request
    with "0.5" for a weight is refused, as the OpenAPI document says, not coerced).

    ``ruler``: RULER's score only; ``verifiable``: the ground-truth check only (needs a
    scenario with ``ground_truth``); ``weighted``: ``ruler_weight * ruler +
    verifiable_weight * verifiable``. Penalties are subtracted afterwards, then the result
    is clipped to [0, 1].
    """

    mode: RewardMode = Field(
        "ruler", description="Reward mode: 'ruler', 'verifiable' or 'weighted' (both)."
    )
    ruler_weight: StrictFloat = Field(
        0.5, ge=0, description="Weight of RULER's score in 'weighted'.")
    verifiable_weight: StrictFloat = Field(
        0.5, ge=0, description="Weight of the ground-truth check in 'weighted'."
    )
    malformed_tool_call_penalty: StrictFloat = Field(0.1, ge=0, description="Per malformed call.")
    turn_limit_penalty: StrictFloat = Field(0.1, ge=0, description="When max_turns was reached.")
    no_answer_penalty: StrictFloat = Field(
        0.0, ge=0, description="When complete_task was never called.")
    partial_credit: StrictBool = Field(
        False, description="Use the ground-truth check's partial credit (e.g. F1 of a set "
        "answer) instead of its 0/1 verdict as the verifiable reward.")

    @model_validator(mode="after")
    def _weights(self) -> RewardConfig:
        if self.mode == "weighted" and self.ruler_weight + self.verifiable_weight <= 0:
            raise ValueError("weighted mode needs a positive ruler_weight or verifiable_weight")
        return self


class ScoreGroupRequest(BaseModel):
    scenario: Scenario
    trajectories: list[Trajectory] = Field(min_length=1)
    rubric: str | None = Field(None, description="Overrides the default RULER rubric.")
    judge_model: str | None = Field(None, description="Overrides the deployment's judge model.")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    use_cache: StrictBool = True


class TrajectoryScore(BaseModel):
    score: float = Field(ge=0.0, le=1.0)
    explanation: str = ""
    components: dict[str, float] = Field(default_factory=dict)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    upstream_calls: int = 0


class ScoreGroupResponse(BaseModel):
    scores: list[TrajectoryScore]
    judge_model: str | None = None
    cached: bool = False
    usage: Usage = Field(default_factory=Usage)
