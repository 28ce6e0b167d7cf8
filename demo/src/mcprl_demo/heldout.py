"""Held-out success of a model served by the engine: the trainer's agent loop on val
scenarios, each answer checked by the judge's verifiable checker (no LLM).

Used by the warm-start recipe for its before/after-SFT numbers. The trainer's own
``evaluate`` needs a judge service; here only the verdict matters, so the judge's checker is
called as a library: the same function the judge's ``verifiable`` mode runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcprl_common.wire import Scenario
from mcprl_demo.expert import verify
from mcprl_trainer.mcp_tools import open_session
from mcprl_trainer.policy import PolicyClient
from mcprl_trainer.recovery import RetryWindow
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.rollout import RolloutSettings, run_rollout


@dataclass
class HeldoutResult:
    model: str
    n: int = 0
    success_rate: float = 0.0
    completed_rate: float = 0.0  # called complete_task
    query_rate: float = 0.0  # ran at least one query (run_query) before answering
    mean_turns: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    by_template: dict[str, list[int]] = field(default_factory=dict)  # [successes, n]
    seconds: float = 0.0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "model", "n", "success_rate", "completed_rate", "query_rate", "mean_turns",
            "tool_calls", "tool_errors", "malformed", "finish_reasons", "by_template", "seconds")}


async def evaluate_heldout(
    scenarios: list[Scenario],
    *,
    base_url: str,
    model: str,
    mcp_url: str,
    renderer: ChatRenderer,
    settings: RolloutSettings,
    concurrency: int = 4,
    seed: int = 0,
    on_done: Any = None,
    retry: RetryWindow | None = None,
    mcp_auth_token: str | None = None,
) -> HeldoutResult:
    """``retry``: a rollout whose MCP session or engine call fails for the service's sake (a
    dropped session, a restart) is run again from the start, with the same seed, while the
    window lasts (default 90 s), as the trainer's rollouts are; one lost session no longer
    ends a whole evaluation."""

    loop = asyncio.get_running_loop()
    started = loop.time()
    policy = PolicyClient(base_url)
    gate = asyncio.Semaphore(concurrency)
    retry = retry or RetryWindow()

    async def attempt(i: int, scenario: Scenario):
        async with open_session(mcp_url, auth_token=mcp_auth_token) as session:
            return await run_rollout(scenario, sampler=policy, model=model, renderer=renderer,
                                     session=session, settings=settings,
                                     seed=seed * 100_003 + i)

    async def one(i: int, scenario: Scenario):
        async with gate:
            result = await retry.call(lambda: attempt(i, scenario),
                                      what=f"held-out rollout {scenario.id}")
        ok, detail = verify(scenario, result.trajectory.final_answer)
        if on_done is not None:
            on_done(ok)
        return result, ok, detail

    try:
        outcomes = await asyncio.gather(*(one(i, s) for i, s in enumerate(scenarios)))
    finally:
        await policy.aclose()
    out = HeldoutResult(model=model, n=len(outcomes))
    if not outcomes:
        return out
    reasons: Counter = Counter()
    for result, ok, detail in outcomes:
        t = result.trajectory
        reasons[t.finish_reason] += 1
        out.tool_calls += t.tool_calls
        out.tool_errors += t.tool_errors
        out.malformed += t.malformed_tool_calls
        out.mean_turns += t.num_turns
        key = result.scenario.template or "?"
        slot = out.by_template.setdefault(key, [0, 0])
        slot[0] += int(ok)
        slot[1] += 1
        calls = [c["function"] for m in t.messages if m["role"] == "assistant"
                 for c in m.get("tool_calls") or []]
        out.query_rate += any(c["name"] == "run_query" for c in calls)
        tools = [m["content"] for m in t.messages if m["role"] == "tool"]
        out.examples.append({"task": result.scenario.task, "answer": t.final_answer,
                             "correct": ok, "detail": detail, "finish": t.finish_reason,
                             "calls": [f"{c['name']}({c['arguments']})" for c in calls],
                             "last_result": tools[-1][:300] if tools else None,
                             "truth_sql": (result.scenario.ground_truth.sql
                                           if result.scenario.ground_truth else None)})
    n = len(outcomes)
    out.success_rate = sum(ok for _, ok, _ in outcomes) / n
    out.completed_rate = reasons["completed"] / n
    out.mean_turns /= n
    out.query_rate /= n
    out.finish_reasons = dict(reasons)
    out.seconds = loop.time() - started
    return out
