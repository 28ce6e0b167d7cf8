"""ART trajectories <-> the trainer's records (``RolloutResult`` with its ``TokenRecord``).

The trainer trains on the token ids the engine sampled, with the engine's log-probs, and on
template-rendered ids for everything else (never re-tokenised sampled text). An ART
``Choice`` carries those when the rollout asked for them:

- the ids: ``choice.token_ids`` (vLLM's and our engine's ``return_token_ids``, asked with
  ``extra_body={"return_token_ids": True}``), else ``logprobs`` tokens written
  ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``, what ART's own backend asks);
- the log-probs: ``choice.logprobs.content`` (``logprobs=True``).

The rest is rendered with the trainer's :class:`ChatRenderer`, exactly as our own rollout
loop renders it, so a rollout of ours converted to ART and back gives the same record. For a
rollout sampled through chat completions (ART's way) the first turn's prompt is exactly what
the engine saw; later turns were sampled after the engine re-rendered the conversation,
which can tokenise an earlier turn differently from how it was sampled. ART's own
tokenizer makes the same approximation.
"""

from __future__ import annotations

from typing import Any

import art
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from mcprl_art.shapes import (
    SCENARIO_KEY,
    choice_message,
    components_of,
    from_wire_trajectory,
    metrics_of,
    openai_tools,
    to_wire_trajectory,
)
from mcprl_common.wire import Scenario
from mcprl_trainer.groups import ScoredGroup
from mcprl_trainer.records import RolloutResult, TokenRecord, TurnRecord
from mcprl_trainer.rendering import ChatRenderer

TOKEN_ID_PREFIX = "token_id:"


class NotTrainableError(ValueError):
    """The trajectory lacks what training needs (sampled token ids and their log-probs)."""


def choice_token_ids(choice: Choice) -> list[int]:
    """The ids the engine sampled for this choice."""

    extra = choice.model_extra or {}
    ids = extra.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return list(ids)
    entries = (choice.logprobs.content or []) if choice.logprobs else []
    if entries and all(e.token.startswith(TOKEN_ID_PREFIX) for e in entries):
        return [int(e.token[len(TOKEN_ID_PREFIX):]) for e in entries]
    raise NotTrainableError(
        "a sampled turn has no token ids: ask the engine for them with "
        "extra_body={'return_token_ids': True} (vLLM >= 0.10.2, our engine) or "
        "return_tokens_as_token_ids (older vLLM)")


def choice_logprobs(choice: Choice, expected: int) -> list[float]:
    entries = (choice.logprobs.content or []) if choice.logprobs else []
    if not entries:
        raise NotTrainableError("a sampled turn has no log-probs: sample with logprobs=True")
    if len(entries) != expected:
        raise NotTrainableError(f"a sampled turn has {expected} token ids but {len(entries)} "
                                "log-probs")
    return [float(e.logprob) for e in entries]


def _turn_finish(choice: Choice) -> str:
    return "length" if choice.finish_reason == "length" else "stop"


def token_record(trajectory: art.Trajectory, renderer: ChatRenderer, *,
                 model: str = "") -> TokenRecord:
    """The trainer's token record of an ART trajectory (see the module docstring)."""

    items = list(trajectory.messages_and_choices)
    first = next((i for i, m in enumerate(items) if isinstance(m, Choice)), None)
    if first is None:
        raise NotTrainableError("the trajectory has no sampled turn (no Choice): nothing to "
                                "train on")
    tools = openai_tools(trajectory.tools)
    history: list[dict[str, Any]] = [dict(m) for m in items[:first]]  # type: ignore[arg-type]
    record = TokenRecord(prompt_ids=renderer.initial_prompt(history, tools).ids)
    length = len(record.prompt_ids)
    i = first
    while i < len(items):
        choice = items[i]
        if not isinstance(choice, Choice):
            raise NotTrainableError(f"message {i}: an assistant turn that was not sampled "
                                    "follows a sampled one; only tool results and user "
                                    "messages may come between sampled turns")
        ids = choice_token_ids(choice)
        extra = choice.model_extra or {}
        turn = TurnRecord(length, ids, choice_logprobs(choice, len(ids)), _turn_finish(choice),
                          str(extra.get("mcprl_model", model)),
                          seconds=float(extra.get("mcprl_seconds", 0.0)))
        record.turns.append(turn)
        length += len(ids)
        history.append(choice_message(choice))
        j = i + 1
        new: list[dict[str, Any]] = []
        while j < len(items) and not isinstance(items[j], Choice):
            message = dict(items[j])  # type: ignore[arg-type]
            if message.get("role") == "assistant":
                raise NotTrainableError(f"message {j}: an assistant message that was not "
                                        "sampled (no Choice) cannot be trained on")
            new.append(message)
            j += 1
        if j < len(items):  # another sampled turn follows: render what came in between
            ended = bool(ids) and ids[-1] == renderer.eos_token_id
            cont = renderer.continuation(history, new, tools, sampled_ended_with_eos=ended)
            turn.appended_ids = cont.ids
            length += len(cont.ids)
        history += new
        i = j
    return record


