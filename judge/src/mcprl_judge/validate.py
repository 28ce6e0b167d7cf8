"""Checks of a score-group request beyond its pydantic shape, each failing with a 4xx that
names the offending field (``trajectories[2].messages[5].role``) and what is wrong."""

from __future__ import annotations

from typing import Any

from mcprl_common.errors import BadRequestError, PayloadTooLargeError
from mcprl_common.wire import RewardMode, ScoreGroupRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _check_tool_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise BadRequestError(f"{where}: a tool call must be an object", param=where)
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRequestError(f"{where}.function.name: a tool call needs a function name",
                              param=f"{where}.function.name")
    args = fn.get("arguments")
    if args is not None and not isinstance(args, str | dict):
        raise BadRequestError(f"{where}.function.arguments: must be a JSON string or object",
                              param=f"{where}.function.arguments")


def check_message(message: dict[str, Any], where: str) -> None:
    """An OpenAI chat message: a known role, text (or parts) content, well-formed tool calls."""

    role = message.get("role")
    if role not in ROLES:
        raise BadRequestError(
            f"{where}.role: {role!r} is not one of {', '.join(sorted(ROLES))}",
            param=f"{where}.role")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise BadRequestError(f"{where}.content: must be a string, a list of parts or null",
                              param=f"{where}.content")
    if isinstance(content, list):
        for k, part in enumerate(content):
            if not isinstance(part, dict | str):
                raise BadRequestError(f"{where}.content[{k}]: a content part must be an object",
                                      param=f"{where}.content[{k}]")
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise BadRequestError(
                f"{where}.tool_calls: only assistant messages carry a list of tool calls",
                param=f"{where}.tool_calls")
        for k, call in enumerate(calls):
            _check_tool_call(call, f"{where}.tool_calls[{k}]")


def check_request(req: ScoreGroupRequest, mode: RewardMode, max_group_size: int) -> None:
    """Group size against the mode, ground truth where needed, every message well formed."""

    n = len(req.trajectories)
    if n > max_group_size:
        raise PayloadTooLargeError(
            f"trajectories: {n} in one group, at most {max_group_size} (JUDGE_MAX_GROUP_SIZE)",
            param="trajectories")
    if mode in ("ruler", "weighted") and n < 2:
        raise BadRequestError(
            f"trajectories: RULER scores a group relative to itself and needs at least 2 "
            f"trajectories, got {n}; use reward.mode='verifiable' to score one alone",
            param="trajectories")
    if mode == "verifiable" and req.scenario.ground_truth is None:
        raise BadRequestError(
            "scenario.ground_truth: reward.mode='verifiable' needs a scenario with a ground "
            "truth", param="scenario.ground_truth")
    if req.rubric is not None and not req.rubric.strip():
        raise BadRequestError("rubric: must not be blank (omit it for the default)",
                              param="rubric")
    if req.judge_model is not None and not req.judge_model.strip():
        raise BadRequestError("judge_model: must not be blank", param="judge_model")
    for i, trajectory in enumerate(req.trajectories):
        for j, message in enumerate(trajectory.messages):
            check_message(message, f"trajectories[{i}].messages[{j}]")
        for k, tool in enumerate(trajectory.tools or []):
            if not isinstance(tool, dict):
                raise BadRequestError(f"trajectories[{i}].tools[{k}]: must be an object",
                                      param=f"trajectories[{i}].tools[{k}]")
