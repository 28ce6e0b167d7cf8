"""The sampler's common case in two Triton kernels that read each row's logits about once.

Without penalties, grammar masks or top-p/top-k/min-p, and with at most the top-1 log-prob
asked for (the trainer asks for it), :func:`~.sampling.sample` is a log-softmax, an argmax,
an exp, a float64 cumulative sum, a search and a gather: about a dozen kernels after every
decode step, which read and write the ``[B, V]`` float32 logits (and a float64 copy) several
times over. Here:

1. ``_chunk_kernel``, one program per (row, chunk of the vocabulary): the chunk's max, the
   first index of it, ``sum(exp(x - max))`` and, off temperature 1, ``sum(exp((x - max) / T))``.
   Splitting rows into chunks keeps every SM reading at a decode step's batch (a program a
   row left most of an H100 idle at batch 64: 171 us for one 13 us read of the logits).
2. ``_draw_kernel``, one program a row: it merges the chunks' numbers into the row's max,
   argmax and log-sum-exp, finds the chunk where ``u * total`` falls from the chunks' masses,
   and walks that chunk alone with a float64 running sum to the first token that passes it.

The draw is the same inverse-CDF draw on the same counter-based uniform ``u`` (so a seeded
request keeps its tokens in any batch); the terms are ``exp(log_softmax)`` at temperature 1
(as the torch path), ``exp(x / T - max / T)`` otherwise (the torch path's softmax before its
division by the sum, which the draw's ``u * total`` makes irrelevant). Sums run in another
order than torch's, and the chunks' masses are float32 sums, so a token can differ only where
``u * total`` falls within rounding of a boundary between two tokens.
"""

from __future__ import annotations

import torch

try:  # CUDA wheels of torch bring Triton; a CPU install may not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is absent
    triton = None

BLOCK = 1024  # elements a program loads at once (8 float32 a thread at 4 warps)
MAX_CHUNKS = 64  # the draw kernel holds every chunk's numbers of its row in one block
CHUNKS = 32  # per row by default: 64 rows give 1,920 programs over Qwen2.5's vocabulary


def available(device: torch.device) -> bool:
    """CUDA with Triton, or any device under Triton's interpreter (the CPU tests)."""

    return triton is not None and (device.type == "cuda"
                                   or bool(triton.knobs.runtime.interpret))


