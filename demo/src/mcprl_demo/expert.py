"""The scripted expert: solves ``sql`` scenarios through the real MCP tools, inside the
trainer's own agent loop.

It plugs into :func:`mcprl_trainer.rollout.run_rollout` as the *sampler*: each turn it
reads the latest tool result from the exact prompt ids the loop built, decides its next call
(list_tables -> describe_table on the tables the query needs -> run_query with the scenario's
ground-truth SQL -> complete_task with the answer formatted from the query result) and
returns that call as the token ids the trainer's renderer says a model would have to sample.
So the demonstrations have the trainer's system prompt, tool schemas (``complete_task``
included), tool-output truncation and token-level masks by construction: SFT on them teaches
exactly the format the trainer parses.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from mcprl_common.wire import Scenario
from mcprl_demo.answers import (
    corrupt_answer,
    format_answer,
    guess_answer,
    last_tool_response,
    parse_json,
    tables_in_sql,
)
from mcprl_trainer.mcp_tools import COMPLETE_TASK, open_session
from mcprl_trainer.policy import SampledTurn
from mcprl_trainer.records import RolloutResult
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.rollout import RolloutSettings, run_rollout

EXPERT_MODEL = "scripted-expert"
NOISE_KINDS = ("corrupt", "guess")


class ExpertError(RuntimeError):
    """The scenario cannot be demonstrated (no ground-truth SQL)."""


@dataclass
class ExpertPlan:
    """What the expert still has to do, consumed turn by turn."""

    scenario: Scenario
    noise: bool = False
    noise_kind: str = "corrupt"  # corrupt: a wrong copy of the result | guess: no run_query
    listed: bool = False
    tables: list[str] | None = None  # known after list_tables
    described: list[str] = field(default_factory=list)
    queried: bool = False
    answered: str | None = None


class ScriptedExpert:
    """A :class:`mcprl_trainer.rollout.Sampler` that plays a fixed, correct strategy."""

    def __init__(self, scenario: Scenario, renderer: ChatRenderer, *, noise: bool = False,
                 noise_kind: str = "corrupt", rng: random.Random | None = None,
                 number_style: str = "raw") -> None:
        truth = scenario.ground_truth
        if truth is None or not truth.sql:
            raise ExpertError(f"scenario {scenario.id} has no ground-truth SQL")
        if noise_kind not in NOISE_KINDS:
            raise ExpertError(f"noise_kind must be one of {NOISE_KINDS}, got {noise_kind!r}")
        self.renderer = renderer
        self.plan = ExpertPlan(scenario, noise, noise_kind)
        self.rng = rng or random.Random(0)
        self.number_style = number_style
        self._seen = 0  # prompt ids already read

    # -- the Sampler protocol ---------------------------------------------------------------
    async def complete(self, model: str, prompt_ids: list[int], *, max_tokens: int,
                       temperature: float, top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> SampledTurn:
        new_text = self.renderer.tokenizer.decode(prompt_ids[self._seen:],
                                                  skip_special_tokens=False)
        name, arguments = self.next_call(last_tool_response(new_text))
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": arguments}}]}
        history = [{"role": "user", "content": self.plan.scenario.task}]
        ids = self.renderer.assistant_turn(history, message, None).ids
        self._seen = len(prompt_ids) + len(ids)
        return SampledTurn(ids, [0.0] * len(ids), "stop", EXPERT_MODEL)

    # -- the strategy -----------------------------------------------------------------------
    def next_call(self, observation: str | None) -> tuple[str, dict[str, Any]]:
        plan = self.plan
        truth = plan.scenario.ground_truth
        assert truth is not None and truth.sql is not None
        if not plan.listed:
            plan.listed = True
            return "list_tables", {}
        if plan.tables is None:
            listed = parse_json(observation)
            names = [str(t) for t in listed] if isinstance(listed, list) else []
            lower = {n.lower(): n for n in names}
            plan.tables = [lower[t.lower()] for t in tables_in_sql(truth.sql) if t.lower() in lower]
        todo = [t for t in plan.tables if t not in plan.described]
        if todo:
            plan.described.append(todo[0])
            return "describe_table", {"table_name": todo[0]}
        if plan.noise and plan.noise_kind == "guess":
            # Answers without looking: a plausible value of the right shape, never read from
            # the database. One early decision (query or not) that reward can tell apart.
            plan.answered = guess_answer(truth.kind, truth.value, self.rng)
            return COMPLETE_TASK, {"answer": plan.answered}
        if not plan.queried:
            plan.queried = True
            return "run_query", {"sql": truth.sql}
        expected = len(truth.value) if isinstance(truth.value, list) else None
        answer = format_answer(truth.kind, parse_json(observation), expected, self.number_style)
        if answer is None:
            answer = "unknown"
        elif plan.noise:
            answer = corrupt_answer(answer, truth.kind, self.rng)
        plan.answered = answer
        return COMPLETE_TASK, {"answer": answer}


@dataclass
class Demonstration:
    """One expert rollout: the trainer's token record and trajectory, plus the verdict."""

    result: RolloutResult
    correct: bool
    noisy: bool
    detail: str

    @property
    def scenario(self) -> Scenario:
        return self.result.scenario

    def sft_row(self) -> dict[str, Any]:
        ids, mask, _ = self.result.tokens.flatten()
        return {"scenario_id": self.scenario.id, "template": self.scenario.template,
                "correct": self.correct, "noisy": self.noisy, "input_ids": ids, "mask": mask}

    def trajectory_row(self) -> dict[str, Any]:
        return {"scenario": self.scenario.model_dump(mode="json"),
                "trajectory": self.result.trajectory.model_dump(mode="json"),
                "correct": self.correct, "noisy": self.noisy, "detail": self.detail}


def verify(scenario: Scenario, answer: str | None) -> tuple[bool, str]:
    """The judge's own verifiable check (no LLM) of an answer against the ground truth."""

    from mcprl_judge.verifiable import check_answer

    if scenario.ground_truth is None:
        return False, "no ground truth"
    verdict = check_answer(answer or "", scenario.ground_truth)
    return verdict.correct, verdict.detail


async def demonstrate(
    scenarios: list[Scenario],
    *,
    mcp_url: str,
    renderer: ChatRenderer,
    settings: RolloutSettings,
    noise: float = 0.0,
    noise_kind: str = "corrupt",
    seed: int = 0,
    concurrency: int = 4,
    mcp_timeout_s: float = 30.0,
    number_style: str = "raw",
    on_done: Any = None,
) -> list[Demonstration]:
    """Run the expert on every scenario (one MCP session each); deterministic for a seed."""

    rng = random.Random(f"expert/{seed}")
    noisy = {s.id: rng.random() < noise for s in scenarios}
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, scenario: Scenario) -> Demonstration:
        async with gate, open_session(mcp_url, timeout_s=mcp_timeout_s) as session:
            expert = ScriptedExpert(scenario, renderer, noise=noisy[scenario.id],
                                    noise_kind=noise_kind,
                                    rng=random.Random(f"{seed}/{scenario.id}"),
                                    number_style=number_style)
            result = await run_rollout(scenario, sampler=expert, model=EXPERT_MODEL,
                                       renderer=renderer, session=session, settings=settings,
                                       seed=seed + index)
        correct, detail = verify(scenario, result.trajectory.final_answer)
        demo = Demonstration(result, correct, noisy[scenario.id], detail)
        if on_done is not None:
            on_done(demo)
        return demo

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(scenarios))))


def dumps_rows(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
