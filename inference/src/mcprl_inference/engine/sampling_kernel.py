"""The sampler's common case in one Triton kernel: one program a row, three reads of its logits.

Without penalties, grammar masks or top-p/top-k/min-p, and with at most the top-1 log-prob
asked for (the trainer asks for it), :func:`~.sampling.sample` is a log-softmax, an argmax,
an exp, a float64 cumulative sum, a search and a gather: about a dozen kernels after every
decode step, which read and write the ``[B, V]`` float32 logits (and a float64 copy) several
times over. Here each row's program reads its logits three times and writes a few numbers:

1. the max, the first index of the max (greedy, top-1) and the sum of ``exp(x - max)``;
2. the float64 total of the sampling distribution's terms;
3. the first index whose float64 running sum passes ``u * total``, stopping there.

The draw is the same inverse-CDF draw on the same counter-based uniform ``u`` (so a seeded
request keeps its tokens in any batch); the terms are ``exp(log_softmax)`` at temperature 1
(as the torch path), ``exp(x / T - max / T)`` otherwise (the torch path's softmax before its
division by the sum, which the draw's ``u * total`` makes irrelevant). Sums run in another
order than torch's, so a token can differ only where ``u * total`` falls within rounding of
a boundary between two tokens.
"""

from __future__ import annotations

import torch

try:  # CUDA wheels of torch bring Triton; a CPU install may not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is absent
    triton = None

BLOCK = 4096  # 16 float32 a thread at 8 warps: more loads in flight per row (not tuned)


def available(device: torch.device) -> bool:
    """CUDA with Triton, or any device under Triton's interpreter (the CPU tests)."""

    return triton is not None and (device.type == "cuda"
                                   or bool(triton.knobs.runtime.interpret))


if triton is not None:

    @triton.jit
    def _term(x, top, log_total, t, UNIT_T: tl.constexpr):
        """A token's term of the sampling distribution, float64 (see the module's doc)."""

        if UNIT_T:  # exp(log_softmax), computed as torch's log_softmax computes it
            return tl.exp((x - top) - log_total).to(tl.float64)
        return tl.exp(x / t - top / t).to(tl.float64)

    @triton.jit
    def _sample_kernel(logits_ptr, stride, vocab, temp_ptr, greedy_ptr, u_ptr, tokens_ptr,
                       rows_ptr, s_rows, BLOCK: tl.constexpr, UNIT_T: tl.constexpr,
                       TOP1: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row = logits_ptr + r * stride
        lane = tl.arange(0, BLOCK)
        # 1. lane-wise running max (first index of it) and sum of exp(x - max)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        first = tl.zeros((BLOCK,), tl.int32)
        total = tl.zeros((BLOCK,), tl.float32)
        for start in range(0, vocab, BLOCK):
            i = start + lane
            x = tl.load(row + i, mask=i < vocab, other=float("-inf"))
            new = tl.maximum(best, x)
            total = total * tl.exp(tl.where(best == new, 0.0, best - new)) + tl.exp(
                tl.where(new == float("-inf"), float("-inf"), x - new))
            first = tl.where(x > best, i, first)
            best = new
        top = tl.max(best, 0)
        argmax = tl.min(tl.where(best == top, first, vocab), 0)
        log_total = tl.log(tl.sum(total * tl.exp(best - top), 0))
        token = argmax.to(tl.int64)
        if tl.load(greedy_ptr + r) == 0:
            t = tl.load(temp_ptr + r)
            # 2. the float64 total of the distribution's terms
            mass = tl.zeros((BLOCK,), tl.float64)
            for start in range(0, vocab, BLOCK):
                i = start + lane
                x = tl.load(row + i, mask=i < vocab, other=float("-inf"))
                mass += _term(x, top, log_total, t, UNIT_T)
            target = tl.load(u_ptr + r) * tl.sum(mass, 0)
            # 3. the first index whose running sum passes the target (searchsorted, right)
            found = vocab
            carry = tl.zeros((), tl.float64)
            start = vocab * 0
            while (start < vocab) & (found == vocab):
                i = start + lane
                term = _term(tl.load(row + i, mask=i < vocab, other=float("-inf")), top,
                             log_total, t, UNIT_T)
                running = tl.cumsum(term, 0) + carry
                found = tl.min(tl.where((running > target) & (i < vocab), i, vocab), 0)
                carry += tl.sum(term, 0)
                start += BLOCK
            token = tl.minimum(found, vocab - 1).to(tl.int64)
        chosen = tl.load(row + token)
        tl.store(tokens_ptr + r, token)
        out = rows_ptr + r * s_rows
        tl.store(out, token.to(tl.float64))
        tl.store(out + 1, ((chosen - top) - log_total).to(tl.float64))
        if TOP1:
            tl.store(out + 2, argmax.to(tl.float64))
            tl.store(out + 3, (0.0 - log_total).to(tl.float64))


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                uniform: torch.Tensor, *, unit_temperature: bool, top1: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[B]`` (int64) and rows ``[B, 2 or 4]`` (float64: token, its raw log-prob, and
    with ``top1`` the top token and its log-prob) for float32 ``logits [B, V]``.

    ``temperature`` (float32, ``[B]``; > 0), ``greedy`` (bool, ``[B]``: argmax rows) and
    ``uniform`` (float64 in (0, 1), ``[B]``) as :func:`~.sampling.sample` has them;
    ``unit_temperature``: every row's temperature is 1 (its terms are ``exp(log_softmax)``).
    """

    if triton is None:
        raise RuntimeError("the fused sampler needs the triton package")
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError("the fused sampler needs float32 logits [B, V] with a contiguous "
                         "last axis")
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    out = torch.empty(rows, 4 if top1 else 2, dtype=torch.float64, device=logits.device)
    if rows:
        _sample_kernel[(rows,)](
            logits, logits.stride(0), vocab, temperature, greedy, uniform,
            tokens, out, out.stride(0), BLOCK=BLOCK, UNIT_T=unit_temperature, TOP1=top1,
            num_warps=8)
    return tokens, out