if triton is not None:

    @triton.jit
    def _exp_shifted(x, top, scale):
        """exp((x - top) * scale), 0 where x and top are both -inf (an all -inf block)."""

        return tl.exp(tl.where(top == float("-inf"), float("-inf"), (x - top) * scale))

    @triton.jit
    def _term(x, top, log_total, t, UNIT_T: tl.constexpr):
        """A token's term of the sampling distribution, float64 (see the module's doc)."""

        if UNIT_T:  # exp(log_softmax), computed as torch's log_softmax computes it
            return tl.exp((x - top) - log_total).to(tl.float64)
        return tl.exp(x / t - top / t).to(tl.float64)

    @triton.jit
    def _chunk_kernel(logits_ptr, stride, vocab, chunk, temp_ptr, stats_ptr, first_ptr,
                      BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr, UNIT_T: tl.constexpr):
        r, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
        row = logits_ptr + r * stride
        lane = tl.arange(0, BLOCK)
        t = tl.load(temp_ptr + r)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)  # lane-wise, online
        first = tl.zeros((BLOCK,), tl.int32)
        total = tl.zeros((BLOCK,), tl.float32)  # sum of exp(x - best)
        tempered = tl.zeros((BLOCK,), tl.float32)  # sum of exp((x - best) / t)
        end = tl.minimum(c * chunk + chunk, vocab)
        for start in range(c * chunk, end, BLOCK):
            i = start + lane
            x = tl.load(row + i, mask=i < end, other=float("-inf"))
            new = tl.maximum(best, x)
            total = total * _exp_shifted(best, new, 1.0) + _exp_shifted(x, new, 1.0)
            if not UNIT_T:
                tempered = (tempered * _exp_shifted(best, new, 1.0 / t)
                            + _exp_shifted(x, new, 1.0 / t))
            first = tl.where(x > best, i, first)
            best = new
        top = tl.max(best, 0)
        stats = stats_ptr + (r * MAX_CHUNKS + c) * 3
        tl.store(stats, top)
        tl.store(stats + 1, tl.sum(total * _exp_shifted(best, top, 1.0), 0))
        if not UNIT_T:
            tl.store(stats + 2, tl.sum(tempered * _exp_shifted(best, top, 1.0 / t), 0))
        tl.store(first_ptr + r * MAX_CHUNKS + c, tl.min(tl.where(best == top, first, vocab), 0))

    @triton.jit
    def _draw_kernel(logits_ptr, stride, vocab, chunk, chunks, temp_ptr, greedy_ptr, u_ptr,
                     stats_ptr, first_ptr, tokens_ptr, rows_ptr, s_rows, BLOCK: tl.constexpr,
                     MAX_CHUNKS: tl.constexpr, UNIT_T: tl.constexpr, TOP1: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        row = logits_ptr + r * stride
        # the row's max, argmax and log-sum-exp from its chunks'
        c = tl.arange(0, MAX_CHUNKS)
        have = c < chunks
        stats = stats_ptr + (r * MAX_CHUNKS + c) * 3
        peak = tl.load(stats, mask=have, other=float("-inf"))
        top = tl.max(peak, 0)
        argmax = tl.min(tl.where(have & (peak == top),
                                 tl.load(first_ptr + r * MAX_CHUNKS + c, mask=have, other=vocab),
                                 vocab), 0)
        total = tl.load(stats + 1, mask=have, other=0.0)
        log_total = tl.log(tl.sum(total * _exp_shifted(peak, top, 1.0), 0))
        token = argmax.to(tl.int64)
        if tl.load(greedy_ptr + r) == 0:
            t = tl.load(temp_ptr + r)
            # each chunk's mass of the distribution, float64; the chunk where u * total falls
            if UNIT_T:
                mass = (total * _exp_shifted(peak, top, 1.0)).to(tl.float64) / tl.exp(
                    log_total.to(tl.float64))
            else:
                mass = (tl.load(stats + 2, mask=have, other=0.0)
                        * _exp_shifted(peak, top, 1.0 / t)).to(tl.float64)
            target = tl.load(u_ptr + r) * tl.sum(mass, 0)
            upto = tl.cumsum(mass, 0)
            pick = tl.minimum(tl.min(tl.where(have & (upto > target), c, chunks), 0), chunks - 1)
            carry = tl.sum(tl.where(c < pick, mass, 0.0), 0)
            # its first index whose running sum passes the target (searchsorted, right)
            end = tl.minimum(pick * chunk + chunk, vocab)
            found = end
            start = pick * chunk
            lane = tl.arange(0, BLOCK)
            while (start < end) & (found == end):
                i = start + lane
                term = _term(tl.load(row + i, mask=i < end, other=float("-inf")), top,
                             log_total, t, UNIT_T)
                running = tl.cumsum(term, 0) + carry
                found = tl.min(tl.where((running > target) & (i < end), i, end), 0)
                carry += tl.sum(term, 0)
                start += BLOCK
            token = tl.minimum(found, end - 1).to(tl.int64)  # rounding past the chunk's end
        chosen = tl.load(row + token)
        tl.store(tokens_ptr + r, token)
        out = rows_ptr + r * s_rows
        tl.store(out, token.to(tl.float64))
        tl.store(out + 1, ((chosen - top) - log_total).to(tl.float64))
        if TOP1:
            tl.store(out + 2, argmax.to(tl.float64))
            tl.store(out + 3, (0.0 - log_total).to(tl.float64))


def chunk_size(vocab: int, chunks: int) -> int:
    """Elements of a row each chunk program reads: a whole number of blocks, at most
    ``MAX_CHUNKS`` chunks a row."""

    if not 1 <= chunks <= MAX_CHUNKS:
        raise ValueError(f"chunks must be in [1, {MAX_CHUNKS}], got {chunks}")
    per = -(-vocab // chunks)
    return max(BLOCK, -(-per // BLOCK) * BLOCK)


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
                uniform: torch.Tensor, *, unit_temperature: bool, top1: bool,
                chunks: int = CHUNKS) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ``[B]`` (int64) and rows ``[B, 2 or 4]`` (float64: token, its raw log-prob, and
    with ``top1`` the top token and its log-prob) for float32 ``logits [B, V]``.

    ``temperature`` (float32, ``[B]``; > 0), ``greedy`` (bool, ``[B]``: argmax rows) and
    ``uniform`` (float64 in (0, 1), ``[B]``) as :func:`~.sampling.sample` has them;
    ``unit_temperature``: every row's temperature is 1 (its terms are ``exp(log_softmax)``).
    ``chunks``: programs a row for the first pass (1: a program a row reads the whole row).
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
        size = chunk_size(vocab, chunks)
        used = -(-vocab // size)
        stats = torch.empty(rows, MAX_CHUNKS, 3, dtype=torch.float32, device=logits.device)
        first = torch.empty(rows, MAX_CHUNKS, dtype=torch.int32, device=logits.device)
        _chunk_kernel[(rows, used)](
            logits, logits.stride(0), vocab, size, temperature, stats, first, BLOCK=BLOCK,
            MAX_CHUNKS=MAX_CHUNKS, UNIT_T=unit_temperature, num_warps=4)
        _draw_kernel[(rows,)](
            logits, logits.stride(0), vocab, size, used, temperature, greedy, uniform, stats,
            first, tokens, out, out.stride(0), BLOCK=BLOCK, MAX_CHUNKS=MAX_CHUNKS,
            UNIT_T=unit_temperature, TOP1=top1, num_warps=4)
    return tokens, out
