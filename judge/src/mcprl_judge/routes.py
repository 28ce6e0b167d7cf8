"""HTTP routes: thin, the logic is in :class:`mcprl_judge.service.JudgeService`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from mcprl_judge.api import JudgeDefaults, ScoreGroupRequest, ScoreGroupResponse
from mcprl_judge.service import JudgeService

router = APIRouter(prefix="/v1", tags=["judge"])


def _service(request: Request) -> JudgeService:
    return request.app.state.judge


@router.post("/score-group", response_model=ScoreGroupResponse)
async def score_group(body: ScoreGroupRequest, request: Request) -> ScoreGroupResponse:
    """Score a group of trajectories of one scenario: one score in [0, 1] each."""

    return await _service(request).score_group(body)


@router.get("/defaults", response_model=JudgeDefaults)
async def defaults(request: Request) -> JudgeDefaults:
    """The judge model, rubric and mode a request gets when it names none."""

    return JudgeDefaults(**_service(request).defaults())
