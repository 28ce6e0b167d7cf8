"""One rollout: the agent loop over an MCP session, token in, token out.

Per turn: send the exact prompt ids to the engine, keep the sampled ids and their log-probs,
parse ``<tool_call>`` blocks from the sampled text (parsing only reads the text; the ids stay
as sampled), run the calls through MCP, render the results as new ids and go on. The loop
ends when the agent calls ``complete_task``, answers without a tool call, reaches
``max_turns`` or would not fit in the context.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from mcprl_common.wire import Scenario, Trajectory
from mcprl_trainer.config import RolloutConfig
from mcprl_trainer.mcp_tools import COMPLETE_TASK, McpSession, ToolResult
from mcprl_trainer.policy import SampledTurn
from mcprl_trainer.records import RolloutResult, TokenRecord, TurnRecord, derive_seed
from mcprl_trainer.rendering import ChatRenderer


class Sampler(Protocol):
    """What samples a turn: the engine client, or a scripted policy (warm start)."""

    async def complete(self, model: str, prompt_ids: list[int], *, max_tokens: int,
                       temperature: float, top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> SampledTurn: ...


@dataclass(frozen=True)
class RolloutSettings:
    system_prompt: str
    max_turns: int = 5
    max_tokens_per_turn: int = 256
    max_context: int = 4096
    min_tokens_per_turn: int = 16
    tool_output_max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def from_config(cls, ro: RolloutConfig, *, temperature: float | None = None
                    ) -> RolloutSettings:
        """From the run config's ``rollout`` section; ``temperature`` set = eval (top_p 1)."""

        return cls(
            system_prompt=ro.system_prompt, max_turns=ro.max_turns,
            max_tokens_per_turn=ro.max_tokens_per_turn, max_context=ro.max_context,
            min_tokens_per_turn=ro.min_tokens_per_turn,
            tool_output_max_tokens=ro.tool_output_max_tokens,
            temperature=ro.temperature if temperature is None else temperature,
            top_p=ro.top_p if temperature is None else 1.0,
        )


def truncate_tool_output(renderer: ChatRenderer, text: str, max_tokens: int) -> str:
    """Keep the head of a long tool result and say how much was cut (the model sees it)."""

    ids = renderer.encode_content(text)
    if len(ids) <= max_tokens:
        return text
    head = renderer.tokenizer.decode(ids[:max_tokens])
    return f"{head}\n...[truncated: {len(ids) - max_tokens} more tokens]"


def _openai_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _answer_text(arguments: dict[str, Any]) -> str:
    value = arguments.get("answer", arguments.get("summary"))
    if value is None and len(arguments) == 1:
        value = next(iter(arguments.values()))
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value)


async def run_rollout(
    scenario: Scenario,
    *,
    sampler: Sampler,
    model: str,
    renderer: ChatRenderer,
    session: McpSession,
    settings: RolloutSettings,
    seed: int,
) -> RolloutResult:
    """Run the agent on ``scenario`` once; never raises for the agent's own mistakes."""

    started = time.perf_counter()
    tools = session.agent_tools()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": settings.system_prompt},
        {"role": "user", "content": scenario.task},
    ]
    record = TokenRecord(prompt_ids=renderer.initial_prompt(messages, tools).ids)
    length = len(record.prompt_ids)
    eos = renderer.eos_token_id
    errors: Counter = Counter()
    finish: str = "max_turns"
    final_answer: str | None = None
    tool_calls = malformed = 0
    error_ids: list[str] = []  # tool_call_ids whose result was an error (for the report)
    for turn in range(settings.max_turns):
        room = settings.max_context - length
        if room < settings.min_tokens_per_turn:
            finish = "context_exhausted"
            break
        sampled = await sampler.complete(
            model, _prefix(record),
            max_tokens=min(settings.max_tokens_per_turn, room),
            temperature=settings.temperature, top_p=settings.top_p,
            seed=derive_seed(seed, turn), stop_token_ids=renderer.stop_token_ids,
        )
        ids = list(sampled.token_ids)
        turn_rec = TurnRecord(length, ids, list(sampled.logprobs), sampled.finish_reason,
                              sampled.model, seconds=sampled.seconds,
                              policy_version=sampled.policy_version)
        record.turns.append(turn_rec)
        length += len(ids)
        ended_with_eos = bool(ids) and ids[-1] == eos
        body = ids[:-1] if ended_with_eos else ids
        text = renderer.tokenizer.decode(body, skip_special_tokens=False)
        parsed = renderer.parse_assistant(text)
        assistant: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        calls = [c for c in parsed.calls if c.error is None]
        if calls:
            assistant["tool_calls"] = [_openai_call(c.name, c.arguments) for c in calls]
        messages.append(assistant)
        if not parsed.calls:
            finish = "no_tool_call"
            break
        tool_messages: list[dict[str, Any]] = []
        openai_calls = iter(assistant.get("tool_calls", []))
        done = False
        for call in parsed.calls:
            if call.error is not None:
                malformed += 1
                errors["malformed"] += 1
                result = ToolResult(f"Error: malformed tool call: {call.error}", True, "malformed")
                call_id = f"malformed_{malformed}"
            else:
                call_id = next(openai_calls)["id"]
                tool_calls += 1
                if call.name == COMPLETE_TASK:
                    final_answer = _answer_text(call.arguments)
                    done = True
                    break
                result = await session.call(call.name, call.arguments)
                if result.is_error:
                    errors[result.error_kind or "tool_error"] += 1
            if result.is_error:
                error_ids.append(call_id)
            text = truncate_tool_output(renderer, result.text, settings.tool_output_max_tokens)
            tool_messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        messages += tool_messages  # results of calls made before complete_task included
        if done:
            finish = "completed"
            break
        if turn + 1 == settings.max_turns:
            break  # no next turn: nothing more to render
        cont = renderer.continuation(messages[: len(messages) - len(tool_messages)],
                                     tool_messages, tools, sampled_ended_with_eos=ended_with_eos)
        if length + len(cont.ids) + settings.min_tokens_per_turn > settings.max_context:
            finish = "context_exhausted"
            break
        turn_rec.appended_ids = cont.ids
        length += len(cont.ids)
    trajectory = Trajectory(
        messages=messages,
        tools=tools,
        final_answer=final_answer,
        finish_reason=finish,  # type: ignore[arg-type]
        num_turns=len(record.turns),
        tool_calls=tool_calls,
        tool_errors=sum(errors.values()),
        malformed_tool_calls=malformed,
        metadata={"scenario_id": scenario.id, "model": model, "seed": seed,
                  "served_by": sorted({t.model for t in record.turns}),
                  "sampled_tokens": record.sampled_tokens, "tool_error_ids": error_ids},
    )
    return RolloutResult(scenario, trajectory, record, time.perf_counter() - started, errors)


def _prefix(record: TokenRecord) -> list[int]:
    """The exact ids sent for the next turn: everything so far, never re-rendered."""

    ids = list(record.prompt_ids)
    for turn in record.turns:
        ids += turn.sampled_ids
        ids += turn.appended_ids
    return ids
