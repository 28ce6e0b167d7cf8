"""The lean unmerged LoRA path: peft's function without peft's modules, adapters written in
place into preallocated buffers, so republishing or switching never replaces what a CUDA
graph captured (and never captures again)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.timeout(180)
PROMPT = [101, 57, 230, 18, 999, 4, 312, 77, 45, 600]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


def make_adapter(base_path: Path, out: Path, seed: int, rank: int = 4,
                 targets: list[str] | None = None, **config) -> Path:
    """A trained-looking adapter (random, non-zero A and B) as peft saves it."""

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False,
                     target_modules=targets or ALL, **config)
    get_peft_model(base, cfg).save_pretrained(out)
    return out


def peft_logprobs(base_path: Path, adapter: Path | None, prompt: list[int],
                  completion: list[int], device: str = "cpu") -> list[float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model = model.to(device).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion], device=device)).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def engine(model: Path, device: str = "cpu", **kw) -> LLMEngine:
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    cfg = EngineConfig(device=device, dtype="float32", max_batch_size=8, max_model_len=256,
                       lora_mode="unmerged", **kw)
    return LLMEngine.from_pretrained(str(model), cfg).start()


def greedy(eng: LLMEngine, adapter: str | None, prompt: list[int] = PROMPT):
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    return eng.add_request(prompt, params, adapter).result(120).outputs[0]


def assert_lean(eng: LLMEngine) -> None:
    """The engine runs our buffers, and the model's linears are still plain ``nn.Linear``."""

    q_proj = eng.model.model.layers[0].self_attn.q_proj
    assert type(q_proj) is nn.Linear and eng.lora.active_buffers()


@pytest.fixture(scope="module")
def adapters(tiny_test_model: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lean")
    return {"a": make_adapter(tiny_test_model, root / "a", 1, rank=4),
            "b": make_adapter(tiny_test_model, root / "b", 2, rank=8),
            "qv": make_adapter(tiny_test_model, root / "qv", 3, rank=2,
                               targets=["q_proj", "v_proj"]),
            "rslora": make_adapter(tiny_test_model, root / "rslora", 4, rank=4,
                                   use_rslora=True)}


@pytest.mark.parametrize("fuse", ["none", "proj", "proj+mlp+residual"])
@pytest.mark.parametrize("name", ["a", "rslora"])
def test_lean_path_equals_peft(tiny_test_model: Path, adapters, name: str, fuse: str) -> None:
    """Rank 4 under max_lora_rank 16 (padded buffers), and rsLoRA's alpha / sqrt(r); each
    linear on its own, q/k/v and gate/up merged (one stacked A, one block-diagonal B), and
    with the residual fusion, where a decode step's adapted down projection adds the
    residual in its base GEMM and its branch after it (the module itself is not called)."""

    eng = engine(tiny_test_model, max_lora_rank=16, fuse=fuse)
    layers = eng.model.model.layers
    down_calls: list[int] = []
    hooks = [layer.mlp.down_proj.register_forward_hook(lambda *_: down_calls.append(1))
             for layer in layers]
    try:
        eng.load_lora("policy", str(adapters[name])).result(60)
        out = greedy(eng, "policy")
        assert_lean(eng)
        # 1 prefill + 9 decode steps: with the fusion the module runs in the prefill only
        assert len(down_calls) == len(layers) * (1 if "residual" in fuse else 10)
    finally:
        for hook in hooks:
            hook.remove()
        eng.shutdown()
    ref = peft_logprobs(tiny_test_model, adapters[name], PROMPT, out.token_ids)
    assert out.logprobs == pytest.approx(ref, abs=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_republish_writes_the_same_buffers(tiny_test_model: Path, adapters, device: str
                                           ) -> None:
    """The trainer republishes ``policy`` every step: the new weights serve at once, in the
    tensors a captured graph holds, so nothing is captured again."""

    fresh = engine(tiny_test_model, device)
    try:
        fresh.load_lora("policy", str(adapters["rslora"])).result(60)
        want = greedy(fresh, "policy")
    finally:
        fresh.shutdown()
    eng = engine(tiny_test_model, device)
    try:
        eng.load_lora("policy", str(adapters["a"])).result(60)
        first = greedy(eng, "policy")
        buffers = [(id(t), t.data_ptr()) for t in eng.lora.active_buffers()]
        captures = eng.runner.graph_captures
        eng.load_lora("policy", str(adapters["rslora"])).result(60)  # same rank, new weights
        out = greedy(eng, "policy")
        assert [(id(t), t.data_ptr()) for t in eng.lora.active_buffers()] == buffers
        assert eng.runner.graph_captures == captures
        if device == "cuda":
            assert captures > 0
    finally:
        eng.shutdown()
    assert out.token_ids != first.token_ids
    assert out.token_ids == want.token_ids
    assert out.logprobs == pytest.approx(want.logprobs, abs=1e-6)


@pytest.mark.parametrize("fuse", ["none", "proj"])
@pytest.mark.parametrize("device", DEVICES)
def test_switching_base_and_adapters(tiny_test_model: Path, adapters, device: str,
                                     fuse: str) -> None:
    """Base, a (rank 4, every linear), qv (rank 2, two of them) and back, in one engine: each
    answers as peft does, so no layer keeps another adapter's weights or rank (with q/k/v
    merged, qv leaves k's block of the group's buffers at zero)."""

    eng = engine(tiny_test_model, device, fuse=fuse)
    try:
        eng.load_lora("a", str(adapters["a"])).result(60)
        eng.load_lora("qv", str(adapters["qv"])).result(60)
        assert_lean(eng)
        first = {m: greedy(eng, m) for m in (None, "a", "qv")}
        captures = eng.runner.graph_captures
        for m in ("qv", None, "a", "qv", "a", None):
            out = greedy(eng, m)
            assert out.token_ids == first[m].token_ids
            assert out.logprobs == pytest.approx(first[m].logprobs, abs=1e-6)
        assert eng.runner.graph_captures == captures  # a graph per (shape, rank) is kept
    finally:
        eng.shutdown()
    assert len({tuple(o.token_ids) for o in first.values()}) == 3
    for m, out in first.items():
        ref = peft_logprobs(tiny_test_model, adapters[m] if m else None, PROMPT,
                            out.token_ids, device)
        assert out.logprobs == pytest.approx(ref, abs=1e-5 if device == "cpu" else 1e-3)
