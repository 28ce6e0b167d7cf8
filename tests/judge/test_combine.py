"""Reward modes, penalties and clipping, with every component named."""

from __future__ import annotations

import pytest

from mcprl_common.wire import GroundTruth, RewardConfig, Scenario, ScoreGroupRequest
from mcprl_judge.combine import COMPONENTS, GroupContext, combine
from mcprl_judge.judge_output import Judgement
from mcprl_testing.judge import sql_trajectory

TASK = "How many departments are in London?"


def request(truth: GroundTruth | None = None) -> ScoreGroupRequest:
    group = [sql_trajectory(TASK, [], "2 departments"),
             sql_trajectory(TASK, [], "3", malformed_tool_calls=2),
             sql_trajectory(TASK, [], None, finish_reason="max_turns")]
    return ScoreGroupRequest(scenario=Scenario(id="s", task=TASK, ground_truth=truth),
                             trajectories=group)


RULER = [Judgement(explanation="right", score=0.9), Judgement(explanation="wrong", score=0.5),
         Judgement(explanation="none", score=0.05)]


def test_registry_names() -> None:
    assert list(COMPONENTS) == ["ruler", "verifiable", "penalty_malformed_tool_calls",
                                "penalty_turn_limit", "penalty_no_answer"]


def test_ruler_mode_with_penalties() -> None:
    cfg = RewardConfig(mode="ruler", no_answer_penalty=0.2)
    scores = combine(GroupContext(request(), cfg, RULER))
    assert [s.score for s in scores] == [0.9, pytest.approx(0.3), 0.0]  # 0.05-0.1-0.2 clipped
    assert scores[1].components["penalty_malformed_tool_calls"] == pytest.approx(-0.2)
    assert scores[2].components["penalty_turn_limit"] == -0.1
    assert scores[2].components["penalty_no_answer"] == -0.2
    assert "verifiable" not in scores[0].components  # no ground truth
    assert scores[0].explanation.startswith("right")
    assert "turn limit reached" in scores[2].explanation
    assert str(scores[0].components["penalty_malformed_tool_calls"]) == "0.0"  # not -0.0


def test_verifiable_mode_needs_no_judge() -> None:
    cfg = RewardConfig(mode="verifiable", malformed_tool_call_penalty=0, turn_limit_penalty=0)
    scores = combine(GroupContext(request(GroundTruth(kind="number", value=2)), cfg))
    assert [s.score for s in scores] == [1.0, 0.0, 0.0]
    assert "ruler" not in scores[0].components
    assert scores[0].components["verifiable"] == 1.0
    assert scores[0].components["verifiable_partial"] == 1.0
    assert "correct" in scores[0].explanation


def test_weighted_mode_and_partial_credit() -> None:
    truth = GroundTruth(kind="number", value=2)
    cfg = RewardConfig(mode="weighted", ruler_weight=0.25, verifiable_weight=0.75,
                       malformed_tool_call_penalty=0, turn_limit_penalty=0)
    scores = combine(GroupContext(request(truth), cfg, RULER))
    assert scores[0].score == pytest.approx(0.25 * 0.9 + 0.75)
    assert scores[1].score == pytest.approx(0.25 * 0.5)
    partial = cfg.model_copy(update={"partial_credit": True})
    scores = combine(GroupContext(request(truth), partial, RULER))
    assert scores[1].score == pytest.approx(0.25 * 0.5)  # 3 vs 2 is 50% off: no credit
    assert scores[1].components["verifiable_partial"] == 0.0
    assert scores[0].score == pytest.approx(0.25 * 0.9 + 0.75)


def test_weighted_without_ground_truth_falls_back_to_ruler() -> None:
    scores = combine(GroupContext(request(), RewardConfig(mode="weighted"), RULER))
    assert scores[0].score == 0.9 and "RULER only" in scores[0].explanation


def test_scores_always_within_unit_interval() -> None:
    cfg = RewardConfig(mode="weighted", ruler_weight=2, verifiable_weight=2)
    scores = combine(GroupContext(request(GroundTruth(kind="number", value=2)), cfg, RULER))
    assert all(0.0 <= s.score <= 1.0 for s in scores) and scores[0].score == 1.0
