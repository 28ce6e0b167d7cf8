"""The batched sampler on toy logits: distribution, filters, counter-based seeds."""

from __future__ import annotations

import math

import pytest
import torch

from mcprl_inference.engine.sampling import (
    SamplingBatch,
    SamplingParams,
    counter_uniform,
    device_uniform,
    sample,
    unpack_bitmask,
)


def _batch(params: list[SamplingParams], seeds: list[int]) -> SamplingBatch:
    return SamplingBatch.build(params, seeds, torch.device("cpu"))


def test_counter_uniform_is_uniform_and_keyed() -> None:
    seeds = torch.full((20000,), 12345, dtype=torch.long)
    steps = torch.arange(20000)
    u = counter_uniform(seeds, steps)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert float(hist.min()) > 1800 and float(hist.max()) < 2200
    other = counter_uniform(seeds + 1, steps)
    assert not torch.equal(u, other)
    assert torch.equal(u, counter_uniform(seeds, steps))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_noise_on_cuda_has_the_eager_bits() -> None:
    """A seeded request samples the same tokens on any device and batch: the compiled
    kernel must give exactly the eager arithmetic's numbers, at every batch size."""

    gen = torch.Generator().manual_seed(0)
    for rows in (1, 7, 64, 300):
        seeds = torch.randint(0, 2**62, (rows,), generator=gen)
        steps = torch.randint(0, 2**31, (rows,), generator=gen)
        want = counter_uniform(seeds, steps)
        got = device_uniform(seeds.cuda(), steps.cuda()).cpu()
        assert torch.equal(got, want)


def test_samples_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = 8000
    logits = probs.log().expand(rows, 4).clone()
    batch = _batch([SamplingParams()] * rows, list(range(rows)))
    res = sample(logits, batch, torch.zeros(rows, dtype=torch.long))
    freq = torch.bincount(res.tokens, minlength=4).float() / rows
    assert torch.allclose(freq, probs, atol=0.02), freq
    lp = torch.tensor([r[1] for r in res.host])
    assert torch.allclose(lp, probs.log()[res.tokens], atol=1e-6)  # raw log-probs


def test_top_p_top_k_min_p_and_temperature() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = 3000
    logits = probs.log().expand(rows, 4).clone()
    steps = torch.zeros(rows, dtype=torch.long)
    for params, allowed in [(SamplingParams(top_p=0.6), {0, 1}),
                            (SamplingParams(top_k=3), {0, 1, 2}),
                            (SamplingParams(min_p=0.5), {0, 1})]:
        res = sample(logits, _batch([params] * rows, list(range(rows))), steps)
        assert set(res.tokens.tolist()) == allowed, params
    cold = sample(logits, _batch([SamplingParams(temperature=0.05)] * rows, list(range(rows))),
                  steps)
    assert float((cold.tokens == 0).float().mean()) > 0.99
    # log-probs stay raw: temperature does not change them
    assert math.isclose(cold.host[0][1], math.log(0.5), abs_tol=1e-6)


def test_greedy_mixed_with_sampling_and_top_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(seed=1, logprobs=2)]
    res = sample(logits, _batch(params, [1, 2]), torch.zeros(2, dtype=torch.long))
    assert res.tokens[0].item() == 1
    top_ids = [int(res.host[0][2]), int(res.host[0][4])]
    assert top_ids == [1, 2]


def test_bitmask_unpack_and_masking() -> None:
    vocab = 40
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 1] = 1 << 3  # only token 35 allowed
    allowed = unpack_bitmask(bitmask, vocab)
    assert allowed.shape == (1, vocab) and allowed[0].nonzero().flatten().tolist() == [35]
    logits = torch.randn(2, vocab)
    batch = _batch([SamplingParams(seed=3), SamplingParams(seed=4)], [3, 4])
    res = sample(logits, batch, torch.zeros(2, dtype=torch.long), allowed,
                 torch.tensor([1]))
    assert res.tokens[1].item() == 35
