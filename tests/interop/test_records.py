"""ART trajectories <-> the trainer's records, on real rollouts: ours through the MCP server
and the engine (token in, token out), and ART's way (chat completions with token ids), then
the converted ART groups trained by our GRPO step."""

from __future__ import annotations

import pytest

pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")

import json

import art
import torch
from openai import AsyncOpenAI
from openai.types.chat.chat_completion import Choice

from mcprl_art.records import (
    NotTrainableError,
    art_group,
    art_trajectory,
    rollout_result,
    scored_group,
    token_record,
)
from mcprl_art.shapes import from_wire_trajectory
from mcprl_common.wire import Scenario
from mcprl_testing.judge import sql_trajectory
from mcprl_trainer.batch import build_step_batch
from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.groups import GroupBatch, ScoredGroup
from mcprl_trainer.grpo import GRPOUpdater
from mcprl_trainer.mcp_tools import open_session
from mcprl_trainer.modeling import load_policy
from mcprl_trainer.policy import PolicyClient
from mcprl_trainer.rollout import RolloutSettings, run_rollout
from mcprl_trainer.scripted import ScriptedSampler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TASK = "How many departments are there?"
SCENARIO = Scenario.from_art({"task": TASK, "difficulty": 1})


def _expert(renderer) -> ScriptedSampler:
    """Our scripted policy: real tool calls through the real server, three turns."""

    calls = [("list_tables", {}), ("run_query", {"sql": "SELECT COUNT(*) AS n FROM departments"}),
             ("complete_task", {"answer": "5"})]
    turns = [[*renderer.encode_glue(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}"
                                    "\n</tool_call>"), renderer.eos_token_id] for n, a in calls]
    return ScriptedSampler(turns, logprob=-0.5)


async def _our_rollouts(stack, renderer, n: int):
    """``n`` rollouts of our loop: two scripted (multi-turn), the rest sampled by the engine."""

    policy = PolicyClient(stack.engine_url, timeout_s=60)
    settings = RolloutSettings(system_prompt="List the tables, query, then complete_task.",
                               max_turns=3, max_tokens_per_turn=24, max_context=2048,
                               min_tokens_per_turn=8)
    try:
        out = []
        for seed in range(n):
            sampler = _expert(renderer) if seed < 2 else policy
            async with open_session(stack.mcp_url) as session:
                out.append(await run_rollout(SCENARIO, sampler=sampler, model=stack.model,
                                             renderer=renderer, session=session,
                                             settings=settings, seed=seed))
        return out
    finally:
        await policy.aclose()


async def test_our_rollouts_to_art_and_back_keep_the_token_record(art_stack, renderer) -> None:
    results = await _our_rollouts(art_stack, renderer, 4)
    assert [len(r.tokens.turns) for r in results[:2]] == [3, 3]
    assert results[0].trajectory.finish_reason == "completed"
    assert '"n":5' in results[0].trajectory.messages[5]["content"]  # the server's answer
    for i, result in enumerate(results):
        result.reward = i / 4
        result.components = {"ruler": i / 4}
        art_traj = art_trajectory(result)
        choices = [m for m in art_traj.messages_and_choices if isinstance(m, Choice)]
        assert len(choices) == len(result.tokens.turns)
        # ART's tokenizer reads the ids from "token_id:N" log-prob tokens
        assert [int(e.token.split(":")[1]) for e in choices[0].logprobs.content] == \
            result.tokens.turns[0].sampled_ids
        assert art_traj.reward == i / 4 and art_traj.metrics["ruler_score"] == i / 4
        back = rollout_result(art_traj, SCENARIO, renderer, model=art_stack.model)
        assert back.tokens == result.tokens
        assert back.tokens.flatten() == result.tokens.flatten()
        assert back.trajectory == result.trajectory
        assert (back.reward, back.components) == (result.reward, result.components)
    group = art_group(ScoredGroup(SCENARIO, results))
    again = scored_group(group, SCENARIO, renderer, model=art_stack.model)
    assert [r.tokens for r in again.results] == [r.tokens for r in results]


