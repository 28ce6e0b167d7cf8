"""``train.liger_kernels``: Liger's RMSNorm and SwiGLU in the trained model give the plain
model's log-probs and LoRA gradients, touch only that instance, and fail clearly where they
cannot run (CPU, package missing)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers.models.qwen2 import modeling_qwen2

from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.modeling import load_base_model, prepare_policy, token_logprobs

pytestmark = pytest.mark.timeout(120)


def test_liger_kernels_refuse_a_cpu_model(tiny_test_model) -> None:
    base = load_base_model(str(tiny_test_model), torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        prepare_policy(base, LoraSettings(), TrainConfig(liger_kernels=True))


def _tiny_qwen2(device: torch.device):
    """A small random Qwen2 (no files: the GPU box gets no models/ folder)."""

    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=352,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available()
                    or importlib.util.find_spec("liger_kernel") is None,
                    reason="needs CUDA and the liger-kernel package")
def test_liger_kernels_keep_logprobs_and_gradients() -> None:
    device = torch.device("cuda")
    names = dict(vars(modeling_qwen2))
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 512, (3, 40), generator=gen).to(device)
    attn = torch.ones_like(ids)
    attn[1, 33:] = 0
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 20:33] = True
    results = []
    for liger in (False, True):
        base = _tiny_qwen2(device)
        torch.manual_seed(5)
        model = prepare_policy(base, LoraSettings(), TrainConfig(liger_kernels=liger))
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
        lp = token_logprobs(model, ids, attn, mask)
        lp.sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((lp.detach(), grads))
        if liger:
            patched = (base.model.norm.forward, base.model.layers[0].mlp.forward)
            assert all("Liger" in repr(f) for f in patched), patched
    (lp0, g0), (lp1, g1) = results
    assert torch.allclose(lp0, lp1, atol=1e-4), (lp0 - lp1).abs().max()
    assert torch.allclose(g0, g1, rtol=1e-3, atol=1e-5), (g0 - g1).abs().max()
    assert g0.abs().sum() > 0
    assert {k: v for k, v in vars(modeling_qwen2).items() if names.get(k) is not v} == {}
