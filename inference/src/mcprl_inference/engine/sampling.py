"""Per-request sampling parameters and one batched sampler for the whole running batch.

Randomness is counter-based: each sequence draws its uniform for step ``k`` from a hash of
(its seed, ``k``), computed on the device for the whole batch at once. So a seeded request gives
the same tokens whether it runs alone or batched with others, and the sampler needs no per-row
``torch.Generator`` calls (which would cost a kernel launch per row per step). Sampling is by
inverse CDF over float64 cumulative sums, with top-k / top-p / min-p applied in sorted space
only when some row asks for them.

Log-probs are vLLM's default ``raw_logprobs``: ``log_softmax`` of the model's logits before
penalties, grammar masks, temperature and top-p/top-k. The trainer uses them as the sampler's
log-probs; at temperature 1 without filters they are exactly the sampling distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mcprl_inference.engine import sampling_kernel
from mcprl_inference.engine.compiled import compiled_or_eager

_M32 = 0xFFFFFFFF


@dataclass
class SamplingParams:
    """What one request asks of the sampler (OpenAI/vLLM names and meanings)."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1: off."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    """``None``: no log-probs returned; ``k >= 0``: the sampled token's plus the top ``k``."""
    grammar: Any = None
    """A compiled xgrammar grammar (structured output) or ``None``."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def _mulmod32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``x < 2**32`` held in int64 without overflowing it."""

    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (xorshift-multiply), well mixed for counter-based noise."""

    x = x ^ (x >> 16)
    x = _mulmod32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mulmod32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Uniform in (0, 1) (float64) for each (seed, step) pair; seeds are int64, steps int64."""

    lo, hi = seeds & _M32, (seeds >> 32) & 0x7FFFFFFF
    h = _mix32((steps & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ lo)
    h = _mix32(h ^ hi)
    h2 = _mix32(h ^ 0x85EBCA6B)
    bits = (h << 21) ^ (h2 & 0x1FFFFF)  # 53 random bits
    return (bits.double() + 0.5) / float(1 << 53)


_UNIFORM = compiled_or_eager(counter_uniform, "sampler noise")


def device_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """:func:`counter_uniform`, on CUDA as one compiled kernel: eagerly it is ~80 kernels on a
    handful of integers, launched after every decode step's forward pass. Integer arithmetic
    and the exact float64 scaling give the same bits either way (a CUDA test checks)."""

    return _UNIFORM(seeds, steps) if seeds.is_cuda else counter_uniform(seeds, steps)


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of the running batch, as device tensors (rebuilt on change)."""

    temperature: torch.Tensor
    greedy: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    seeds: torch.Tensor
    repetition: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    any_filter: bool
    any_penalty: bool
    all_greedy: bool
    unit_temperature: bool
    max_logprobs: int

    @classmethod
    def build(cls, params: Sequence[SamplingParams], seeds: Sequence[int],
              device: torch.device) -> SamplingBatch:
        def f(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        temps = [p.temperature for p in params]
        greedy = [t < 1e-5 for t in temps]
        top_k = [p.top_k if p.top_k and p.top_k > 0 else 0 for p in params]
        return cls(
            temperature=f([t if t >= 1e-5 else 1.0 for t in temps]),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_p=f([p.top_p for p in params]),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            min_p=f([p.min_p for p in params]),
            seeds=torch.tensor(list(seeds), dtype=torch.long, device=device),
            repetition=f([p.repetition_penalty for p in params]),
            presence=f([p.presence_penalty for p in params]),
            frequency=f([p.frequency_penalty for p in params]),
            any_filter=any(p.top_p < 1.0 or p.min_p > 0.0 for p in params) or any(top_k),
            any_penalty=any(p.needs_penalties for p in params),
            all_greedy=all(greedy),
            unit_temperature=all(t == 1.0 for t in temps),
            max_logprobs=max((p.logprobs or 0) for p in params),
        )


class SampleResult:
    """A step's sampled ids on the device, and its rows on their way to the host.

    On CUDA the rows are copied into pinned memory without blocking: the engine can launch
    the next decode step (whose input is ``tokens``, already on the device) before it reads
    them (``async_scheduling``, docs/benchmarks.md).
    """

    def __init__(self, tokens: torch.Tensor, rows: torch.Tensor) -> None:
        self.tokens = tokens
        """``[B]`` sampled ids (device)."""
        self._ready: torch.cuda.Event | None = None
        if rows.is_cuda:
            self._rows = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            self._rows.copy_(rows, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._rows = rows

    @property
    def host(self) -> list[list[float]]:
        """Per row: ``[token, logprob, top_id_1, top_lp_1, ...]``; waits for the copy."""

        if self._ready is not None:
            self._ready.synchronize()
        return self._rows.tolist()


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, prompt_mask: torch.Tensor,
                    batch: SamplingBatch) -> torch.Tensor:
    """vLLM's penalties: repetition over prompt+output, presence/frequency over the output."""

    seen_out = counts > 0
    seen = seen_out | prompt_mask
    rep = batch.repetition[:, None]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalised, logits)
    return (logits - batch.frequency[:, None] * counts.to(logits.dtype)
            - batch.presence[:, None] * seen_out.to(logits.dtype))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's int32 bitmask ``[B, ceil(V/32)]`` -> bool allowed ``[B, V]`` (any device)."""

    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def sample(logits: torch.Tensor, batch: SamplingBatch, steps: torch.Tensor,
           allowed: torch.Tensor | None = None, allowed_rows: torch.Tensor | None = None,
           counts: torch.Tensor | None = None, prompt_mask: torch.Tensor | None = None,
           *, fused: bool = False) -> SampleResult:
    """Sample one token per row of ``logits [B, V]`` (float32) and report raw log-probs.

    ``allowed`` (bool ``[R, V]``) masks the rows ``allowed_rows`` (grammar); ``counts`` and
    ``prompt_mask`` (``[B, V]``) feed the penalties when any row has them. ``fused``: where
    no row needs a penalty, a mask, a filter or more than the top-1 log-prob, two Triton
    kernels do it all (:mod:`.sampling_kernel`, ``fuse`` kind ``sample``; the caller says
    it can run on this device).
    """

    penalties = batch.any_penalty and counts is not None and prompt_mask is not None
    if (fused and not penalties and allowed is None and not batch.any_filter
            and batch.max_logprobs <= 1):
        tokens, rows = sampling_kernel.sample_rows(
            logits, batch.temperature, batch.greedy, device_uniform(batch.seeds, steps),
            unit_temperature=batch.unit_temperature, top1=batch.max_logprobs == 1)
        return SampleResult(tokens, rows)
    logprobs = torch.log_softmax(logits, dim=-1)
    x = logits
    if penalties:
        x = apply_penalties(x, counts, prompt_mask, batch)
    if allowed is not None and allowed_rows is not None:
        x = x.clone() if x is logits else x
        rows = x[allowed_rows]
        x[allowed_rows] = rows.masked_fill(~allowed, float("-inf"))
    greedy_tokens = torch.argmax(x, dim=-1)
    if batch.all_greedy:
        tokens = greedy_tokens
    else:
        if not batch.unit_temperature:
            x = x / batch.temperature[:, None]
        u = device_uniform(batch.seeds, steps)
        if batch.any_filter:
            sorted_x, order = torch.sort(x, dim=-1, descending=True)
            probs = torch.softmax(sorted_x, dim=-1)
            vocab = probs.shape[-1]
            ranks = torch.arange(vocab, device=probs.device)[None, :]
            cum = torch.cumsum(probs, dim=-1)
            drop = (cum - probs) > batch.top_p[:, None]
            drop |= (batch.top_k[:, None] > 0) & (ranks >= batch.top_k[:, None])
            drop |= probs < (batch.min_p[:, None] * probs[:, :1])
            drop[:, 0] = False
            probs = probs.masked_fill(drop, 0.0)
            cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
            target = (u * cdf[:, -1]).unsqueeze(-1)
            pick = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
            sampled = order.gather(-1, pick).squeeze(-1)
        else:
            # untouched logits at T=1: the distribution is exp(raw log-probs), no second softmax
            plain = x is logits and batch.unit_temperature
            probs = logprobs.exp() if plain else torch.softmax(x, dim=-1)
            cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
            target = (u * cdf[:, -1]).unsqueeze(-1)
            sampled = torch.searchsorted(cdf, target, right=True).clamp_(
                max=probs.shape[-1] - 1).squeeze(-1)
        tokens = torch.where(batch.greedy, greedy_tokens, sampled)
    token_lp = logprobs.gather(-1, tokens[:, None])
    parts = [tokens[:, None].double(), token_lp.double()]
    if batch.max_logprobs > 0:
        top_lp, top_ids = torch.topk(logprobs, k=min(batch.max_logprobs, logprobs.shape[-1]),
                                     dim=-1)
        pair = torch.stack([top_ids.double(), top_lp.double()], dim=-1).reshape(len(tokens), -1)
        parts.append(pair)
    return SampleResult(tokens, torch.cat(parts, dim=-1))
