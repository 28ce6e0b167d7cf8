"""Prefill/extend attention over grouped KV heads (``kv_cache.grouped_attention``): repeating
the KV heads, as the engine does on CUDA when there is a mask, computes what ``enable_gqa``
computes; on CUDA it is what lets the memory-efficient kernel run instead of the math one."""

from __future__ import annotations

import pytest
import torch

from mcprl_inference.engine.kv_cache import grouped_attention, set_decode_kernel, slot_attention


def _inputs(device: str, dtype: torch.dtype, rows: int = 3, heads: int = 8, kv_heads: int = 2,
            t: int = 5, cached: int = 7, dim: int = 16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, heads, t, dim, generator=gen).to(device, dtype)
    k = torch.randn(rows, kv_heads, cached + t, dim, generator=gen).to(device, dtype)
    v = torch.randn(rows, kv_heads, cached + t, dim, generator=gen).to(device, dtype)
    # an extend's mask: row r has r padded (unused) cache positions, causal over the new tokens
    positions = torch.arange(cached + t)
    mask = torch.zeros(rows, 1, t, cached + t, dtype=torch.bool)
    for r in range(rows):
        for i in range(t):
            mask[r, 0, i] = (positions >= r) & (positions <= cached + i)
    return q, k, v, mask.to(device)


def test_repeated_kv_heads_equal_enable_gqa_with_a_mask() -> None:
    q, k, v, mask = _inputs("cpu", torch.float32)
    repeated = grouped_attention(q, k, v, mask, None, repeat_kv=True)
    grouped = grouped_attention(q, k, v, mask, None, repeat_kv=False)
    torch.testing.assert_close(repeated, grouped, rtol=1e-5, atol=1e-6)
    # and both are attention: a row never attends to its masked cache positions
    v2 = v.clone()
    v2[2, :, :2] += 100.0  # row 2 masks its first two positions
    torch.testing.assert_close(grouped_attention(q, k, v2, mask, None, repeat_kv=True)[2],
                               repeated[2], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_masked_extend_runs_on_the_memory_efficient_kernel() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, mask = _inputs("cuda", torch.bfloat16)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):  # raises if it needs another kernel
        out = grouped_attention(q, k, v, mask, None)  # the default on CUDA: repeated heads
    ref = grouped_attention(q.float(), k.float(), v.float(), mask, None, repeat_kv=False)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_decode_attention_reads_a_boolean_and_an_additive_mask_alike(kernel: str) -> None:
    """A decode step's mask is additive (built once a step, so SDPA does not convert a
    boolean one in every layer); an extend of one token still brings a boolean one."""

    gen = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, length, dim = 3, 8, 2, 9, 16
    q = torch.randn(rows, heads, 1, dim, generator=gen)
    k = torch.randn(rows, kv_heads, length, dim, generator=gen)
    v = torch.randn(rows, kv_heads, length, dim, generator=gen)
    allowed = torch.arange(length)[None, :] <= torch.tensor([2, 5, 8])[:, None]
    boolean = allowed[:, None, None, :]
    additive = torch.zeros(boolean.shape).masked_fill_(~boolean, float("-inf"))
    scores = q @ k.repeat_interleave(heads // kv_heads, 1).transpose(-1, -2) * dim**-0.5
    want = (torch.softmax(scores + additive, -1)
            @ v.repeat_interleave(heads // kv_heads, 1)).transpose(1, 2)
    set_decode_kernel(kernel)
    try:
        got = [slot_attention(torch.nn.Module(), q, k, v, mask)[0] for mask in (boolean, additive)]
    finally:
        set_decode_kernel("sdpa")
    for out in got:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
