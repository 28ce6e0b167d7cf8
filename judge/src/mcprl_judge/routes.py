"""HTTP routes: thin, the logic is in :class:`mcprl_judge.service.JudgeService`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request

from mcprl_judge.api import JudgeDefaults, ScoreGroupRequest, ScoreGroupResponse
from mcprl_judge.service import JudgeService

router = APIRouter(prefix="/v1", tags=["judge"])


def _example_trajectory(answer: str) -> dict:
    call = {"id": "call_0", "type": "function",
            "function": {"name": "complete_task", "arguments": f'{{"answer": "{answer}"}}'}}
    return {"messages": [
        {"role": "user", "content": "How many departments are there?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "Task completed."}],
        "final_answer": answer, "finish_reason": "completed"}


# Shown in the OpenAPI document (and sent by schemathesis' explicit phase).
SCORE_GROUP_EXAMPLES = {"verifiable": {
    "summary": "two answers checked against the ground truth",
    "value": {"scenario": {"id": "s1", "task": "How many departments are there?",
                           "ground_truth": {"kind": "number", "value": 8}},
              "trajectories": [_example_trajectory("8"), _example_trajectory("5")],
              "reward": {"mode": "verifiable"}},
}, "ruler": {
    "summary": "two answers ranked by the judge model (RULER)",
    "value": {"scenario": {"id": "s1", "task": "How many departments are there?"},
              "trajectories": [_example_trajectory("8"), _example_trajectory("5")],
              "reward": {"mode": "ruler"}},
}}


def _service(request: Request) -> JudgeService:
    return request.app.state.judge


@router.post("/score-group", response_model=ScoreGroupResponse)
async def score_group(
    body: Annotated[ScoreGroupRequest, Body(openapi_examples=SCORE_GROUP_EXAMPLES)],
    request: Request,
) -> ScoreGroupResponse:
    """Score a group of trajectories of one scenario: one score in [0, 1] each."""

    return await _service(request).score_group(body)


@router.get("/defaults", response_model=JudgeDefaults)
async def defaults(request: Request) -> JudgeDefaults:
    """The judge model, rubric and mode a request gets when it names none."""

    return JudgeDefaults(**_service(request).defaults())
