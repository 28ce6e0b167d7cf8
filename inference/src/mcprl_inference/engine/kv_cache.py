"""A static KV cache of per-sequence slots, shared by every request, and the attention over it.

Layout: one tensor ``[layers, 2 (k/v), slots, kv_heads, capacity, head_dim]``. A running
sequence owns one slot; the scheduler keeps the running sequences in slots ``0..B-1`` so a
decode step works on plain views (no gather), which is what lets a CUDA graph replay it. The
HF model runs unchanged: this object stands in for its ``Cache`` (``update`` is all the attention
layers call) and :func:`slot_attention` is registered as an attention implementation, so the
same code path serves Qwen2, Llama, Mistral or Qwen3 and keeps peft's LoRA layers working.

Plans tell ``update`` what the current forward pass is:

- prefill: rows are new sequences (right-padded prompts) written to ``slots`` at positions
  ``0..T-1``; attention runs causally over the fresh keys only (no prefix to attend to);
- decode: row ``i`` is slot ``i``, its one new token goes to ``positions[i]`` and attention
  reads the first ``attn_len`` positions of the slot under a length mask (or, with the
  split-K kernel of :mod:`.decode_attention`, the whole slot up to each row's length, and
  with ``fuse`` kind ``kv`` the new K and V written by one kernel of that module, or with
  ``attn`` by the attention kernel itself, handed over by ``update``; with ``rope`` too,
  the kernel that writes rotates the key and the attention the query);
- extend: one sequence whose first ``start`` positions already hold a cached prefix: its new
  tokens go to ``start..`` and attention reads the whole slot under a causal mask;
- extend_batch: several such sequences in one pass, right-padded: only each row's real new
  tokens are written (padding never reaches a slot) and each row reads its own slot under
  the caller's mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

from mcprl_inference.engine.decode_attention import decode_attention, write_decode_kv
from mcprl_inference.engine.fusions import pending_rope

ATTN_IMPLEMENTATION = "mcprl_slots"
_DECODE_KERNEL = {"name": "sdpa"}
# With decode_write "attention": the layer's new (key, value) and the cache's semaphores,
# from ``update`` to the split-K attention that writes them (per thread, as engines step in
# their own threads).
_PENDING_KV: ContextVar[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = ContextVar(
    "mcprl_pending_kv", default=None)


def set_decode_kernel(name: str) -> None:
    """``sdpa`` (PyTorch's fused kernels) or ``matmul`` (two batched GEMMs; robust fallback)."""

    if name not in ("sdpa", "matmul"):
        raise ValueError(f"unknown decode attention kernel {name!r}")
    _DECODE_KERNEL["name"] = name


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention interface: query ``[B, H, T, D]``, key/value ``[B, Hkv, L, D]``.

    Returns ``[B, T, H, D]``.

    Decode (one query token and a length mask: additive from the model runner's decode
    steps, boolean from an extend of one token) folds the query heads of a KV group into the
    query-length axis, so grouped-query attention needs no ``repeat_kv`` copy of the cache.
    A decode step of the split-K kernel brings each row's length instead of a mask (an
    integer ``[B, 1, 1, 1]``, which transformers hands to every layer as any 4D mask).
    """

    b, h, t, d = query.shape
    hkv = key.shape[1]
    groups = h // hkv
    split_k = (t == 1 and attention_mask is not None and not attention_mask.is_floating_point()
               and attention_mask.dtype != torch.bool)  # a mask of lengths: its decode step
    rope = pending_rope()  # the query is still unrotated (fuse kind "rope")
    if rope is not None and not split_k:
        raise RuntimeError("an unrotated query reached an attention kernel other than the "
                           "split-K decode one (fuse kind 'rope')")
    pending = _PENDING_KV.get()  # the new K/V not written yet (fuse kind "attn")
    if pending is not None:
        _PENDING_KV.set(None)
        if not split_k:
            raise RuntimeError("a decode step's new keys and values reached an attention "
                               "kernel other than the split-K one, which writes them (fuse "
                               "kind 'attn')")
    if t == 1 and attention_mask is not None:
        q = query.reshape(b, hkv, groups, d)
        if split_k:
            scale = scaling if scaling is not None else d**-0.5
            new_kv, semaphores = (pending[:2], pending[2]) if pending is not None else (
                None, None)
            return decode_attention(q, key, value, attention_mask.view(-1), scale, rope=rope,
                                    new_kv=new_kv, one_kernel=pending is not None,
                                    semaphores=semaphores), None
        if _DECODE_KERNEL["name"] == "matmul":
            scale = scaling if scaling is not None else d**-0.5
            scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale
            scores = (scores.masked_fill(~attention_mask, float("-inf"))
                      if attention_mask.dtype == torch.bool else scores + attention_mask)
            probs = torch.softmax(scores, dim=-1).to(value.dtype)
            out = torch.matmul(probs, value)
        else:
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,
                                                 scale=scaling)
        out = out.reshape(b, h, 1, d)
    else:
        out = grouped_attention(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None, scaling: float | None, *,
                      repeat_kv: bool | None = None) -> torch.Tensor:
    """SDPA of ``[B, H, T, D]`` queries over ``[B, Hkv, L, D]`` keys (prefill, extend).

    On CUDA a mask together with ``enable_gqa`` leaves SDPA only its math kernel, which
    materialises every score in float32 (transformers' SDPA integration avoids the pair for
    the same reason). With a mask the KV heads are therefore repeated to the query heads
    (``repeat_kv``, default: on CUDA), which the memory-efficient kernel takes; without one,
    ``enable_gqa`` keeps the flash kernel and no copy.
    """

    groups = query.shape[1] // key.shape[1]
    if repeat_kv is None:
        repeat_kv = query.is_cuda and mask is not None
    if groups > 1 and repeat_kv:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        groups = 1
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=mask is None and query.shape[2] > 1,
        scale=scaling, enable_gqa=groups > 1,
    )


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, slot_attention)


class SlotKVCache:
    """Per-slot static KV cache; quacks like ``transformers.Cache`` for the attention layers."""

    is_compileable = False
    is_sliding = False

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.kv: torch.Tensor | None = None
        self.rows = 0
        self.capacity = 0
        self._mode = "none"
        self._slots: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._attn_len = 0
        self._slot = self._start = 0
        self._write_rows: torch.Tensor | None = None
        self._write_cols: torch.Tensor | None = None
        self._write_slots: torch.Tensor | None = None
        self._write_pos: torch.Tensor | None = None
        self._read_slots: torch.Tensor | None = None
        self._read_range: tuple[int, int] | None = None
        self._read_len = 0
        self._row_index = torch.arange(0, device=device)
        self.semaphores = torch.zeros(0, dtype=torch.int32, device=device)
        """Zeros, one per (slot, KV head): the split-K attention's own merge counts on them."""
        self.decode_write = "index_put"
        """How a decode step's new K and V go in: two ``index_put``s, one Triton kernel
        (``kernel``, ``write_decode_kv``, ``fuse`` kind ``kv``) or inside the split-K
        attention (``attention``, ``fuse`` kind ``attn``); the model runner sets it."""

    # sizes -----------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()

    def ensure(self, rows: int, capacity: int, *, exact: bool = False) -> bool:
        """Grow to at least ``rows`` slots of ``capacity`` positions, keeping the content
        (``exact``: exactly ``capacity`` positions, dropping those beyond it).

        Returns True when the storage moved (captured CUDA graphs must then be dropped).
        """

        if self.kv is not None and rows <= self.rows and (
                capacity == self.capacity if exact else capacity <= self.capacity):
            return False
        rows = max(rows, self.rows)
        capacity = capacity if exact else max(capacity, self.capacity)
        new = torch.zeros(self.num_layers, 2, rows, self.num_kv_heads, capacity, self.head_dim,
                          dtype=self.dtype, device=self.device)
        if self.kv is not None:
            kept = min(capacity, self.capacity)
            new[:, :, : self.rows, :, :kept].copy_(self.kv[:, :, :, :, :kept])
        self.kv = None  # free before the next allocation can need the memory
        self.kv, self.rows, self.capacity = new, rows, capacity
        self._row_index = torch.arange(rows, device=self.device)
        self.semaphores = torch.zeros(rows * self.num_kv_heads, dtype=torch.int32,
                                      device=self.device)
        return True

    def release(self) -> None:
        self.kv, self.rows, self.capacity = None, 0, 0
        self._row_index = torch.arange(0, device=self.device)
        self.semaphores = torch.zeros(0, dtype=torch.int32, device=self.device)

    def move(self, dst: int, src: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions to slot ``dst`` (compaction, n > 1)."""

        assert self.kv is not None
        self.kv[:, :, dst, :, :length].copy_(self.kv[:, :, src, :, :length])

    # plans -----------------------------------------------------------------------------
    def plan_prefill(self, slots: torch.Tensor) -> None:
        self._mode, self._slots = "prefill", slots

    def plan_decode(self, positions: torch.Tensor, attn_len: int) -> None:
        self._mode, self._positions, self._attn_len = "decode", positions, attn_len

    def plan_extend(self, slot: int, start: int) -> None:
        self._mode, self._slot, self._start = "extend", slot, start

    def plan_extend_batch(self, slots: Sequence[int], starts: Sequence[int],
                          lengths: Sequence[int]) -> None:
        """Row ``i`` continues slot ``slots[i]`` at position ``starts[i]`` with ``lengths[i]``
        real tokens, then padding, which is never written (a short row's padding would run
        past what its slot reserved, even past the capacity). Attention reads
        each row's own slot, positions ``0..max(starts + lengths) - 1``: a plain view when the
        slots are consecutive, a gather (a copy) otherwise."""

        device = self.device
        rows = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)])
        cols = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])
        base = torch.tensor(list(starts), dtype=torch.long)
        self._mode = "extend_batch"
        self._write_rows, self._write_cols = rows.to(device), cols.to(device)
        self._write_slots = torch.tensor(list(slots), dtype=torch.long)[rows].to(device)
        self._write_pos = (base[rows] + cols).to(device)
        self._read_len = max(s + n for s, n in zip(starts, lengths, strict=True))
        first, count = slots[0], len(slots)
        consecutive = list(slots) == list(range(first, first + count))
        self._read_range = (first, count) if consecutive else None
        self._read_slots = None if consecutive else torch.tensor(list(slots), dtype=torch.long,
                                                                  device=device)

    # prefix reuse ---------------------------------------------------------------------
    def slot_kv(self, slot: int, length: int) -> torch.Tensor:
        """``[layers, 2, kv_heads, length, head_dim]`` view of a slot's first positions."""

        assert self.kv is not None
        return self.kv[:, :, slot, :, :length]

    def write_prefix(self, slot: int, blocks: Sequence[torch.Tensor]) -> int:
        """Copy cached KV blocks into ``slot`` from position 0; returns the positions written."""

        assert self.kv is not None
        start = 0
        for block in blocks:
            end = start + block.shape[3]
            self.kv[:, :, slot, :, start:end].copy_(block)
            start = end
        return start

    def clear_plan(self) -> None:
        self._mode, self._slots, self._positions = "none", None, None
        _PENDING_KV.set(None)  # a pass cut short leaves no K/V for the next one to write
        self._write_rows = self._write_cols = self._write_slots = self._write_pos = None
        self._read_slots, self._read_range = None, None

    # the transformers Cache surface used by attention layers ---------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.kv is not None, "KV cache not allocated"
        k_layer, v_layer = self.kv[layer_idx, 0], self.kv[layer_idx, 1]
        if self._mode == "prefill":
            t = key_states.shape[2]
            k_layer[self._slots, :, :t] = key_states
            v_layer[self._slots, :, :t] = value_states
            return key_states, value_states
        if self._mode == "decode":
            rows = key_states.shape[0]
            if self.decode_write == "attention":  # at position length - 1, by the attention
                _PENDING_KV.set((key_states, value_states, self.semaphores))
            elif self.decode_write == "kernel":
                write_decode_kv(self.kv[layer_idx], self._positions, key_states, value_states,
                                rope=pending_rope())
            elif pending_rope() is not None:
                raise RuntimeError("an unrotated key reached the cache without a fused KV "
                                   "write (fuse kind 'rope' needs 'kv' or 'attn')")
            else:
                index = self._row_index[:rows]
                k_layer[index, :, self._positions] = key_states[:, :, 0]
                v_layer[index, :, self._positions] = value_states[:, :, 0]
            n = self._attn_len
            return k_layer[:rows, :, :n], v_layer[:rows, :, :n]
        if self._mode == "extend_batch":
            return self._update_extend_batch(k_layer, v_layer, key_states, value_states)
        if self._mode == "extend":
            end = self._start + key_states.shape[2]
            k_layer[self._slot, :, self._start:end] = key_states[0]
            v_layer[self._slot, :, self._start:end] = value_states[0]
            return k_layer[self._slot:self._slot + 1, :, :end], v_layer[
                self._slot:self._slot + 1, :, :end]
        raise RuntimeError("SlotKVCache.update called outside a planned forward pass")

    def _update_extend_batch(self, k_layer: torch.Tensor, v_layer: torch.Tensor,
                             key_states: torch.Tensor, value_states: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._write_rows is not None and self._write_cols is not None
        rows, cols = self._write_rows, self._write_cols
        # [n, Hkv, t, D] -> the real tokens only, [N, Hkv, D]; written at (slot, :, position)
        k_layer[self._write_slots, :, self._write_pos] = key_states.transpose(1, 2)[rows, cols]
        v_layer[self._write_slots, :, self._write_pos] = value_states.transpose(1, 2)[rows, cols]
        n = self._read_len
        if self._read_range is not None:
            first, count = self._read_range
            return k_layer[first:first + count, :, :n], v_layer[first:first + count, :, :n]
        return k_layer[self._read_slots, :, :n], v_layer[self._read_slots, :, :n]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity

    def __len__(self) -> int:
        return self.num_layers
