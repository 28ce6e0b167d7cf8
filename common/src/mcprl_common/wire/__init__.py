"""Wire models of the messages between services (pydantic only, no logic beyond validation)."""

from mcprl_common.wire.scenario import AnswerKind, GroundTruth, Scenario, ScenarioSetManifest
from mcprl_common.wire.scoring import (
    RewardConfig,
    RewardMode,
    ScoreGroupRequest,
    ScoreGroupResponse,
    TrajectoryScore,
    Usage,
)
from mcprl_common.wire.trajectory import FinishReason, Trajectory

__all__ = [
    "AnswerKind",
    "FinishReason",
    "GroundTruth",
    "RewardConfig",
    "RewardMode",
    "Scenario",
    "ScenarioSetManifest",
    "ScoreGroupRequest",
    "ScoreGroupResponse",
    "Trajectory",
    "TrajectoryScore",
    "Usage",
]
