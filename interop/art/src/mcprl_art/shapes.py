"""ART's ``Trajectory`` / ``TrajectoryGroup`` <-> our wire ``Trajectory`` and score-group.

Messages are OpenAI chat messages on both sides. An ART ``Choice`` (a sampled assistant
turn) becomes the assistant message it holds; plain message dicts pass through unchanged,
so ours -> ART -> ours is lossless. What ART has no field for travels in ART's scalar
``metadata`` under ``mcprl_*`` keys (non-scalar values as JSON), so it comes back too.
A trajectory that never went through us (no ``mcprl_*`` keys) gets its counters derived
from its messages: turns, tool calls, the ``complete_task`` answer, why it ended.
"""

from __future__ import annotations

import json
from typing import Any

import art
from openai.types.chat.chat_completion import Choice

from mcprl_common.wire import (
    RewardConfig,
    Scenario,
    ScoreGroupRequest,
    ScoreGroupResponse,
    Trajectory,
    TrajectoryScore,
)
from mcprl_trainer.mcp_tools import COMPLETE_TASK
from mcprl_trainer.rollout import _answer_text as answer_text

PREFIX = "mcprl_"
_COUNTERS = ("num_turns", "tool_calls", "tool_errors", "malformed_tool_calls")
SCENARIO_KEY = f"{PREFIX}scenario"
_METADATA_KEY = f"{PREFIX}metadata"
_SCALAR = (str, int, float, bool, type(None))


def choice_message(choice: Choice) -> dict[str, Any]:
    """The assistant message of a sampled turn, as ``Trajectory.messages()`` shows it, except
    that a missing content stays ``None`` (ART writes ``""``) so our messages come back
    exactly."""

    message: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    calls = choice.message.tool_calls or []
    if calls:
        message["tool_calls"] = [call.model_dump(mode="json") for call in calls]
    return message


def openai_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Tool schemas in the OpenAI API's key order (``type``, then ``function`` with ``name``,
    ``description``, ``parameters``), the order vLLM and our engine hand the chat template.
    ART's ``Trajectory`` validates ``tools`` as TypedDicts, which puts ``function`` before
    ``type``; templates serialise tools in key order, so the prompt would change."""

    if tools is None:
        return None
    out = []
    for tool in tools:
        tool = dict(tool)
        fn = dict(tool.get("function") or {})
        ordered_fn = {k: fn[k] for k in ("name", "description", "parameters", "strict")
                      if k in fn}
        ordered_fn.update({k: v for k, v in fn.items() if k not in ordered_fn})
        ordered = {"type": tool.get("type", "function"), "function": ordered_fn}
        ordered.update({k: v for k, v in tool.items() if k not in ordered})
        out.append(ordered)
    return out


def messages_of(trajectory: art.Trajectory) -> list[dict[str, Any]]:
    return [choice_message(m) if isinstance(m, Choice) else dict(m)
            for m in trajectory.messages_and_choices]


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def derive_outcome(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters and the end of a rollout, read from its messages (for ART's own rollouts)."""

    assistants = [m for m in messages if m.get("role") == "assistant"]
    calls = [c for m in assistants for c in (m.get("tool_calls") or [])]
    done = [c for c in calls if (c.get("function") or {}).get("name") == COMPLETE_TASK]
    if done:
        finish, answer = "completed", answer_text(_arguments(done[0]))
    elif assistants and not assistants[-1].get("tool_calls"):
        finish, answer = "no_tool_call", None
    else:
        finish, answer = "max_turns", None
    return {"finish_reason": finish, "final_answer": answer, "num_turns": len(assistants),
            "tool_calls": len(calls), "tool_errors": 0, "malformed_tool_calls": 0}


def to_wire_trajectory(trajectory: art.Trajectory) -> Trajectory:
    """An ART trajectory as the judge and our trainer read it."""

    messages = messages_of(trajectory)
    meta = dict(trajectory.metadata)
    outcome = derive_outcome(messages)
    for key in ("finish_reason", "final_answer", *_COUNTERS):
        if f"{PREFIX}{key}" in meta:
            outcome[key] = meta.pop(f"{PREFIX}{key}")
    extra = json.loads(meta.pop(_METADATA_KEY, None) or "{}")
    return Trajectory(messages=messages, tools=openai_tools(trajectory.tools),
                      metadata={**meta, **extra}, **outcome)


def art_metadata(trajectory: Trajectory) -> dict[str, Any]:
    """Our trajectory's fields and metadata in ART's scalar-only ``metadata``."""

    meta: dict[str, Any] = {k: v for k, v in trajectory.metadata.items()
                            if isinstance(v, _SCALAR)}
    rest = {k: v for k, v in trajectory.metadata.items() if k not in meta}
    if rest:
        meta[_METADATA_KEY] = json.dumps(rest, sort_keys=True)
    meta[f"{PREFIX}finish_reason"] = trajectory.finish_reason
    meta[f"{PREFIX}final_answer"] = trajectory.final_answer
    for key in _COUNTERS:
        meta[f"{PREFIX}{key}"] = getattr(trajectory, key)
    return meta


