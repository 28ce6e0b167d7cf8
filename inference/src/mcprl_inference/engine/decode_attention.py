"""Split-K decode attention over the slot cache (Triton): one query token per sequence.

Why not SDPA: a decode step's attention reads the KV of every running sequence once, so it is
bound by memory bandwidth, and SDPA's kernels are built for long query blocks. Handed a
decode step (the query heads of a KV group folded into the query axis), cuDNN's flash kernel
runs one block per (sequence, KV head) and read the cache at about half an H100's bandwidth
(docs/benchmarks.md); it also needs a window of a fixed length, so the model runner rounds
the window up (a 256-token bucket) and keys each captured CUDA graph by that length. On an
H100 this kernel made a decode step at the Qwen2.5-3B shape 9%, 3% and 11% shorter at batch
16, 64 and 256 (one configuration, not tuned).

This kernel (the flash-decoding scheme) splits each sequence's keys into chunks that run in
parallel, each with an online softmax over all the query heads of its KV group (so the cache
is read once per KV head, as grouped-query attention allows), then merges the chunks by
their log-sum-exp. Each sequence stops at its own length, read from a tensor: the window is
the whole slot, the graph does not depend on it, and no mask is built or read.

As one kernel (``fuse`` kind ``attn``), the chunk programs also write the step's new key and
value (the program whose chunk holds the row's last position, before it reads) and merge
their own chunks (the last program of each sequence and KV head, counted on a semaphore), in
place of a KV-write kernel before and a merge kernel after: on an H100 a layer's attention
at batch 64 took 19.15 us against 21.81 for the three launches (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

try:  # CUDA wheels of torch bring Triton; a CPU install may not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is absent
    triton = None

MAX_SPLITS = 64
KERNELS = ("sdpa", "matmul", "triton")


@dataclass(frozen=True)
class KernelConfig:
    """How the kernel is launched (bench/bench_decode_attention.py sweeps these)."""

    block_n: int = 64
    """Keys a program loads per iteration."""
    num_warps: int = 4
    num_stages: int = 2
    programs_per_sm: int = 4
    """Chunks are sized so a step launches about this many programs per SM."""


# The one configuration measured in the engine so far (H100, docs/benchmarks.md): not tuned.
DEFAULT_CONFIG = KernelConfig()
BLOCK_N = DEFAULT_CONFIG.block_n
# A float32 model's tiles are twice as wide in registers: at head size 128 the default
# spilled 360 B a thread to the stack on sm_90 (ptxas, tests/inference/test_triton_compile.py);
# half the keys per iteration over twice the warps keeps it in 54 registers.
FLOAT32_CONFIG = KernelConfig(block_n=32, num_warps=8)


def config_for(dtype: torch.dtype) -> KernelConfig:
    """The launch configuration for a model of ``dtype``."""

    return FLOAT32_CONFIG if dtype == torch.float32 else DEFAULT_CONFIG


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: CUDA with Triton, or any device under
    Triton's interpreter (``TRITON_INTERPRET=1``, how the CPU tests run it)."""

    return triton is not None and (device.type == "cuda"
                                   or bool(triton.knobs.runtime.interpret))


def resolve(name: str, device: torch.device) -> str:
    """The decode attention setting -> the kernel that runs.

    ``auto`` is ``triton`` on CUDA: on an H100 (docs/benchmarks.md, 2026-12-06) it made a
    Qwen2.5-3B-shaped decode step 9%, 3% and 11% shorter than SDPA at batch 16, 64 and 256
    and passed the CUDA tests (graphs, bfloat16 against attention). Elsewhere ``sdpa``."""

    if name not in ("auto", *KERNELS):
        raise ValueError(f"decode attention must be auto or one of {', '.join(KERNELS)}, "
                         f"got {name!r}")
    if name == "triton" and not available(device):
        raise ValueError("decode attention 'triton' needs a CUDA device and the triton "
                         "package (on a CPU: TRITON_INTERPRET=1, for tests)")
    if name == "auto":
        return "triton" if triton is not None and device.type == "cuda" else "sdpa"
    return name


