"""Client of the judge service: one ``POST /v1/score-group`` per finished group."""

from __future__ import annotations

import httpx

from mcprl_common.http import RetryPolicy, request_json
from mcprl_common.wire import (
    RewardConfig,
    Scenario,
    ScoreGroupRequest,
    ScoreGroupResponse,
    Trajectory,
)


class JudgeClient:
    def __init__(self, url: str, *, timeout_s: float = 300.0, rubric: str | None = None,
                 judge_model: str | None = None, max_retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.rubric = rubric
        self.judge_model = judge_model
        self.http = httpx.AsyncClient(timeout=timeout_s)
        self.retry = RetryPolicy(max_retries=max_retries)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def score_group(self, scenario: Scenario, trajectories: list[Trajectory],
                          reward: RewardConfig) -> ScoreGroupResponse:
        request = ScoreGroupRequest(scenario=scenario, trajectories=trajectories,
                                    rubric=self.rubric, judge_model=self.judge_model,
                                    reward=reward)
        data = await request_json(self.http, "POST", f"{self.url}/v1/score-group",
                                  json=request.model_dump(mode="json"), retry=self.retry)
        response = ScoreGroupResponse.model_validate(data)
        if len(response.scores) != len(trajectories):
            raise ValueError(f"judge returned {len(response.scores)} scores for "
                             f"{len(trajectories)} trajectories")
        return response
