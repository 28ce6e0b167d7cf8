"""The engine core without HTTP: continuous batching, slot compaction and n > 1 stay exact.

Every sampled token's log-prob must equal a plain transformers forward pass over the same ids,
whatever the batch around it did (sequences joining, finishing early, being moved between
slots): the proof that the static slot cache and the scheduler never mix sequences up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_inference.engine import EngineConfig, EngineError, LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_test_model: Path):
    eng = LLMEngine.from_pretrained(str(tiny_test_model),
                                    EngineConfig(max_batch_size=8, max_model_len=256)).start()
    yield eng
    eng.shutdown()


def _prompts(n: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % 1000 + 10 for j in range(5 + 3 * i)] for i in range(n)]


@pytest.mark.timeout(120)
def test_ragged_batch_matches_plain_forward(engine, ref_logprobs) -> None:
    prompts = _prompts(11)  # more than max_batch_size: some wait, join mid-flight
    futures = [engine.add_request(p, SamplingParams(max_tokens=6 + 3 * (i % 4), seed=i,
                                                    ignore_eos=True), request_id=f"r{i}")
               for i, p in enumerate(prompts)]
    outs = [f.result(60) for f in futures]
    for i, (p, out) in enumerate(zip(prompts, outs, strict=True)):
        seq = out.outputs[0]
        assert out.prompt_token_ids == p
        assert len(seq.token_ids) == 6 + 3 * (i % 4) and seq.finish_reason == "length"
        ref = ref_logprobs(p, seq.token_ids)
        assert seq.logprobs == pytest.approx(ref, abs=1e-4), f"request {i}"
    assert engine.stats.max_decode_batch == 8  # the queue filled every slot


@pytest.mark.timeout(60)
def test_n_copies_the_prompt_and_samples_independently(engine, ref_logprobs) -> None:
    prompt = _prompts(3)[2]
    out = engine.add_request(prompt, SamplingParams(n=4, max_tokens=8, seed=5,
                                                    ignore_eos=True)).result(60)
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    for o in out.outputs:
        assert o.logprobs == pytest.approx(ref_logprobs(prompt, o.token_ids), abs=1e-4)


@pytest.mark.timeout(60)
def test_seeded_sampling_does_not_depend_on_the_batch(engine) -> None:
    p = _prompts(2)[1]
    params = SamplingParams(max_tokens=12, seed=42, temperature=0.9, top_p=0.95,
                            ignore_eos=True)
    alone = engine.add_request(p, params).result(60).outputs[0].token_ids
    crowd = [engine.add_request(q, SamplingParams(max_tokens=12, seed=i, ignore_eos=True))
             for i, q in enumerate(_prompts(5))]
    again = engine.add_request(p, params).result(60).outputs[0].token_ids
    for f in crowd:
        f.result(60)
    assert alone == again


@pytest.mark.timeout(60)
def test_greedy_top_k_1_and_tiny_top_p_agree(engine) -> None:
    p = _prompts(4)[3]
    runs = [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
            SamplingParams(max_tokens=10, top_k=1, seed=1, ignore_eos=True),
            SamplingParams(max_tokens=10, top_p=1e-6, seed=2, ignore_eos=True)]
    outs = [engine.add_request(p, r).result(60).outputs[0].token_ids for r in runs]
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.timeout(60)
def test_stop_token_ids_and_limits(engine) -> None:
    p = _prompts(2)[0]
    greedy = engine.add_request(p, SamplingParams(max_tokens=6, temperature=0.0,
                                                  ignore_eos=True)).result(60).outputs[0]
    stop_at = greedy.token_ids[2]
    first = greedy.token_ids.index(stop_at)
    out = engine.add_request(p, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                               stop_token_ids=[stop_at])).result(60).outputs[0]
    assert out.token_ids == greedy.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    with pytest.raises(EngineError, match="maximum context length"):
        engine.add_request(list(range(10, 260)), SamplingParams(max_tokens=10))
    with pytest.raises(EngineError, match="out of vocabulary"):
        engine.add_request([5, engine.vocab_size], SamplingParams(max_tokens=1))


@pytest.mark.timeout(60)
def test_repetition_penalty_changes_greedy_choice(engine) -> None:
    p = [11] * 12
    plain = engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0,
                                                 ignore_eos=True)).result(60).outputs[0]
    strong = engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0,
                                                  repetition_penalty=50.0, ignore_eos=True)
                                ).result(60).outputs[0]
    assert 11 not in strong.token_ids  # a huge penalty bans the prompt's only token
    assert len(set(strong.token_ids)) == len(strong.token_ids)  # and every repeat
    assert plain.logprobs != strong.logprobs or plain.token_ids != strong.token_ids


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fuse", ["norm", "norm+rotary"])
def test_fused_decode_paths_match_forward(tiny_test_model: Path, ref_logprobs, fuse: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """The CUDA default's fused RMSNorm, and with it the compiled rotary embedding (inductor
    on the CPU here), against plain transformers; the model's module keeps its eager rotary
    outside the engine's passes (the reference below runs through it)."""

    eng = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        fuse=fuse, dtype="float32")).start()  # float32 on a GPU too, as the reference
    try:
        assert eng.runner.fusions and eng.runner.fusions[0].startswith("rms_norm")
        assert ("rotary (torch.compile)" in eng.runner.fusions) == ("rotary" in fuse)
        prompt = _prompts(3)[2]
        out = eng.add_request(prompt, SamplingParams(max_tokens=8, seed=4, ignore_eos=True)
                              ).result(60).outputs[0]
        assert out.logprobs == pytest.approx(ref_logprobs(prompt, out.token_ids), abs=1e-4)
        assert "compiled rotary failed" not in caplog.text  # it ran, no eager fallback
    finally:
        eng.shutdown()


