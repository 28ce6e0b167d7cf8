"""The lean LoRA forward (``train.lean_lora``): peft's log-probs and gradients exactly, peft's
own path wherever it does not apply (adapters disabled for the reference policy, dropout),
and under CUDA autocast the same bf16 result."""

from __future__ import annotations

import pytest
import torch

from mcprl_trainer.config import LoraSettings, TrainConfig
from mcprl_trainer.modeling import load_policy, reference_policy, token_logprobs

pytestmark = pytest.mark.timeout(120)


def _batch(vocab: int = 1000):
    ids = torch.randint(0, vocab, (3, 32), generator=torch.Generator().manual_seed(2))
    attn = torch.ones_like(ids)
    attn[2, 27:] = 0
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 12:27] = True
    return ids, attn, mask


def _run(model, ids, attn, mask):
    lp = token_logprobs(model, ids, attn, mask)
    lp.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), grads


def _policy(path, lean: bool, device: str = "cpu", **lora):
    torch.manual_seed(7)
    model = load_policy(str(path), LoraSettings(**lora),
                        TrainConfig(lean_lora=lean, device=device))
    gen = torch.Generator().manual_seed(8)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: make the adapter's path count
            with torch.no_grad():
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def test_lean_forward_matches_peft(tiny_test_model) -> None:
    ids, attn, mask = _batch()
    lean = _policy(tiny_test_model, True)
    patched = [m for m in lean.modules() if "_lean_forward" in repr(m.forward)]
    layers = lean.base_model.model.config.num_hidden_layers
    assert len(patched) == 7 * layers  # q k v o gate up down
    lp_lean, g_lean = _run(lean, ids, attn, mask)
    lp_peft, g_peft = _run(_policy(tiny_test_model, False), ids, attn, mask)
    assert torch.allclose(lp_lean, lp_peft, atol=1e-6)
    assert g_lean.keys() == g_peft.keys() and any("lora_A" in n for n in g_lean)
    for name in g_lean:
        scale = g_peft[name].abs().max()
        assert (g_lean[name] - g_peft[name]).abs().max() <= 1e-4 * scale, name
    with torch.no_grad(), reference_policy(lean):  # adapters off: the base model's log-probs
        ref = token_logprobs(lean, ids, attn, mask)
        base = token_logprobs(lean.get_base_model(), ids, attn, mask)
    assert torch.allclose(ref, base, atol=1e-6) and not torch.allclose(ref, lp_lean, atol=1e-3)


def _graph_nodes(tensor: torch.Tensor) -> set[str]:
    seen, names, stack = set(), set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(fn for fn, _ in node.next_functions)
    return names


def test_lean_forward_adds_in_place_without_copying_gradients(tiny_test_model) -> None:
    """One in-place addmm per linear, never on a view: a view would put CopySlices in the
    graph, which copies each linear's whole output gradient in the backward."""

    ids, attn, mask = _batch()
    nodes = _graph_nodes(token_logprobs(_policy(tiny_test_model, True), ids, attn, mask))
    assert "AddmmBackward0" in nodes and "CopySlices" not in nodes
    assert "MulBackward0" in _graph_nodes(token_logprobs(_policy(tiny_test_model, False),
                                                         ids, attn, mask))


def test_dropout_runs_pefts_forward(tiny_test_model) -> None:
    """Dropout is not covered by the lean path: peft's forward runs (same draws, same output)."""

    ids, attn, mask = _batch()
    outs = []
    for lean in (True, False):
        model = _policy(tiny_test_model, lean, dropout=0.5)
        torch.manual_seed(11)
        outs.append(token_logprobs(model, ids, attn, mask).detach())
    assert torch.equal(outs[0], outs[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bf16 autocast)")
def test_lean_forward_under_cuda_autocast(tiny_test_model) -> None:
    ids, attn, mask = (t.cuda() for t in _batch())
    results = []
    for lean in (True, False):
        model = _policy(tiny_test_model, lean, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(_run(model, ids, attn, mask))
    (lp0, g0), (lp1, g1) = results
    assert torch.allclose(lp0, lp1, atol=2e-2)
    for name in g0:
        scale = g1[name].abs().max().clamp_min(1e-6)
        assert ((g0[name] - g1[name]).abs().max() / scale) < 5e-2, name