def rollout_result(trajectory: art.Trajectory, scenario: Scenario, renderer: ChatRenderer, *,
                   model: str = "") -> RolloutResult:
    """An ART trajectory as one of the trainer's rollouts, with its reward."""

    duration = trajectory.metrics.get("duration", 0.0)
    return RolloutResult(scenario=scenario, trajectory=to_wire_trajectory(trajectory),
                         tokens=token_record(trajectory, renderer, model=model),
                         seconds=float(duration), reward=trajectory.reward,
                         components=components_of(trajectory.metrics))


def _choice(message: dict[str, Any], turn: TurnRecord) -> Choice:
    calls = message.get("tool_calls") or []
    finish = "length" if turn.finish_reason == "length" else ("tool_calls" if calls else "stop")
    logprobs = ChoiceLogprobs(content=[
        ChatCompletionTokenLogprob(token=f"{TOKEN_ID_PREFIX}{tid}", logprob=lp, bytes=None,
                                   top_logprobs=[])
        for tid, lp in zip(turn.sampled_ids, turn.sampled_logprobs, strict=True)])
    return Choice.model_validate({
        "index": 0, "finish_reason": finish, "logprobs": logprobs,
        "message": {"role": "assistant", "content": message.get("content"),
                    **({"tool_calls": calls} if calls else {})},
        "token_ids": list(turn.sampled_ids),  # vLLM's field, read back by choice_token_ids
        "mcprl_model": turn.model, "mcprl_seconds": turn.seconds,  # which adapter, how long
    })


def art_trajectory(result: RolloutResult) -> art.Trajectory:
    """One of our rollouts as an ART trajectory whose sampled turns are ``Choice`` objects
    with the exact ids (as ``token_id:N`` log-prob tokens, which ART's tokenizer reads)."""

    art_traj = from_wire_trajectory(result.trajectory, reward=result.reward or 0.0,
                                    metrics=metrics_of(result.components))
    turns = iter(result.tokens.turns)
    items: list[Any] = []
    for message in result.trajectory.messages:
        if message.get("role") == "assistant":
            turn = next(turns, None)
            if turn is None:
                raise ValueError("the trajectory has more assistant messages than sampled turns")
            items.append(_choice(message, turn))
        else:
            items.append(dict(message))
    if next(turns, None) is not None:
        raise ValueError("the token record has more turns than the trajectory has assistant "
                         "messages")
    art_traj.messages_and_choices = items
    art_traj.metrics["duration"] = result.seconds
    return art_traj


def scored_group(group: art.TrajectoryGroup, scenario: Scenario, renderer: ChatRenderer, *,
                 model: str = "") -> ScoredGroup:
    """A scored ART group as the trainer's ``ScoredGroup`` (what ``build_step_batch`` takes)."""

    return ScoredGroup(scenario, [rollout_result(t, scenario, renderer, model=model)
                                  for t in group.trajectories])


def art_group(group: ScoredGroup) -> art.TrajectoryGroup:
    return art.TrajectoryGroup([art_trajectory(r) for r in group.results],
                               metadata={SCENARIO_KEY: group.scenario.model_dump_json()})