@pytest.mark.timeout(60)
def test_a_failed_admission_fails_its_requests_and_serving_goes_on(engine, monkeypatch) -> None:
    """A prefill that fails before its sequences run (say the KV cache's growth running out
    of GPU memory beside trainers) fails its requests at once: they had left the queue, and
    nothing else answered them before their callers' timeouts (two runs of the 2026-12-06
    learning run waited 300 s)."""

    real, calls = engine.runner.ensure_capacity, []

    def fail_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "ensure_capacity", fail_once)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    failed = engine.add_request(_prompts(2)[1], params)
    with pytest.raises(EngineError, match="OutOfMemoryError"):
        failed.result(10)
    out = engine.add_request(_prompts(2)[1], params).result(30)
    assert len(out.outputs[0].token_ids) == 4 and len(calls) >= 2


def _spy_on(state: dict) -> tuple:
    """Count the calls of a compiled function (``compiled.compiled_or_eager``'s state);
    returns the function to put back and the list each call appends to."""

    compiled, calls = state["fn"], []

    def spy(*args, **kwargs):
        calls.append(1)
        return compiled(*args, **kwargs)

    state["fn"] = spy
    return compiled, calls


def _decode_passes(engine: LLMEngine, steps: int) -> int:
    """Decode forwards that ran Python for ``steps`` decode steps: each step when eager;
    with CUDA graphs only each capture's warm-up and capture (replays run no Python)."""

    runner = engine.runner
    return 2 * runner.graph_captures if runner.use_graphs else steps


