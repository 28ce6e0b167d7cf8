"""The CUDA path (static slot cache + CUDA-graph decode) against plain transformers, on a GPU.

Skipped without CUDA (CI is CPU-only; the CPU tests cover the same code with graphs off). Run
on a GPU box: ``PYTHONPATH=inference/src python -m pytest tests/inference/test_cuda_graphs.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _engine(model_path: Path, graphs: bool, dtype: str = "float32",
            fuse: str = "auto", decode_attention: str = "auto",
            capture_all: bool = True) -> LLMEngine:
    cfg = EngineConfig(device="cuda", dtype=dtype, max_batch_size=16, max_model_len=512,
                       cuda_graphs=graphs, fuse=fuse, decode_attention=decode_attention,
                       capture_all_batch_sizes=capture_all)
    return LLMEngine.from_pretrained(str(model_path), cfg).start()


def _prompts(n: int) -> list[list[int]]:
    return [[(11 * i + 5 * j) % 1000 + 10 for j in range(4 + 7 * i)] for i in range(n)]


def _run(engine: LLMEngine, prompts: list[list[int]], **kw) -> list:
    futures = [engine.add_request(p, SamplingParams(max_tokens=10 + 5 * (i % 3),
                                                    ignore_eos=True, **kw))
               for i, p in enumerate(prompts)]
    return [f.result(120).outputs[0] for f in futures]


def _reference(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion], device="cuda")
    model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0].float(), -1)
    finally:
        model.set_attn_implementation("mcprl_slots")
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("fuse", "attention"), [
    ("norm", "sdpa"), ("norm+rotary", "sdpa"), ("norm+proj", "sdpa"),
    ("norm+rotary+proj+mlp", "sdpa"), ("norm+rotary+proj+mlp", "triton"),
    ("norm+rotary+proj+mlp+kv+residual", "triton"),
    ("norm+rotary+proj+mlp+kv+residual+rope", "triton"),
    ("norm+rotary+proj+mlp+residual+rope+attn+sample", "triton")])
@pytest.mark.parametrize("model_fixture", ["tiny_test_model", "smollm2_model"])
def test_graph_decode_matches_forward_and_eager(model_fixture: str, fuse: str, attention: str,
                                                request) -> None:
    """Qwen2 (tiny-test) and Llama (SmolLM2): the two architectures the project serves; with
    the CUDA default's fused RMSNorm, with the compiled rotary embedding captured in the
    graphs too, with the merged q/k/v and gate/up GEMMs, with all of them and the compiled
    SiLU product, with those and the split-K decode attention, with its one-kernel KV
    write and the residual adds fused as well, with the rotary done by those kernels, and
    with the KV write and the chunk merge inside the attention kernel and the fused
    sampler."""

    tiny_test_model: Path = request.getfixturevalue(model_fixture)
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = _prompts(21)  # > max_batch_size: slots are reused, rows compacted mid-flight
    graphs = _engine(tiny_test_model, graphs=True, fuse=fuse, decode_attention=attention)
    try:
        assert ("rotary (torch.compile)" in graphs.runner.fusions) == ("rotary" in fuse)
        assert ("rotary in the kv write + attention (triton)" in graphs.runner.fusions) == (
            "rope" in fuse)
        assert ("kv write + chunk merge in the attention (triton)" in graphs.runner.fusions
                ) == ("attn" in fuse)
        assert ("sampler (triton)" in graphs.runner.fusions) == ("sample" in fuse)
        outs = _run(graphs, prompts, seed=3)
        assert graphs.runner.graph_captures > 0
        for p, o in zip(prompts, outs, strict=True):
            assert o.logprobs == pytest.approx(_reference(graphs.model, p, o.token_ids),
                                               abs=1e-3)
        greedy_graph = _run(graphs, prompts, temperature=0.0)
    finally:
        graphs.shutdown()
    eager = _engine(tiny_test_model, graphs=False)
    try:
        greedy_eager = _run(eager, prompts, temperature=0.0)
    finally:
        eager.shutdown()
    assert [o.token_ids for o in greedy_graph] == [o.token_ids for o in greedy_eager]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("capture_all", [True, False])
def test_batch_buckets_are_captured_at_the_first_decode(tiny_test_model: Path,
                                                        capture_all: bool) -> None:
    """With the split-K attention every bucket the slots hold is captured at the first
    decode, so a batch that shrinks as sequences finish, or a later smaller one, captures
    nothing more; lazily, only the buckets the steps met. Outputs are the same both ways."""

    from mcprl_inference.engine.model_runner import ROW_BUCKETS

    torch.backends.cuda.matmul.allow_tf32 = False
    engine = _engine(tiny_test_model, graphs=True, decode_attention="triton",
                     capture_all=capture_all)
    try:
        outs = _run(engine, _prompts(9), seed=4)  # 9 rows, then 6 and 3 as lengths end
        runner = engine.runner
        buckets = {key[0] for key in runner._graphs}
        all_buckets = {b for b in ROW_BUCKETS if b <= runner.cache.rows}
        captures = runner.graph_captures
        again = _run(engine, _prompts(2), seed=4)  # fewer rows, no growth of the cache
        if capture_all:
            assert buckets == all_buckets and len(all_buckets) > 3
            assert runner.graph_captures == captures
        else:
            assert buckets < all_buckets
            assert runner.graph_captures > captures  # 2 rows: a bucket not met before
        for p, o in zip(_prompts(9) + _prompts(2), outs + again, strict=True):
            assert o.logprobs == pytest.approx(_reference(engine.model, p, o.token_ids),
                                               abs=1e-3)
    finally:
        engine.shutdown()


@pytest.mark.timeout(300)
def test_lora_swaps_under_graphs(tiny_test_model: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32)
        peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                               target_modules=["q_proj", "v_proj", "up_proj"]))
        peft.save_pretrained(tmp_path / f"a{seed}")
        paths.append(tmp_path / f"a{seed}")
    engine = _engine(tiny_test_model, graphs=True)
    prompt = _prompts(3)[2]
    try:
        base_out = _run(engine, [prompt], temperature=0.0)[0].token_ids
        for path in paths:
            engine.load_lora("policy", str(path)).result(60)
            out = engine.add_request(prompt, SamplingParams(max_tokens=12, temperature=0.0,
                                                            ignore_eos=True),
                                     adapter="policy").result(60).outputs[0]
            ref_model = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32),
                path).cuda().eval()
            ids = torch.tensor([prompt + out.token_ids], device="cuda")
            with torch.no_grad():
                lp = torch.log_softmax(ref_model(ids).logits[0].float(), -1)
            ref = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(out.token_ids)]
            assert out.logprobs == pytest.approx(ref, abs=1e-3)
            assert out.token_ids != base_out
        assert _run(engine, [prompt], temperature=0.0)[0].token_ids == base_out
    finally:
        engine.shutdown()


@pytest.mark.timeout(300)
def test_bf16_sleep_wake_keeps_outputs(tiny_test_model: Path) -> None:
    engine = _engine(tiny_test_model, graphs=True, dtype="auto")
    try:
        assert engine.dtype == torch.bfloat16
        before = [o.token_ids for o in _run(engine, _prompts(5), temperature=0.0)]
        engine.sleep().result(60)
        assert engine.runner.cache.kv is None
        assert next(engine.model.parameters()).device.type == "cpu"
        engine.wake_up().result(60)
        after = [o.token_ids for o in _run(engine, _prompts(5), temperature=0.0)]
        assert before == after
    finally:
        engine.shutdown()
