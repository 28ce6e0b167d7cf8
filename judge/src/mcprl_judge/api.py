"""The judge's wire models. The score-group request and response live in
:mod:`mcprl_common.wire` because the trainer sends them; this module names them for the
routes and adds the judge's own small responses."""

from __future__ import annotations

from pydantic import BaseModel, Field

from mcprl_common.wire import (
    RewardConfig,
    ScoreGroupRequest,
    ScoreGroupResponse,
    TrajectoryScore,
    Usage,
)

__all__ = [
    "JudgeDefaults",
    "RewardConfig",
    "ScoreGroupRequest",
    "ScoreGroupResponse",
    "TrajectoryScore",
    "Usage",
]


class JudgeDefaults(BaseModel):
    """What a request gets when it leaves a field out (``GET /v1/defaults``)."""

    judge_model: str = Field(description="Judge model used when a request names none.")
    rubric: str = Field(description="RULER rubric used when a request sends none.")
    mode: str = Field(description="Reward mode used when a request names none.")
    max_group_size: int = Field(description="Most trajectories per request.")
    structured_output: str = Field(description="auto, json_schema or none.")
    cache_enabled: bool = Field(description="Whether judgements are cached.")
