"""``judge_score_group``: ``art.rewards.ruler_score_group``'s place in an ART loop, scored by
our judge service (``POST /v1/score-group``) instead of one litellm call.

Same contract: a new group comes back with ``reward`` replaced by the judge's score, the old
reward in ``metrics["independent_reward"]`` and RULER's part in ``metrics["ruler_score"]``;
``swallow_exceptions=True`` gives ``None`` for a group that could not be judged. What the
judge adds (bounded retries of unusable answers, the structured-output fallback, the cache,
verifiable rewards and penalties) is listed in docs/art.md.
"""

from __future__ import annotations

import logging

import art

from mcprl_art.shapes import apply_scores, score_group_request
from mcprl_common.wire import RewardConfig, Scenario
from mcprl_trainer.judge_client import JudgeClient

log = logging.getLogger(__name__)


async def judge_score_group(
    group: art.TrajectoryGroup,
    judge_url: str,
    *,
    scenario: Scenario | None = None,
    rubric: str | None = None,
    judge_model: str | None = None,
    reward: RewardConfig | None = None,
    timeout_s: float = 300.0,
    swallow_exceptions: bool = False,
) -> art.TrajectoryGroup | None:
    """Score ``group`` with the judge at ``judge_url`` (e.g. ``http://127.0.0.1:8920``).

    ``scenario`` defaults to the one stored in the group's metadata, else the group's task
    (its first user message); give one with ``ground_truth`` for verifiable rewards.
    """

    client = JudgeClient(judge_url, timeout_s=timeout_s, rubric=rubric, judge_model=judge_model)
    try:
        request = score_group_request(group, scenario, rubric=rubric, judge_model=judge_model,
                                      reward=reward)
        response = await client.score_group(request.scenario, request.trajectories,
                                            request.reward)
        return apply_scores(group, response)
    except Exception as exc:
        if not swallow_exceptions:
            raise
        log.warning("group not judged", extra={"reason": f"{type(exc).__name__}: {exc}"})
        return None
    finally:
        await client.aclose()