def from_wire_trajectory(trajectory: Trajectory, *, reward: float = 0.0,
                         metrics: dict[str, float] | None = None) -> art.Trajectory:
    """Our trajectory as an ART one (messages only: token ids need :mod:`mcprl_art.records`)."""

    return art.Trajectory(messages_and_choices=[dict(m) for m in trajectory.messages],
                          tools=trajectory.tools, reward=reward, metrics=dict(metrics or {}),
                          metadata=art_metadata(trajectory))


def components_of(metrics: dict[str, Any]) -> dict[str, float]:
    """Our reward components from ART metrics (``ruler_score`` is RULER's)."""

    return {("ruler" if k == "ruler_score" else k[len(PREFIX):]): float(v)
            for k, v in metrics.items() if k == "ruler_score" or k.startswith(PREFIX)}


def metrics_of(components: dict[str, float]) -> dict[str, float]:
    """Our reward components as ART metrics (``ruler`` -> ``ruler_score``, ART's name)."""

    return {("ruler_score" if k == "ruler" else f"{PREFIX}{k}"): v
            for k, v in components.items()}


# -- groups <-> score-group ---------------------------------------------------------------------
def task_of(group: art.TrajectoryGroup) -> str:
    """The task every trajectory of the group tried: the first user message."""

    for trajectory in group.trajectories:
        for message in messages_of(trajectory):
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
    raise ValueError("the group has no user message to take the task from")


def scenario_of(group: art.TrajectoryGroup) -> Scenario:
    """The group's scenario: the one we stored in its metadata, else one made of its task."""

    stored = group.metadata.get(SCENARIO_KEY)
    if isinstance(stored, str):
        return Scenario.model_validate_json(stored)
    return Scenario.from_art({"task": task_of(group)}, strategy="art")


def score_group_request(group: art.TrajectoryGroup, scenario: Scenario | None = None, *,
                        rubric: str | None = None, judge_model: str | None = None,
                        reward: RewardConfig | None = None,
                        use_cache: bool = True) -> ScoreGroupRequest:
    """``POST /v1/score-group``'s body for an ART group."""

    if not group.trajectories:
        raise ValueError("an empty group has nothing to score")
    fields: dict[str, Any] = {"rubric": rubric, "judge_model": judge_model,
                              "use_cache": use_cache}
    if reward is not None:
        fields["reward"] = reward
    return ScoreGroupRequest(scenario=scenario or scenario_of(group),
                             trajectories=[to_wire_trajectory(t) for t in group.trajectories],
                             **fields)


def group_from_request(request: ScoreGroupRequest) -> art.TrajectoryGroup:
    """A score-group request's trajectories as an ART group (the scenario in its metadata)."""

    return art.TrajectoryGroup([from_wire_trajectory(t) for t in request.trajectories],
                               metadata={SCENARIO_KEY: request.scenario.model_dump_json()})


def apply_scores(group: art.TrajectoryGroup, response: ScoreGroupResponse
                 ) -> art.TrajectoryGroup:
    """A new group whose rewards are the judge's scores, as ``ruler_score_group`` returns:
    ``reward`` replaced, the old one in ``metrics["independent_reward"]``, RULER's part in
    ``metrics["ruler_score"]``, the other components as ``mcprl_*`` metrics, the explanation
    logged. The input group is not changed."""

    if len(response.scores) != len(group.trajectories):
        raise ValueError(f"{len(response.scores)} scores for {len(group.trajectories)} "
                         "trajectories")
    out = []
    for trajectory, score in zip(group.trajectories, response.scores, strict=True):
        new = trajectory.model_copy(deep=True)
        new.metrics["independent_reward"] = trajectory.reward
        new.metrics.update(metrics_of(score.components))
        new.reward = score.score
        new.log(f"mcp-rl judge explanation: {score.explanation}")
        out.append(new)
    metadata = dict(group.metadata)
    metadata[f"{PREFIX}judge_model"] = response.judge_model
    metadata[f"{PREFIX}cached"] = response.cached
    return art.TrajectoryGroup(out, metadata=metadata, metrics=dict(group.metrics),
                               logs=list(group.logs))


def response_from_group(group: art.TrajectoryGroup) -> ScoreGroupResponse:
    """A scored ART group (``apply_scores``' or ``ruler_score_group``'s) as our response."""

    scores = []
    for t in group.trajectories:
        components = components_of(t.metrics)
        explanation = next((line.split(": ", 1)[1] for line in reversed(t.logs)
                            if line.startswith(("mcp-rl judge explanation: ",
                                                "RULER explanation: "))), "")
        scores.append(TrajectoryScore(score=min(1.0, max(0.0, t.reward)),
                                      explanation=explanation, components=components))
    judge_model = group.metadata.get(f"{PREFIX}judge_model")
    return ScoreGroupResponse(scores=scores,
                              judge_model=judge_model if isinstance(judge_model, str) else None,
                              cached=bool(group.metadata.get(f"{PREFIX}cached", False)))
