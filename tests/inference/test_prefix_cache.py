"""Automatic prefix caching: an agent's next turn and a group's shared prompt reuse cached KV,
and what comes out is exactly what a full prefill gives (log-probs against a plain forward
pass), across adapters, eviction, ``n > 1`` and turning the cache off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams
from mcprl_inference.engine.prefix_cache import PrefixCache

pytestmark = pytest.mark.timeout(120)
SYSTEM = [(13 * j) % 900 + 20 for j in range(70)]  # a shared start: 4 full blocks and a bit


def _engine(model: Path, **kw) -> LLMEngine:
    cfg = EngineConfig(max_batch_size=8, max_model_len=512, **kw)
    return LLMEngine.from_pretrained(str(model), cfg).start()


@pytest.fixture(scope="module")
def engine(tiny_test_model: Path):
    eng = _engine(tiny_test_model)
    yield eng
    eng.shutdown()


def _run(eng: LLMEngine, prompt: list[int], n: int = 1, adapter: str | None = None, **kw):
    params = SamplingParams(max_tokens=kw.pop("max_tokens", 8), n=n, ignore_eos=True, **kw)
    return eng.add_request(prompt, params, adapter).result(60)


def test_cache_blocks_never_include_the_last_prompt_token() -> None:
    cache = PrefixCache(block_size=4, capacity_tokens=64)
    kv = torch.arange(2 * 2 * 1 * 12 * 1, dtype=torch.float32).reshape(2, 2, 1, 12, 1)
    assert cache.store("a", list(range(10)), kv) == 2  # 10 tokens: 2 full blocks
    hit = cache.lookup("a", list(range(8)))  # 8 tokens: the 2nd block would leave none to run
    assert hit is not None and hit.tokens == 4
    assert torch.equal(hit.kv, kv[:, :, :, :4])
    assert cache.lookup("a", list(range(9))).tokens == 8
    assert cache.lookup("b", list(range(9))) is None  # another adapter's weights
    assert cache.lookup("a", [0, 1, 2, 9, 4]) is None  # differs inside the first block


def test_cache_evicts_least_recently_used_blocks() -> None:
    cache = PrefixCache(block_size=2, capacity_tokens=4)  # two blocks
    kv = torch.zeros(1, 2, 1, 8, 1)
    cache.store(None, [1, 2, 3, 4], kv)
    cache.store(None, [5, 6, 7, 8], kv)  # evicts [1, 2] and [3, 4]
    assert cache.evicted_blocks == 2 and cache.cached_tokens == 4
    assert cache.lookup(None, [1, 2, 3, 4, 0]) is None
    assert cache.lookup(None, [5, 6, 7, 8, 0]).tokens == 4


def test_next_turn_reuses_the_previous_turn_exactly(engine, ref_logprobs) -> None:
    """Turn 2 = turn 1's prompt + its sampled tokens + a tool result: most of it is served
    from the cache, and its log-probs are those of a full forward pass."""

    turn1 = [*SYSTEM, 501, 502, 503]
    first = _run(engine, turn1, seed=1, max_tokens=12)
    sampled = first.outputs[0].token_ids
    turn2 = [*turn1, *sampled, 700, 701, 702, 703, 704]
    hits_before = engine.prefix_cache.hit_tokens
    second = _run(engine, turn2, seed=2, max_tokens=10)
    cached = second.cached_tokens
    assert cached >= 64 and cached % 16 == 0 and cached < len(turn2)
    assert engine.prefix_cache.hit_tokens - hits_before == cached
    seq = second.outputs[0]
    assert seq.logprobs == pytest.approx(ref_logprobs(turn2, seq.token_ids), abs=1e-4)


def test_a_group_shares_its_prompt_and_n_siblings_stay_exact(engine, ref_logprobs) -> None:
    prompt = [*SYSTEM, 42, 43]
    _run(engine, [*SYSTEM, 41])  # someone else's rollout left the shared start cached
    out = _run(engine, prompt, n=3, seed=9)
    assert out.cached_tokens == 64
    for seq in out.outputs:
        assert seq.logprobs == pytest.approx(ref_logprobs(prompt, seq.token_ids), abs=1e-4)


def test_a_burst_prefills_its_shared_start_once(tiny_test_model: Path, ref_logprobs) -> None:
    """Rollouts that arrive together with one system prompt: the first runs it, the others
    find it in the cache within the same admission, and every log-prob stays exact."""

    eng = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(max_batch_size=8,
                                                                        max_model_len=512))
    prompts = [[*SYSTEM, 800 + i, 801] for i in range(5)]
    futures = [eng.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True, seed=i))
               for i, p in enumerate(prompts)]  # queued before the loop runs: one admission
    eng.start()
    try:
        outs = [f.result(60) for f in futures]
    finally:
        eng.shutdown()
    assert eng.stats.prefill_batches == 1
    assert [o.cached_tokens for o in outs] == [0, 64, 64, 64, 64]
    assert eng.prefix_cache.query_tokens == sum(len(p) for p in prompts)
    for prompt, out in zip(prompts, outs, strict=True):
        seq = out.outputs[0]
        assert seq.logprobs == pytest.approx(ref_logprobs(prompt, seq.token_ids), abs=1e-4)


def test_same_outputs_with_the_cache_off(tiny_test_model: Path, engine) -> None:
    prompts = [[*SYSTEM, 300 + i] + [400 + j for j in range(3 * i)] for i in range(6)]
    off = _engine(tiny_test_model, enable_prefix_caching=False)
    try:
        assert not off.prefix_cache.enabled
        want = [_run(off, p, seed=i, max_tokens=6) for i, p in enumerate(prompts)]
    finally:
        off.shutdown()
    got = [_run(engine, p, seed=i, max_tokens=6) for i, p in enumerate(prompts)]
    assert all(g.cached_tokens > 0 for g in got[1:])
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].logprobs == pytest.approx(w.outputs[0].logprobs, abs=1e-5)
    assert all(w.cached_tokens == 0 for w in want)


def test_an_adapter_never_reads_the_base_models_blocks(tiny_test_model: Path, tmp_path: Path,
                                                       ref_logprobs) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                    target_modules=["q_proj", "v_proj"])).save_pretrained(
        tmp_path / "lora")
    eng = _engine(tiny_test_model, lora_mode="unmerged")
    try:
        prompt = [*SYSTEM, 11, 12, 13]
        _run(eng, prompt)  # the base model's blocks
        eng.load_lora("agent", str(tmp_path / "lora")).result(60)
        first = _run(eng, prompt, adapter="agent", seed=4)
        assert first.cached_tokens == 0
        again = _run(eng, prompt, adapter="agent", seed=4)
        assert again.cached_tokens == 64  # the adapter's own blocks
        eng.load_lora("agent", str(tmp_path / "lora")).result(60)  # republished: a new version
        assert _run(eng, prompt, adapter="agent", seed=4).cached_tokens == 0
    finally:
        eng.shutdown()
    fresh = AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(fresh, tmp_path / "lora").eval()
    seq = again.outputs[0]
    assert seq.logprobs == pytest.approx(ref_logprobs(prompt, seq.token_ids, adapted), abs=1e-4)
    assert seq.token_ids == first.outputs[0].token_ids


def test_a_tiny_cache_evicts_and_stays_exact(tiny_test_model: Path, ref_logprobs) -> None:
    eng = _engine(tiny_test_model)
    bytes_per_token = eng.runner.cache.bytes_per_token
    eng.shutdown()
    eng = _engine(tiny_test_model, prefix_cache_memory_gb=6 * 16 * bytes_per_token / 2**30)
    try:
        assert eng.prefix_cache.capacity_blocks == 6
        prompts = [[*SYSTEM[:40], 600 + i, *range(100 + i, 140 + i)] for i in range(5)]
        for i, p in enumerate(prompts):
            seq = _run(eng, p, seed=i).outputs[0]
            assert seq.logprobs == pytest.approx(ref_logprobs(p, seq.token_ids), abs=1e-4)
        assert eng.prefix_cache.evicted_blocks > 0
        assert eng.prefix_cache.cached_tokens <= 6 * 16
    finally:
        eng.shutdown()
