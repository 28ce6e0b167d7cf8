"""ART's Trajectory / TrajectoryGroup <-> our wire trajectory and score-group, both ways,
with a real judge on loopback for the scored direction."""

from __future__ import annotations

import pytest

pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")

import art
import httpx
from openai.types.chat.chat_completion import Choice

from mcprl_art.shapes import (
    apply_scores,
    from_wire_trajectory,
    group_from_request,
    response_from_group,
    scenario_of,
    score_group_request,
    to_wire_trajectory,
)
from mcprl_common.wire import GroundTruth, RewardConfig, Scenario, ScoreGroupResponse
from mcprl_testing.judge import sql_trajectory

pytestmark = pytest.mark.timeout(120)
TASK = "How many employees work in Engineering?"


def _ours():
    good = sql_trajectory(TASK, [("SELECT COUNT(*) AS n FROM employees WHERE department_id = 1",
                                  '{"row_count": 1, "results": [{"n": 4}]}')], "4")
    good.metadata.update({"scenario_id": "sc-1", "served_by": ["base", "step-1"], "seed": 7})
    lost = sql_trajectory(TASK, [("SELECT * FROM staff", '{"error": "no such table: staff"}')],
                          None, finish_reason="max_turns", malformed_tool_calls=1)
    return [good, lost]


def _choice(content: str | None, calls: list[dict] | None = None) -> Choice:
    return Choice.model_validate({"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                                  "message": {"role": "assistant", "content": content,
                                              **({"tool_calls": calls} if calls else {})}})


def _call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_ours_to_art_and_back_is_lossless() -> None:
    for ours in _ours():
        back = to_wire_trajectory(from_wire_trajectory(ours, reward=0.5))
        assert back == ours
    # content None on a tool-call message stays None (ART's messages() would write "")
    assert _ours()[0].messages[2]["content"] is None


def test_art_native_trajectory_counters_are_derived_from_messages() -> None:
    system = {"role": "system", "content": "You are an MCP agent."}
    user = {"role": "user", "content": f"Please complete this task: {TASK}"}
    done = art.Trajectory(messages_and_choices=[
        system, user,
        _choice("", [_call("c1", "run_query", '{"sql": "SELECT 1"}')]),
        {"role": "tool", "tool_call_id": "c1", "content": '{"row_count": 1}'},
        _choice(None, [_call("c2", "complete_task", '{"summary": "There are 4."}')]),
    ], reward=0.0, metadata={"task": TASK})
    wire = to_wire_trajectory(done)
    assert (wire.finish_reason, wire.final_answer, wire.num_turns, wire.tool_calls) == (
        "completed", "There are 4.", 2, 2)
    assert wire.metadata == {"task": TASK}
    assert wire.messages[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "run_query", "arguments": '{"sql": "SELECT 1"}'}}]}
    talk = art.Trajectory(messages_and_choices=[system, user, _choice("I think 4.")])
    assert to_wire_trajectory(talk).finish_reason == "no_tool_call"
    cut = art.Trajectory(messages_and_choices=[
        system, user, _choice("", [_call("c1", "list_tables", "{}")])])
    assert to_wire_trajectory(cut).finish_reason == "max_turns"


def test_group_request_round_trips() -> None:
    scenario = Scenario.from_art({"task": TASK, "difficulty": 2}).model_copy(
        update={"ground_truth": GroundTruth(kind="number", value=4.0)})
    group = art.TrajectoryGroup([from_wire_trajectory(t) for t in _ours()])
    request = score_group_request(group, scenario, rubric="be strict",
                                  reward=RewardConfig(mode="verifiable"))
    assert request.trajectories == _ours() and request.rubric == "be strict"
    again = group_from_request(request)
    assert score_group_request(again, rubric="be strict",
                               reward=RewardConfig(mode="verifiable")) == request
    # without a stored scenario the task is the first user message
    assert scenario_of(group).task == TASK
    with pytest.raises(ValueError, match="nothing to score"):
        score_group_request(art.TrajectoryGroup([]))


def test_real_judge_scores_an_art_group(art_stack) -> None:
    scenario = Scenario.from_art({"task": TASK}).model_copy(
        update={"ground_truth": GroundTruth(kind="number", value=4.0)})
    group = art.TrajectoryGroup([from_wire_trajectory(t, reward=0.25) for t in _ours()])
    request = score_group_request(group, scenario, reward=RewardConfig(mode="verifiable"))
    resp = httpx.post(f"{art_stack.judge_url}/v1/score-group",
                      json=request.model_dump(mode="json"), timeout=60)
    assert resp.status_code == 200, resp.text
    response = ScoreGroupResponse.model_validate(resp.json())
    scored = apply_scores(group, response)
    assert [t.reward for t in scored.trajectories] == [1.0, 0.0]  # "4" right, no answer
    assert [t.metrics["independent_reward"] for t in scored.trajectories] == [0.25, 0.25]
    assert scored.trajectories[0].metrics["mcprl_verifiable"] == 1.0
    assert [t.reward for t in group.trajectories] == [0.25, 0.25]  # the input is untouched
    back = response_from_group(scored)
    assert [s.score for s in back.scores] == [s.score for s in response.scores]
    assert [s.components for s in back.scores] == [s.components for s in response.scores]
    assert [s.explanation for s in back.scores] == [s.explanation for s in response.scores]
    with pytest.raises(ValueError, match="1 scores for 2"):
        apply_scores(group, ScoreGroupResponse(scores=response.scores[:1]))


def test_reads_what_ruler_score_group_writes() -> None:
    # ART's ruler_score_group: reward replaced, metrics ruler_score + independent_reward, and
    # the explanation logged as "RULER explanation: ..."
    trajectory = from_wire_trajectory(_ours()[0], reward=0.8,
                                      metrics={"ruler_score": 0.8, "independent_reward": 0.0})
    trajectory.log("RULER explanation: found the count")
    response = response_from_group(art.TrajectoryGroup([trajectory]))
    assert response.scores[0].score == 0.8
    assert response.scores[0].components == {"ruler": 0.8}
    assert response.scores[0].explanation == "found the count"
