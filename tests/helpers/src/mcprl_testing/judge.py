"""Helpers for tests of the judge and of its clients (the trainer's integration tests).

(The judge itself on loopback: :func:`mcprl_judge.loopback.serve_judge`.) The trajectory
builders write the OpenAI-shaped agent transcripts our rollout loop produces;
``instant_provider`` stands in for a hosted judge model where a test needs RULER answers
at once (fuzzing, disk faults) rather than a real model's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request

from mcprl_common.process import UvicornThread
from mcprl_common.wire import Trajectory

SYSTEM_PROMPT = ("You are a helpful agent with tools to query a company database. List the "
                 "tables, describe them, query, then call complete_task with your answer.")

SQL_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "list_tables", "description": "List the tables of the database.",
        "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {
        "name": "run_query", "description": "Run a read-only SQL query.",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                       "required": ["sql"]}}},
    {"type": "function", "function": {
        "name": "complete_task", "description": "Finish with the answer.",
        "parameters": {"type": "object", "properties": {"summary": {"type": "string"}},
                       "required": ["summary"]}}},
]


def _instant_provider_app(score: float) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        ids = body["response_format"]["json_schema"]["schema"]["properties"]["scores"][
            "required"]
        content = json.dumps({"scores": {i: {"explanation": "ok", "score": score}
                                         for i in ids}})
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}

    return app


@contextlib.contextmanager
def instant_provider(score: float = 0.5) -> Iterator[str]:
    """An OpenAI-compatible chat endpoint on loopback that answers every RULER request at
    once with ``score`` for each trajectory id its json_schema asks for (use the judge with
    ``structured_output="json_schema"``); yields its base URL with ``/v1``."""

    with UvicornThread(_instant_provider_app(score)) as server:
        yield f"{server.url}/v1"


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def sql_trajectory(task: str, queries: list[tuple[str, str]], answer: str | None, *,
                   finish_reason: str = "completed", malformed_tool_calls: int = 0,
                   tools: list[dict[str, Any]] | None = None) -> Trajectory:
    """An agent transcript: some run_query calls with their results, then complete_task.

    ``queries`` are (sql, result JSON text) pairs; ``answer`` None means the agent never
    called complete_task (it ran out of turns, say).
    """

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
    calls = 0
    for n, (sql, result) in enumerate(queries):
        cid = f"call_{n}"
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": [tool_call(cid, "run_query", {"sql": sql})]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        calls += 1
    if answer is not None:
        cid = f"call_{len(queries)}"
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": [tool_call(cid, "complete_task", {"summary": answer})]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": "Task completed."})
        calls += 1
    return Trajectory(messages=messages, tools=tools if tools is not None else SQL_TOOLS,
                      final_answer=answer, finish_reason=finish_reason,  # type: ignore[arg-type]
                      num_turns=calls, tool_calls=calls,
                      malformed_tool_calls=malformed_tool_calls)
