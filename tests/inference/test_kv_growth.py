"""The KV cache grows ahead of an agent's lengthening turns (a handful of reallocations, not
one per 64-token step), keeps what the running sequences wrote, and never passes its budget;
a multi-turn conversation through the engine stays exact across the resizes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def engine(tiny_test_model: Path):
    eng = LLMEngine.from_pretrained(str(tiny_test_model),
                                    EngineConfig(max_batch_size=8, max_model_len=4096))
    yield eng
    eng.shutdown()


def _resizes(runner, calls: list[tuple[int, int]], **kw) -> int:
    moved, last = 0, None
    for rows, length in calls:
        runner.ensure_capacity(rows, length, **kw)
        shape = (runner.cache.rows, runner.cache.capacity)
        moved += shape != last
        last = shape
        assert runner.cache.rows >= rows and runner.cache.capacity >= length
    return moved


def test_capacity_grows_ahead_of_longer_turns(engine) -> None:
    runner = engine.runner
    turns = [(4, 900 + 64 * k) for k in range(25)]  # a conversation gaining 64 tokens a turn
    assert _resizes(runner, turns, max_length=4096) <= 3
    assert runner.cache.capacity <= 4096


def test_growth_keeps_the_content_and_the_budget(engine) -> None:
    runner = engine.runner
    runner.ensure_capacity(2, 100)
    kv = runner.cache.kv
    marker = torch.arange(kv[:, :, 1, :, :100].numel(), dtype=kv.dtype).reshape(
        kv[:, :, 1, :, :100].shape)
    kv[:, :, 1, :, :100].copy_(marker)
    budget = 8 * 512
    runner.ensure_capacity(2, 200, budget_tokens=budget)
    assert runner.cache.rows * runner.cache.capacity <= budget
    runner.ensure_capacity(8, 300, budget_tokens=budget)  # more rows: the ahead part goes
    assert runner.cache.rows * runner.cache.capacity <= budget
    assert torch.equal(runner.cache.kv[:, :, 1, :, :100], marker)


def test_a_growing_conversation_matches_a_fresh_prefill(engine, ref_logprobs) -> None:
    engine.start()
    prompt = [(7 * j) % 500 + 20 for j in range(60)]
    for turn in range(4):
        out = engine.add_request(prompt, SamplingParams(max_tokens=40, ignore_eos=True,
                                                        seed=turn)).result(60)
        seq = out.outputs[0]
        assert seq.logprobs == pytest.approx(ref_logprobs(prompt, seq.token_ids), abs=1e-4)
        prompt = [*prompt, *seq.token_ids, *range(600, 680)]  # + a tool result