def num_splits(rows: int, kv_heads: int, window: int, programs: int,
               block_n: int = BLOCK_N) -> int:
    """Chunks per sequence: enough programs to fill the GPU (``programs``, a few per SM),
    none shorter than a block, at most ``MAX_SPLITS``. Fixed for a graph's shapes."""

    blocks = -(-window // block_n)
    want = -(-programs // max(rows * kv_heads, 1))
    return max(1, min(want, blocks, MAX_SPLITS))


@functools.cache
def _sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


if triton is not None:

    @triton.jit
    def _rotate(lo, hi, cos_ptr, sin_ptr, HALF: tl.constexpr):
        """HF's rotary on a vector's halves (``x * cos + rotate_half(x) * sin``, cos and sin
        the two halves of one row of the model's tables), in float32."""

        i = tl.arange(0, HALF)
        c_lo = tl.load(cos_ptr + i).to(tl.float32)
        c_hi = tl.load(cos_ptr + HALF + i).to(tl.float32)
        s_lo = tl.load(sin_ptr + i).to(tl.float32)
        s_hi = tl.load(sin_ptr + HALF + i).to(tl.float32)
        lo, hi = lo.to(tl.float32), hi.to(tl.float32)
        return lo * c_lo - hi * s_lo, hi * c_hi + lo * s_hi

    @triton.jit
    def _merge_chunks(o_ptr, lse_ptr, splits, so_s, so_g, sl_s,
                      G_PAD: tl.constexpr, D_PAD: tl.constexpr, S_PAD: tl.constexpr,
                      g_ok, d_ok):
        """One (sequence, KV head)'s chunks merged by their share of the softmax: ``[G, D]``
        (``o_ptr``/``lse_ptr`` at that row and head). Loaded past L1 (``.cg``): in the
        kernel's own merge the chunks were written by other SMs."""

        s = tl.arange(0, S_PAD)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D_PAD)
        lse = tl.load(lse_ptr + s[:, None] * sl_s + g[None, :],
                      mask=(s < splits)[:, None] & g_ok[None, :], other=float("-inf"),
                      cache_modifier=".cg")
        top = tl.max(lse, 0)
        top = tl.where(top == float("-inf"), 0.0, top)  # padded heads: nothing to weigh
        total = tl.sum(tl.exp(lse - top[None, :]), 0)
        acc = tl.zeros((G_PAD, D_PAD), tl.float32)
        for i in range(0, splits):
            weight = tl.exp(tl.load(lse_ptr + i * sl_s + g, mask=g_ok, other=float("-inf"),
                                    cache_modifier=".cg") - top)
            part = tl.load(o_ptr + i * so_s + g[:, None] * so_g + d[None, :],
                           mask=g_ok[:, None] & d_ok[None, :], other=0.0,
                           cache_modifier=".cg")
            acc += part * weight[:, None]
        return acc / tl.where(total > 0.0, total, 1.0)[:, None]

    @triton.jit
    def _attention_chunk_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, lse_ptr,
                                cos_ptr, sin_ptr, sc_b, ss_b,
                                sq_b, sq_h, sq_g, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
                                so_b, so_h, so_s, so_g, sl_b, sl_h, sl_s,
                                kn_ptr, vn_ptr, skn_b, skn_h, svn_b, svn_h,
                                sem_ptr, out_ptr, sout_b, sout_h,
                                scale, chunk, window,
                                GROUPS: tl.constexpr, G_PAD: tl.constexpr,
                                DIM: tl.constexpr, D_PAD: tl.constexpr,
                                BLOCK: tl.constexpr, IEEE: tl.constexpr,
                                ROPE: tl.constexpr, NEW_KV: tl.constexpr,
                                MERGE: tl.constexpr, S_PAD: tl.constexpr):
        """Attention of one (sequence, KV head) over one chunk of its keys: the normalised
        partial output and its log-sum-exp (-inf for a chunk past the sequence's end).
        ``IEEE``: float32 inputs multiply in float32, not TF32 (as torch's default).
        ``ROPE``: the query (and with ``NEW_KV`` the new key) comes unrotated and is rotated
        here (``DIM == D_PAD``).
        ``NEW_KV``: the step's new key and value (``kn_ptr``/``vn_ptr``) are not in the cache
        yet: the program whose chunk holds the row's last position writes them there, then
        reads them back with the rest (no KV-write kernel before this one).
        ``MERGE``: the program that finishes last for its (sequence, KV head), counted on
        ``sem_ptr`` (zero before, zero again after), merges the chunks into ``out_ptr``; with
        one chunk the program writes ``out_ptr`` directly (no merge kernel after this one)."""

        # 64-bit offsets: a row's start in a large cache passes 2**31 elements
        b, h, s = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
        splits = tl.num_programs(2)
        length = tl.minimum(tl.load(len_ptr + b), window)  # never read past the window
        start = s * chunk
        end = tl.minimum(start + chunk, length)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D_PAD)
        n = tl.arange(0, BLOCK)
        g_ok, d_ok = g < GROUPS, d < DIM
        q_base = q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g
        if ROPE:
            i = tl.arange(0, DIM // 2)
            lo = tl.load(q_base + i[None, :], mask=g_ok[:, None], other=0.0)
            hi = tl.load(q_base + DIM // 2 + i[None, :], mask=g_ok[:, None], other=0.0)
            lo, hi = _rotate(lo, hi, cos_ptr + b * sc_b, sin_ptr + b * ss_b, DIM // 2)
            # [G, D/2] x 2 -> [G, D], the halves side by side; rounded as HF's rotary output
            q = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (G_PAD, D_PAD))
            q = q.to(q_ptr.dtype.element_ty)
        else:
            q = tl.load(q_base + d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        k_base = k_ptr + b * sk_b + h * sk_h
        v_base = v_ptr + b * sv_b + h * sv_h
        if NEW_KV:
            pos = length - 1
            if (pos >= start) & (pos < end):
                _write_row(kn_ptr + b * skn_b + h * skn_h, vn_ptr + b * svn_b + h * svn_h,
                           k_base + pos * sk_n, v_base + pos * sv_n,
                           cos_ptr + b * sc_b, sin_ptr + b * ss_b, DIM, D_PAD, ROPE)
                tl.debug_barrier()  # the writes are the CTA's to read below
        m = tl.full((G_PAD,), float("-inf"), tl.float32)
        total = tl.zeros((G_PAD,), tl.float32)
        acc = tl.zeros((G_PAD, D_PAD), tl.float32)
        for first in range(start, end, BLOCK):
            keys = first + n
            ok = keys < end
            k = tl.load(k_base + keys[:, None] * sk_n + d[None, :],
                        mask=ok[:, None] & d_ok[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(k)) * scale
            scores = tl.where(ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(scores - m_new[:, None])
            total = total * alpha + tl.sum(p, 1)
            v = tl.load(v_base + keys[:, None] * sv_n + d[None, :],
                        mask=ok[:, None] & d_ok[None, :], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        has = total > 0.0
        out = acc / tl.where(has, total, 1.0)[:, None]
        out_rows = out_ptr + b * sout_b + (h * GROUPS + g[:, None]) * sout_h + d[None, :]
        gd_ok = g_ok[:, None] & d_ok[None, :]
        if MERGE and S_PAD == 1:  # one chunk: its output is the attention's
            tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=gd_ok)
        else:
            lse = tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf"))
            o_row = o_ptr + b * so_b + h * so_h
            l_row = lse_ptr + b * sl_b + h * sl_h
            tl.store(o_row + s * so_s + g[:, None] * so_g + d[None, :], out, mask=gd_ok)
            tl.store(l_row + s * sl_s + g, lse, mask=g_ok)
            if MERGE:
                # every thread's stores before one thread's release; the last to count merges
                tl.debug_barrier()
                sem = sem_ptr + b * tl.num_programs(1) + h
                if tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu") == splits - 1:
                    tl.atomic_xchg(sem, 0, sem="relaxed", scope="gpu")  # ready for the next
                    merged = _merge_chunks(o_row, l_row, splits, so_s, so_g, sl_s,
                                           G_PAD, D_PAD, S_PAD, g_ok, d_ok)
                    tl.store(out_rows, merged.to(out_ptr.dtype.element_ty), mask=gd_ok)

    @triton.jit
    def _attention_merge_kernel(o_ptr, lse_ptr, out_ptr,
                                so_b, so_h, so_s, so_g, sl_b, sl_h, sl_s, sout_b, sout_h,
                                SPLITS: tl.constexpr, S_PAD: tl.constexpr,
                                GROUPS: tl.constexpr, G_PAD: tl.constexpr, DIM: tl.constexpr,
                                D_PAD: tl.constexpr):
        """One (sequence, KV head)'s output: its chunks weighted by their share of the
        softmax."""

        b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D_PAD)
        g_ok, d_ok = g < GROUPS, d < DIM
        out = _merge_chunks(o_ptr + b * so_b + h * so_h, lse_ptr + b * sl_b + h * sl_h,
                            SPLITS, so_s, so_g, sl_s, G_PAD, D_PAD, S_PAD, g_ok, d_ok)
        tl.store(out_ptr + b * sout_b + (h * GROUPS + g[:, None]) * sout_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])

    @triton.jit
    def _write_row(k_row, v_row, k_dst, v_dst, cos_row, sin_row, DIM: tl.constexpr,
                   D_PAD: tl.constexpr, ROPE: tl.constexpr):
        """One new key and value (one KV head of one row) to their cache position; with
        ``ROPE`` the key comes unrotated and is rotated on its way in."""

        d = tl.arange(0, D_PAD)
        ok = d < DIM
        if ROPE:
            i = tl.arange(0, DIM // 2)
            lo, hi = _rotate(tl.load(k_row + i), tl.load(k_row + DIM // 2 + i),
                             cos_row, sin_row, DIM // 2)
            tl.store(k_dst + i, lo.to(k_dst.dtype.element_ty))
            tl.store(k_dst + DIM // 2 + i, hi.to(k_dst.dtype.element_ty))
        else:
            k = tl.load(k_row + d, mask=ok)
            tl.store(k_dst + d, k.to(k_dst.dtype.element_ty), mask=ok)
        v = tl.load(v_row + d, mask=ok)
        tl.store(v_dst + d, v.to(v_dst.dtype.element_ty), mask=ok)

    @triton.jit
    def _kv_write_kernel(k_ptr, v_ptr, pos_ptr, cache_ptr, cos_ptr, sin_ptr, scos_b, ssin_b,
                         sk_b, sk_h, sv_b, sv_h, sc_kv, sc_b, sc_h, sc_n,
                         DIM: tl.constexpr, D_PAD: tl.constexpr, ROPE: tl.constexpr):
        """Row ``b``'s new key and value of KV head ``h`` into slot ``b`` at its position;
        with ``ROPE`` the key comes unrotated and is rotated on its way in."""

        b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
        pos = tl.load(pos_ptr + b).to(tl.int64)
        base = cache_ptr + b * sc_b + h * sc_h + pos * sc_n
        _write_row(k_ptr + b * sk_b + h * sk_h, v_ptr + b * sv_b + h * sv_h, base, base + sc_kv,
                   cos_ptr + b * scos_b, sin_ptr + b * ssin_b, DIM, D_PAD, ROPE)


def rope_fits(dim: int) -> bool:
    """Whether the kernels can rotate heads of size ``dim`` (``fuse`` kind ``rope``): each
    half is one power-of-2 range, and a head fills a ``tl.dot`` operand."""

    return dim >= 16 and dim & (dim - 1) == 0


def _rope_tables(rope: tuple[torch.Tensor, torch.Tensor] | None, rows: int, dim: int,
                 like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """``rope``'s (cos, sin), each ``[rows or 1, 1, dim]`` as the model's rotary embedding
    hands them to ``apply_rotary_pos_emb`` (one decode token a row), and their row strides
    (0: one table for every row); placeholders without ``rope``."""

    if rope is None:
        return like, like, 0, 0
    if not rope_fits(dim):
        raise ValueError(f"the fused rotary needs a head size that is a power of 2 of at "
                         f"least 16, got {dim}")
    tables = []
    for table in rope:
        if table.shape[-1] != dim or table.stride(-1) != 1 or table.shape[0] not in (1, rows):
            raise ValueError(f"a rotary table of shape {tuple(table.shape)} does not fit "
                             f"{rows} rows of head size {dim}")
        table = table.reshape(table.shape[0], dim)  # [B, 1, D] -> [B, D]: a view
        tables.append((table, table.stride(0) if table.shape[0] == rows > 1 else 0))
    (cos, cos_b), (sin, sin_b) = tables
    return cos, sin, cos_b, sin_b


def write_decode_kv(layer_kv: torch.Tensor, positions: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """A decode step's new keys and values into one layer's slot cache, in one launch.

    ``layer_kv [2, slots, Hkv, L, D]``; ``key``/``value [B, Hkv, 1, D]`` (any strides but a
    contiguous last axis); row ``b`` goes to slot ``b`` at ``positions[b]``. Two
    ``index_put`` kernels did this before, about 4 us each a layer on an H100
    (docs/benchmarks.md). ``rope``: the model's (cos, sin) for these rows, for a key that
    is still unrotated (``fuse`` kind ``rope``)."""

    if triton is None:
        raise RuntimeError("write_decode_kv needs the triton package")
    rows, kv_heads, _, dim = key.shape
    if key.stride(-1) != 1 or value.stride(-1) != 1 or layer_kv.stride(-1) != 1:
        raise ValueError("write_decode_kv needs a contiguous last (head_dim) axis")
    cos, sin, cos_b, sin_b = _rope_tables(rope, rows, dim, key)
    _kv_write_kernel[(rows, kv_heads)](
        key, value, positions, layer_kv, cos, sin, cos_b, sin_b, key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), *layer_kv.stride()[:4], DIM=dim,
        D_PAD=max(16, triton.next_power_of_2(dim)), ROPE=rope is not None, num_warps=1)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     lengths: torch.Tensor, scale: float, *, splits: int | None = None,
                     config: KernelConfig | None = None,
                     rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                     new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                     one_kernel: bool = False,
                     semaphores: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``query [B, Hkv, G, D]`` (one token, the G query heads of each KV head)
    over the first ``lengths[b]`` positions of ``key``/``value [B, Hkv, L, D]`` (at most
    ``L``: a length past the window reads the whole window, never memory beyond it).

    Returns ``[B, 1, Hkv * G, D]`` (the layout the model's output projection reads, so no
    transpose copy follows). ``config`` defaults to :func:`config_for` the query's dtype,
    ``splits`` to :func:`num_splits` for this device and ``config``. ``rope``: the model's
    (cos, sin) for these rows, for a query that is still unrotated (each program rotates
    the few query heads it loads, ``fuse`` kind ``rope``).

    ``new_kv``: this step's keys and values (``[B, Hkv, 1, D]``, unrotated with ``rope``),
    not yet in ``key``/``value``: they go in at position ``lengths[b] - 1`` inside the
    kernel, in place of :func:`write_decode_kv` before it. ``one_kernel``: the last program
    of each (sequence, KV head) merges the chunks, in place of a merge kernel after it;
    ``semaphores`` (int32, zeros, at least ``B * Hkv``; left zero) count the programs done,
    allocated when not given (a caller replaying a CUDA graph passes its own). Together
    (``fuse`` kind ``attn``) a layer's decode attention is one launch instead of three.
    """

    if triton is None:
        raise RuntimeError("decode attention 'triton' needs the triton package")
    rows, kv_heads, groups, dim = query.shape
    window = key.shape[2]
    if key.stride(-1) != 1 or value.stride(-1) != 1 or query.stride(-1) != 1:
        raise ValueError("decode_attention needs a contiguous last (head_dim) axis")
    new_key, new_value = new_kv if new_kv is not None else (query, query)
    if new_key.stride(-1) != 1 or new_value.stride(-1) != 1:
        raise ValueError("decode_attention needs new keys and values with a contiguous last "
                         "(head_dim) axis")
    config = config or config_for(query.dtype)
    block = config.block_n
    if splits is None:
        sms = _sms(query.device.index or 0) if query.is_cuda else 32
        splits = num_splits(rows, kv_heads, window, config.programs_per_sm * sms, block)
    per_split = -(-window // splits)
    chunk = -(-per_split // block) * block  # whole blocks per chunk
    partial = torch.empty(rows, kv_heads, splits, groups, dim, dtype=torch.float32,
                          device=query.device)
    lse = torch.empty(rows, kv_heads, splits, groups, dtype=torch.float32, device=query.device)
    out = torch.empty(rows, 1, kv_heads * groups, dim, dtype=query.dtype, device=query.device)
    if one_kernel and semaphores is None:
        semaphores = torch.zeros(rows * kv_heads, dtype=torch.int32, device=query.device)
    if semaphores is not None and (semaphores.numel() < rows * kv_heads
                                   or semaphores.dtype != torch.int32):
        raise ValueError(f"semaphores must be int32 with at least {rows * kv_heads} entries")
    g_pad = max(16, triton.next_power_of_2(groups))
    d_pad = max(16, triton.next_power_of_2(dim))
    cos, sin, cos_b, sin_b = _rope_tables(rope, rows, dim, query)
    _attention_chunk_kernel[(rows, kv_heads, splits)](
        query, key, value, lengths, partial, lse, cos, sin, cos_b, sin_b,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3],
        *partial.stride()[:4], *lse.stride()[:3],
        new_key, new_value, new_key.stride(0), new_key.stride(1), new_value.stride(0),
        new_value.stride(1), semaphores if one_kernel else lengths, out, out.stride(0),
        out.stride(2), scale, chunk, window,
        GROUPS=groups, G_PAD=g_pad, DIM=dim, D_PAD=d_pad, BLOCK=block,
        IEEE=query.dtype == torch.float32, ROPE=rope is not None, NEW_KV=new_kv is not None,
        MERGE=one_kernel, S_PAD=triton.next_power_of_2(splits) if one_kernel else 1,
        num_warps=config.num_warps, num_stages=config.num_stages)
    if not one_kernel:
        _attention_merge_kernel[(rows, kv_heads)](
            partial, lse, out, *partial.stride()[:4], *lse.stride()[:3], out.stride(0),
            out.stride(2), SPLITS=splits, S_PAD=max(2, triton.next_power_of_2(splits)),
            GROUPS=groups, G_PAD=g_pad, DIM=dim, D_PAD=d_pad, num_warps=4)
    return out