@pytest.mark.timeout(180)
def test_an_engine_without_rotary_keeps_the_eager_one_beside_one_with_it(
        tiny_test_model: Path, ref_logprobs) -> None:
    """The compiled rotary is patched into the model class's module, which every engine of
    the process shares: only the engines installed with it may run it, whichever came first,
    and only in decode steps."""

    import sys

    # float32 on a GPU too, as the reference
    fused = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        fuse="norm+rotary", dtype="float32"))
    plain = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        fuse="none", dtype="float32")).start()
    fused.start()
    patched = sys.modules[type(fused.model.model.layers[0].self_attn).__module__]
    state = patched.apply_rotary_pos_emb._mcprl_state
    compiled, calls = _spy_on(state)
    try:
        assert "rotary (torch.compile)" in fused.runner.fusions and not plain.runner.fusions
        prompt = _prompts(3)[1]
        params = SamplingParams(max_tokens=6, seed=1, ignore_eos=True)
        out = plain.add_request(prompt, params).result(60).outputs[0]
        assert not calls  # the plain engine ran its passes with the eager rotary
        assert out.logprobs == pytest.approx(ref_logprobs(prompt, out.token_ids), abs=1e-4)
        again = fused.add_request(prompt, params).result(60).outputs[0]
        assert again.token_ids == out.token_ids
        # once a layer in each of the 5 decode steps; the prefill ran the eager one (faster)
        assert len(calls) == _decode_passes(fused, 5) * fused.model.config.num_hidden_layers
    finally:
        state["fn"] = compiled
        fused.shutdown()
        plain.shutdown()


@pytest.mark.timeout(180)
def test_the_compiled_silu_product_runs_in_decode_steps_only(tiny_test_model: Path,
                                                             ref_logprobs) -> None:
    """``fuse=mlp``: each SiLU MLP's ``silu(gate) * up`` is one compiled kernel in decode
    steps, with the log-probs of a plain forward pass; prefills keep the eager product."""

    from mcprl_inference.engine import fusions

    engine = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        fuse="mlp", dtype="float32")).start()  # float32 on a GPU too, as the reference
    state = fusions._SILU_MUL._mcprl_state
    compiled, calls = _spy_on(state)
    try:
        layers = engine.model.config.num_hidden_layers
        assert f"silu*up (torch.compile) x{layers}" in engine.runner.fusions
        prompt = _prompts(3)[2]
        out = engine.add_request(prompt, SamplingParams(max_tokens=6, seed=2, ignore_eos=True)
                                 ).result(60).outputs[0]
        assert out.logprobs == pytest.approx(ref_logprobs(prompt, out.token_ids), abs=1e-4)
        # 5 decode steps; the prefill ran the eager product
        assert len(calls) == _decode_passes(engine, 5) * layers
    finally:
        state["fn"] = compiled
        engine.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fuse", ["residual", "norm+proj+mlp+residual"])
def test_fused_residual_adds_run_in_decode_steps_only(tiny_test_model: Path, ref_logprobs,
                                                      fuse: str) -> None:
    """``fuse=residual``: in decode steps a layer's first residual add runs in the compiled
    add + RMSNorm and its second in the down projection's GEMM (the down module itself is
    not called); the log-probs are a plain forward pass's. Prefills run the layers as they
    are."""

    from mcprl_inference.engine import fusions

    engine = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        fuse=fuse, dtype="float32")).start()  # float32 on a GPU too, as the reference
    state = fusions._ADD_RMS_NORM._mcprl_state
    compiled, calls = _spy_on(state)
    layers = engine.model.model.layers
    down_calls: list[int] = []
    hooks = [layer.mlp.down_proj.register_forward_hook(lambda *_: down_calls.append(1))
             for layer in layers]
    try:
        assert f"residual adds fused x{len(layers)}" in engine.runner.fusions
        prompt = _prompts(3)[2]
        out = engine.add_request(prompt, SamplingParams(max_tokens=6, seed=2, ignore_eos=True)
                                 ).result(60).outputs[0]
        assert out.logprobs == pytest.approx(ref_logprobs(prompt, out.token_ids), abs=1e-4)
        assert len(calls) == _decode_passes(engine, 5) * len(layers)  # 5 decode steps
        assert len(down_calls) == len(layers)  # the prefill only
    finally:
        state["fn"] = compiled
        for hook in hooks:
            hook.remove()
        engine.shutdown()