async def test_art_style_rollout_gives_the_engines_exact_ids(art_stack, renderer) -> None:
    client = AsyncOpenAI(base_url=art_stack.engine_url, api_key="EMPTY")
    async with open_session(art_stack.mcp_url) as session:
        tools = session.agent_tools()
    messages = [{"role": "system", "content": "Use the tools."},
                {"role": "user", "content": TASK}]
    trajectory = art.Trajectory(messages_and_choices=list(messages), tools=tools)
    prompts = []
    for turn in range(2):
        resp = await client.chat.completions.create(
            model=art_stack.model, messages=trajectory.messages(), tools=tools, logprobs=True,
            max_completion_tokens=16, seed=turn, extra_body={"return_token_ids": True})
        prompts.append(resp.model_extra["prompt_token_ids"])
        choice = resp.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.messages_and_choices.append(
            {"role": "user", "content": "Go on."})  # the next turn's input
    await client.close()
    record = token_record(trajectory, renderer, model=art_stack.model)
    # The first prompt is exactly what the engine rendered; the sampled ids and log-probs
    # are the engine's own.
    assert record.prompt_ids == prompts[0]
    for turn, choice in zip(record.turns, [m for m in trajectory.messages_and_choices
                                           if isinstance(m, Choice)], strict=True):
        assert turn.sampled_ids == choice.model_extra["token_ids"]
        assert turn.sampled_logprobs == [e.logprob for e in choice.logprobs.content]
    _, mask, _ = record.flatten()
    assert sum(mask) == sum(len(t.sampled_ids) for t in record.turns)
    assert len(record.turns[0].appended_ids) > 0


def test_what_cannot_be_trained_is_refused_clearly(renderer) -> None:
    plain = from_wire_trajectory(sql_trajectory(TASK, [], "3"))
    with pytest.raises(NotTrainableError, match="no sampled turn"):
        token_record(plain, renderer)
    no_ids = art.Trajectory(messages_and_choices=[
        {"role": "user", "content": TASK},
        Choice.model_validate({"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "3"}})])
    with pytest.raises(NotTrainableError, match="return_token_ids"):
        token_record(no_ids, renderer)
    no_lps = art.Trajectory(messages_and_choices=[
        {"role": "user", "content": TASK},
        Choice.model_validate({"index": 0, "finish_reason": "stop", "token_ids": [5, 6],
                               "message": {"role": "assistant", "content": "3"}})])
    with pytest.raises(NotTrainableError, match="logprobs=True"):
        token_record(no_lps, renderer)


async def test_our_grpo_step_trains_on_converted_art_groups(art_stack, renderer) -> None:
    results = await _our_rollouts(art_stack, renderer, 4)
    group = art_group(ScoredGroup(SCENARIO, results))
    for i, trajectory in enumerate(group.trajectories):
        trajectory.reward = [1.0, 0.0, 0.5, 0.0][i]  # as a judge would set them
    scored = scored_group(group, SCENARIO, renderer, model=art_stack.model)
    train = TrainConfig(lr=1e-2, device="cpu")
    batch = build_step_batch(GroupBatch(groups=[scored]), train, seed=0, step=1,
                             success_threshold=0.5)
    assert len(batch.samples) == 4 and batch.metrics["groups_trained"] == 1
    torch.manual_seed(0)
    model = load_policy(str(art_stack.model_path), LoraSettings(), train)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = GRPOUpdater(model, train, renderer.tokenizer.pad_token_id).step(batch.samples)
    assert metrics["train_samples"] == 4 and metrics["train_tokens"] > 0
    moved = [n for n, p in model.named_parameters() if p.requires_grad
             and not torch.equal(p.detach(), before[n])]
    assert moved, "no LoRA parameter changed"
    json.dumps(metrics)  # plain numbers, loggable
