"""Rollout rows (``rollouts/*.jsonl``) -> what the report page shows, bounded in size.

Every string that came from a model, a tool or a scenario is clipped to ``MAX_TEXT``
characters here (the JSONL keeps it whole) and stays plain data: the page only ever puts it
into the DOM as text.
"""

from __future__ import annotations

import json
from typing import Any

from mcprl_trainer.evaluate import success_of
from mcprl_trainer.mcp_tools import COMPLETE_TASK

MAX_TEXT = 4000  # characters of one message, argument list, answer or explanation
MAX_TASK = 600  # characters of a scenario's task in the index
QUERY_TOOL = "run_query"  # company-db's query tool; other servers: any call of a server tool


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    """``text`` as a string of at most ``limit`` characters, saying how much was cut."""

    if text is None:
        return ""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n…[{len(text) - limit} more characters in the run's JSONL]"


def _content(value: Any) -> str:
    """OpenAI message content: a string, None, or a list of parts."""

    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p)
                         for p in value)
    return "" if value is None else str(value)


def _arguments(raw: Any) -> str:
    """Tool-call arguments pretty-printed when they are JSON, as they are otherwise."""

    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return raw
    return json.dumps(raw, indent=1, ensure_ascii=False, default=str)


def _is_error_result(message: dict[str, Any], error_ids: set[str] | None) -> bool:
    if error_ids is not None:
        return message.get("tool_call_id") in error_ids
    # Rollouts from before ``tool_error_ids`` was recorded: the trainer starts every error
    # result it writes with "Error" (see mcp_tools and rollout).
    return _content(message.get("content")).lstrip().lower().startswith("error")


def messages_view(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    ids = (trajectory.get("metadata") or {}).get("tool_error_ids")
    error_ids = set(ids) if ids is not None else None
    out: list[dict[str, Any]] = []
    for m in trajectory.get("messages") or []:
        role = str(m.get("role", "?"))
        view: dict[str, Any] = {"role": role, "content": clip(_content(m.get("content")))}
        calls = m.get("tool_calls") or []
        if calls:
            view["calls"] = [{"id": str(c.get("id", "")),
                              "name": clip(str((c.get("function") or {}).get("name", "?")), 200),
                              "args": clip(_arguments((c.get("function") or {}).get("arguments")))}
                             for c in calls]
        if role == "tool":
            view["call_id"] = str(m.get("tool_call_id", ""))
            view["error"] = _is_error_result(m, error_ids)
        out.append(view)
    return out


def called_tools(trajectory: dict[str, Any]) -> list[str]:
    return [str((c.get("function") or {}).get("name", ""))
            for m in trajectory.get("messages") or [] if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []]


def queried(trajectory: dict[str, Any]) -> bool:
    """Whether the agent looked anything up: called ``run_query`` where the server has it,
    else any tool of the server (``complete_task`` is ours, not the server's)."""

    offered = {str((t.get("function") or {}).get("name", "")) for t in trajectory.get("tools")
               or []}
    calls = called_tools(trajectory)
    if QUERY_TOOL in offered:
        return QUERY_TOOL in calls
    return any(name != COMPLETE_TASK for name in calls)


def scenario_view(scenario: dict[str, Any]) -> dict[str, Any]:
    truth = scenario.get("ground_truth")
    value = truth.get("value") if truth else None
    return {"id": str(scenario.get("id", "")), "task": clip(scenario.get("task"), MAX_TASK),
            "difficulty": scenario.get("difficulty"), "template": scenario.get("template"),
            "truth": None if truth is None else clip(value if isinstance(value, str)
                                                     else json.dumps(value), 1000),
            "truth_kind": truth.get("kind") if truth else None}


def is_row_success(row: dict[str, Any], threshold: float) -> bool:
    scenario = row.get("scenario") or {}
    return success_of(row.get("reward"), row.get("components") or {},
                      scenario.get("ground_truth") is not None, threshold)


def rollout_view(row: dict[str, Any], threshold: float) -> dict[str, Any]:
    t = row.get("trajectory") or {}
    return {
        "group": row.get("group", 0), "member": row.get("member", 0),
        "reward": row.get("reward"), "advantage": row.get("advantage"),
        "components": row.get("components") or {},
        "explanation": clip(row.get("explanation")),
        "success": is_row_success(row, threshold),
        "queried": queried(t),
        "finish": t.get("finish_reason"), "turns": t.get("num_turns", 0),
        "tool_calls": t.get("tool_calls", 0), "tool_errors": t.get("tool_errors", 0),
        "malformed": t.get("malformed_tool_calls", 0), "seconds": row.get("seconds"),
        "final_answer": None if t.get("final_answer") is None else clip(t.get("final_answer")),
        "messages": messages_view(t),
    }
