"""Fewer prefill forward passes, same outputs: equal prompts admitted together run once (their
KV and logits copied, as for n > 1), and every prompt with a cached start runs its rest in one
batched pass. Each is compared with the prefix cache off, on the Qwen2-shaped tiny model and
on a Llama-shaped one (their attention masks are built differently)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mcprl_inference.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams

pytestmark = pytest.mark.timeout(180)
SYSTEM = [(13 * j) % 900 + 20 for j in range(70)]  # 4 full blocks of 16 and a bit


def _config(**kw: Any) -> EngineConfig:
    return EngineConfig(max_batch_size=16, max_model_len=512, **kw)


def _llama() -> Any:
    """A random Llama-architecture model of the tiny model's size (the same weights on
    every call): Llama builds its mask without layer types, unlike Qwen2."""

    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1086, hidden_size=128, intermediate_size=384,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, eos_token_id=2)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _engines(arch: str, model: Path) -> Callable[..., LLMEngine]:
    """A factory of engines (not started) for ``arch``, each with fresh equal weights."""

    def make(**kw: Any) -> LLMEngine:
        if arch == "llama":
            return LLMEngine(_llama(), None, _config(**kw))
        return LLMEngine.from_pretrained(str(model), _config(**kw))

    return make


def _params(seed: int, n: int = 1, max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, n=n, seed=seed, ignore_eos=True,
                          temperature=1.0)


def _together(eng: LLMEngine, requests: list[tuple[list[int], SamplingParams]]
              ) -> list[RequestOutput]:
    """All queued while the engine thread is held in a command (it runs only with nothing
    running, and admission waits for it): one admission, one prefill."""

    eng.start()
    held, release = threading.Event(), threading.Event()
    gate = eng.call(lambda: (held.set(), release.wait(60)))
    assert held.wait(60)
    futures = [eng.add_request(p, params) for p, params in requests]
    release.set()
    gate.result(60)
    return [f.result(60) for f in futures]


def _alone(eng: LLMEngine, requests: list[tuple[list[int], SamplingParams]]
           ) -> list[RequestOutput]:
    eng.start()
    return [eng.add_request(p, params).result(60) for p, params in requests]


def _run(eng: LLMEngine, submit: Callable[..., list[RequestOutput]],
         requests: list[tuple[list[int], SamplingParams]]) -> list[RequestOutput]:
    """``submit(eng, requests)``, then the engine shut down (its stats stay readable)."""

    try:
        return submit(eng, requests)
    finally:
        eng.shutdown()


def _assert_same(got: list[RequestOutput], want: list[RequestOutput]) -> None:
    for g, w in zip(got, want, strict=True):
        assert len(g.outputs) == len(w.outputs)
        for gs, ws in zip(g.outputs, w.outputs, strict=True):
            assert gs.token_ids == ws.token_ids
            assert gs.logprobs == pytest.approx(ws.logprobs, abs=1e-5)


@pytest.mark.parametrize("cache", [True, False], ids=["prefix_cache_on", "prefix_cache_off"])
def test_equal_prompts_admitted_together_prefill_once(tiny_test_model: Path, cache: bool
                                                      ) -> None:
    """Rollouts of one task sent as n=1 requests (and one n=2 among them) next to another
    prompt: one forward pass in all, and each gets what it gets alone with no cache."""

    task = [*SYSTEM, 501, 502, 503]
    other = [7, 8, 9, *SYSTEM[:30]]
    requests = [(task, _params(0)), (other, _params(1)), (task, _params(2)),
                (task, _params(3, n=2)), (task, _params(4))]
    make = _engines("qwen2", tiny_test_model)
    eng = make(enable_prefix_caching=cache)
    got = _run(eng, _together, requests)
    ref = make(enable_prefix_caching=False)
    want = _run(ref, _alone, requests)
    _assert_same(got, want)
    assert eng.stats.prefill_batches == 1
    assert eng.stats.prefill_forwards == 1  # before: the copies ran as followers, one each
    assert ref.stats.prefill_forwards == len(requests)
    assert [o.cached_tokens for o in got] == [0, 0, len(task) - 1, len(task) - 1, len(task) - 1]
    assert eng.stats.cached_prompt_tokens == 3 * (len(task) - 1)
    assert len({tuple(s.token_ids) for o in got for s in o.outputs}) > 1  # seeds still differ


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_cached_starts_run_their_rests_in_one_pass(tiny_test_model: Path, arch: str) -> None:
    """Next turns of three conversations (cached starts of 32, 64 and 96 tokens, rests of 3
    to 20 tokens) admitted with a cold prompt and an n=2 request between them, so their slots
    are not consecutive, and a copy of one of them: one pass for the cold prompt, one for all
    the rests, and the log-probs of a cold prefill."""

    firsts = [[*SYSTEM[:40]], [*SYSTEM, 11, 12], [*SYSTEM, *range(300, 330)]]
    turns = [[*firsts[0], 901, 902, 903],
             [*firsts[1], *range(600, 620)],
             [*firsts[2], *range(700, 707)]]
    cold = [5, 6, *range(400, 450)]
    requests = [(turns[0], _params(10)), (cold, _params(11)), (turns[1], _params(12, n=2)),
                (turns[2], _params(13)), (turns[1], _params(14))]  # the last: a copy
    make = _engines(arch, tiny_test_model)
    eng = make()
    try:
        _alone(eng, [(p, _params(0, max_tokens=1)) for p in firsts])  # leaves the starts cached
        forwards = eng.stats.prefill_forwards
        got = _together(eng, requests)
    finally:
        eng.shutdown()
    ref = make(enable_prefix_caching=False)
    want = _run(ref, _together, requests)
    assert [o.cached_tokens for o in got] == [32, 0, 64, 96, len(turns[1]) - 1]
    assert eng.stats.prefill_forwards - forwards == 2  # before: 1 + one per cached start
    _assert_same(got, want)


def test_extend_passes_stay_within_max_prefill_tokens(tiny_test_model: Path) -> None:
    """Rows x the longest rest is what a batched pass runs (right padding): a long rest goes
    to a pass of its own rather than padding the short ones to its length."""

    eng = LLMEngine.from_pretrained(str(tiny_test_model), _config(max_prefill_tokens=128))
    try:
        starts = [[*SYSTEM, i] for i in range(4)]
        _alone(eng, [(p, _params(0, max_tokens=1)) for p in starts])
        turns = [[*starts[0], *range(500, 560)], *[[*p, 900, 901] for p in starts[1:]]]
        before = eng.stats.prefill_batches, eng.stats.prefill_forwards
        outs = _together(eng, [(p, _params(i)) for i, p in enumerate(turns)])
    finally:
        eng.shutdown()
    assert all(o.cached_tokens == 64 for o in outs)
    assert eng.stats.prefill_batches - before[0] == 1  # 60 + 3 x 9 uncached tokens: one round
    assert eng.stats.prefill_forwards - before[1] == 2  # the three short rests; the long one


class _SubmitWhileDecoding:
    """An engine observer that queues one more request from the engine's own thread at the
    end of the first step that left sequences running: a later admission, certainly while
    the first request still decodes (no timing involved)."""

    def __init__(self, prompt: list[int], params: SamplingParams) -> None:
        self.prompt, self.params = prompt, params
        self.engine: LLMEngine | None = None
        self.future: Any = None

    def on_step(self, running: int, waiting: int, decode_batch: int) -> None:
        if self.future is None and running and self.engine is not None:
            self.future = self.engine.add_request(self.prompt, self.params)

    def on_request_done(self, output: RequestOutput, adapter: str | None) -> None:
        pass


def test_a_copy_admitted_later_finds_the_prompt_cached_while_the_first_decodes(
        tiny_test_model: Path) -> None:
    """The rollouts of one task reach the engine over HTTP a few at a time: a copy of a prompt
    that is still decoding finds its full blocks in the cache (stored at prefill, not when the
    sequence ends) and runs only the last partial block, with a cold prefill's log-probs."""

    task = [*SYSTEM, 501, 502, 503]  # 73 tokens: 4 full blocks of 16 and 9 more
    observer = _SubmitWhileDecoding(task, _params(1))
    eng = LLMEngine.from_pretrained(str(tiny_test_model), _config(), observer=observer)
    observer.engine = eng
    try:
        first = _alone(eng, [(task, _params(0, max_tokens=24))])[0]
        second = observer.future.result(60)
    finally:
        eng.shutdown()
    ref = LLMEngine.from_pretrained(str(tiny_test_model), _config(enable_prefix_caching=False))
    want = _run(ref, _alone, [(task, _params(0, max_tokens=24)), (task, _params(1))])
    assert eng.stats.prefill_batches == 2  # two admissions: the copy was not admitted with it
    assert second.cached_tokens == 64  # before: 0, the first was cached only once it ended
    assert first.cached_tokens == 0
    _assert_same([first, second], want)


def test_cold_prompts_run_in_passes_whose_padded_shape_stays_within_the_budget(
        tiny_test_model: Path) -> None:
    """Admission bounds the sum of the prompts' lengths (120 <= 128 here: one round); a pass
    runs them right-padded to the longest (3 x 100), so the long one goes alone and the
    short ones together, with the outputs each gets alone."""

    prompts = [[*SYSTEM, *range(600, 630)], [5, *range(700, 709)], [6, *range(800, 809)]]
    requests = [(p, _params(i)) for i, p in enumerate(prompts)]
    eng = LLMEngine.from_pretrained(str(tiny_test_model), _config(max_prefill_tokens=128))
    got = _run(eng, _together, requests)
    ref = LLMEngine.from_pretrained(str(tiny_test_model), _config(enable_prefix_caching=False))
    want = _run(ref, _alone, requests)
    assert [len(p) for p in prompts] == [100, 10, 10]
    assert eng.stats.prefill_batches == 1  # one admission
    assert eng.stats.prefill_forwards == 2  # [10, 10] then [100]; before: one 3 x 100 pass
    _assert_same(got, want)
