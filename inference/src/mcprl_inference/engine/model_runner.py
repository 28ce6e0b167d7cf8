"""Runs the model: batched prefill into cache slots and the batched decode step.

On CUDA the decode step is captured once per (batch bucket, attention-length bucket, LoRA
graph key) in a CUDA graph and replayed (with the split-K decode attention the length is the
whole slot: one graph per batch bucket and LoRA key): one launch for the whole 36-layer
forward instead of ~1,000 Python-dispatched kernels, which is what bounds plain ``generate``
at small batch. The LoRA graph key (``LoraManager.graph_key``) says whether LoRA runs and at
which rank, not which adapter: adapters are written in place into the buffers a graph reads.
Inputs live in static buffers; the KV cache is the shared static one of :mod:`.kv_cache`.
Prefill runs eagerly (it is compute-bound, and its shapes vary). The CPU runs the same
functions eagerly.
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from mcprl_inference.engine import fusions, merged_linears, sampling_kernel
from mcprl_inference.engine.decode_attention import resolve as resolve_decode_kernel
from mcprl_inference.engine.decode_attention import rope_fits
from mcprl_inference.engine.kv_cache import (
    ATTN_IMPLEMENTATION,
    SlotKVCache,
    register_attention,
    set_decode_kernel,
)

log = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
               320, 384, 448, 512, 640, 768, 896, 1024)
LEN_STEP_CUDA = 256
LEN_STEP_CPU = 64


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


class ModelRunner:
    """Owns the model's forward passes, the KV cache and the captured decode graphs."""

    def __init__(self, model: Any, device: torch.device, dtype: torch.dtype, *,
                 cuda_graphs: bool = True, decode_attention: str = "auto",
                 fuse: str = "auto", capture_all_batch_sizes: bool = True) -> None:
        register_attention()
        # What active() turns on for this model (a kind install() found nothing for is a no-op).
        self._fused = fusions.parse(fuse, device.type)
        # The compiled rotary, SiLU product and add + norm, the merged GEMMs and the residual
        # in the down projection run in decode steps only.
        # A decode step is bound by kernel count, a prefill by compute: there the compiled
        # rotary was slower than the eager one, and a merged gate/up leaves SiLU and its
        # product to strided column slices of one wide output, for no fewer FLOPs
        # (docs/benchmarks.md); the compiled product and residual fusions are unmeasured in
        # prefills.
        self._prefill_fused = self._fused & {fusions.NORM}
        # "triton": decode steps run the split-K kernel, which reads each row's length, so
        # their window is the whole slot and a graph is not keyed by a length bucket; a
        # one-token extend still takes SDPA.
        self.decode_kernel = resolve_decode_kernel(decode_attention, device)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else (
            model.config)
        heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        # With the split-K kernel, Triton is there: a decode step's KV can go in in one launch
        # (kv) or inside the attention kernel, which then merges its own chunks (attn), and
        # (rope) that write and the split-K attention can take the rotary over.
        split_k = self.decode_kernel == "triton"

        def leave_off(kind: str, needs: str, **extra: Any) -> None:
            # asked for by name, say why it is off; under auto it just does not apply here
            (log.debug if fuse == "auto" else log.warning)(
                f"fuse kind '{kind}' left off: it needs {needs}", extra=extra)
            self._fused -= {kind}

        if fusions.ATTN in self._fused and not split_k:
            leave_off(fusions.ATTN, "the split-K decode attention",
                      decode_attention=self.decode_kernel)
        decode_write = ("attention" if fusions.ATTN in self._fused else
                        "kernel" if fusions.KV in self._fused and split_k else "index_put")
        if fusions.ROPE in self._fused and not (decode_write != "index_put"
                                                and rope_fits(self.head_dim)):
            leave_off(fusions.ROPE, "'kv' or 'attn', the split-K decode attention and a head "
                      "size that is a power of 2 of at least 16",
                      decode_attention=self.decode_kernel, head_dim=self.head_dim)
        if fusions.SAMPLE in self._fused and not sampling_kernel.available(device):
            leave_off(fusions.SAMPLE, "Triton on a CUDA device")
        self.fused_sampling = fusions.SAMPLE in self._fused
        """The engine samples with :mod:`.sampling_kernel` where a batch allows it."""
        self.fusions = fusions.install(model, norm=fusions.NORM in self._fused,
                                       rotary=fusions.ROTARY in self._fused,
                                       mlp=fusions.MLP in self._fused,
                                       residual=fusions.RESIDUAL in self._fused,
                                       rope=fusions.ROPE in self._fused)
        self.merged: list[merged_linears.MergedLinears] = []
        if fusions.PROJ in self._fused:
            self.merged = merged_linears.merge(
                model, functools.partial(fusions.is_active, fusions.PROJ))
            if self.merged:
                self.fusions.append(f"merged projections x{len(self.merged)}")
        set_decode_kernel("sdpa" if self.decode_kernel == "triton" else self.decode_kernel)
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        self.model = model
        self.device, self.dtype = device, dtype
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.num_layers = cfg.num_hidden_layers
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.max_position = int(getattr(cfg, "max_position_embeddings", 4096))
        self.cache = SlotKVCache(self.num_layers, self.num_kv_heads, self.head_dim, dtype, device)
        self.cache.decode_write = decode_write
        if decode_write == "kernel":
            self.fusions.append("kv write (triton)")
        elif decode_write == "attention":
            self.fusions.append("kv write + chunk merge in the attention (triton)")
        if self.fused_sampling:
            self.fusions.append("sampler (triton)")
        self.use_graphs = cuda_graphs and device.type == "cuda"
        # With the split-K kernel a graph's key is (rows bucket, LoRA key) only: capturing
        # every bucket at once costs ~a dozen captures, where per attention length it would
        # cost a dozen per 256 tokens of growth.
        self.capture_all = capture_all_batch_sizes and self.decode_kernel == "triton"
        self._graphs: dict[Hashable, _DecodeGraph] = {}
        self._pool: Any = None
        self._arange = torch.arange(0, device=device)
        self.graph_captures = 0
        self.prefill_forwards = 0  # eager prefill passes (the engine's stats and tests count)

    # shapes ----------------------------------------------------------------------------
    @staticmethod
    def alloc_rows(rows: int) -> int:
        """Slots to allocate for ``rows`` sequences (bucketed: few reallocations)."""

        i = bisect.bisect_left(ROW_BUCKETS, rows)
        return ROW_BUCKETS[i] if i < len(ROW_BUCKETS) else _round_up(rows, 128)

    def row_bucket(self, rows: int) -> int:
        """Rows a decode step runs: a graph bucket on CUDA, exactly ``rows`` eagerly."""

        return self.alloc_rows(rows) if self.use_graphs else rows

    def length_bucket(self, length: int) -> int:
        return _round_up(max(length, 1), LEN_STEP_CUDA if self.device.type == "cuda"
                         else LEN_STEP_CPU)

    def ensure_capacity(self, rows: int, length: int, *, max_length: int | None = None,
                        budget_tokens: int | None = None) -> None:
        """Make room for ``rows`` running sequences of up to ``length`` tokens.

        Positions grow ahead, to twice the current capacity (at most ``max_length`` and what
        ``budget_tokens`` leaves per slot): an agent's next turn is longer than its last, and
        growing one 64-token step at a time reallocated and copied the whole cache at nearly
        every turn (a fifth of a CPU rollout's time)."""

        cache = self.cache
        rows_to, length_to = self.alloc_rows(rows), self.length_bucket(length)
        rows_kept = max(rows_to, cache.rows)
        if length_to > cache.capacity > 0:
            ahead = self.length_bucket(2 * cache.capacity)
            if max_length is not None:
                ahead = min(ahead, self.length_bucket(max_length))
            if budget_tokens is not None:
                per_slot = budget_tokens // rows_kept
                ahead = min(ahead, per_slot - per_slot % self.length_bucket(1))
            length_to = max(length_to, ahead)
        # more slots at a capacity grown ahead could pass the budget: then shrink the positions
        # to what the running sequences reserve (nothing beyond ``length`` is in use)
        exact = budget_tokens is not None and rows_kept * max(length_to, cache.capacity) > \
            budget_tokens
        if cache.ensure(rows_to, length_to, exact=exact):
            self.drop_graphs()
            self._arange = torch.arange(self.cache.capacity, device=self.device)
            log.info("kv cache resized", extra={
                "rows": self.cache.rows, "capacity": self.cache.capacity,
                "gib": round(self.cache.allocated_bytes / 2**30, 3)})

    def drop_graphs(self) -> None:
        """Forget captured graphs; their memory pool dies with them, so take a new one later."""

        self._graphs.clear()
        self._pool = None

    def release(self) -> None:
        """Free the KV cache and graphs (sleep, shutdown)."""

        self.drop_graphs()
        self._pool = None
        self.cache.release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # forward passes --------------------------------------------------------------------
    def _hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                mask: torch.Tensor | None, *, decode: bool = False) -> torch.Tensor:
        # A 4D mask is handed to every layer as it is, by every model's mask builder (Llama's
        # single mask, Qwen2's per-layer-type mapping alike). A dict is only understood by
        # models with layer types: Llama passed it to its mask builder, which returns None
        # for a custom attention, and decode then attended to stale cache positions.
        with fusions.active(self._fused if decode else self._prefill_fused):
            out = self.decoder(input_ids=input_ids, position_ids=position_ids,
                               attention_mask=mask, past_key_values=self.cache, use_cache=True)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def prefill(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        """Write ``prompts`` into ``slots``; logits ``[b, V]`` (float32) after each last token."""

        lengths = [len(p) for p in prompts]
        t = max(lengths)
        ids = torch.zeros(len(prompts), t, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.device, non_blocking=True)
        positions = torch.arange(t, device=self.device).unsqueeze(0).expand(len(prompts), t)
        self.cache.plan_prefill(torch.tensor(slots, dtype=torch.long, device=self.device))
        self.prefill_forwards += 1
        try:
            hidden = self._hidden(ids, positions, None)
        finally:
            self.cache.clear_plan()
        last = torch.tensor([n - 1 for n in lengths], device=self.device)
        h = hidden[torch.arange(len(prompts), device=self.device), last]
        return self.lm_head(h).float()

    def prefill_extend(self, prompt: list[int], slot: int, prefix_blocks: Sequence[torch.Tensor]
                       ) -> torch.Tensor:
        """Prefill one prompt whose first tokens are cached in ``prefix_blocks``: their KV is
        copied into the slot and only the rest runs; logits ``[1, V]`` after the last token."""

        start = self.cache.write_prefix(slot, prefix_blocks)
        t = len(prompt) - start
        ids = torch.tensor([prompt[start:]], dtype=torch.long, device=self.device)
        positions = torch.arange(start, len(prompt), device=self.device).unsqueeze(0)
        keys = torch.arange(len(prompt), device=self.device)
        mask = (keys[None, :] <= positions[0, :, None])[None, None]  # [1, 1, t, start + t]
        self.cache.plan_extend(slot, start)
        self.prefill_forwards += 1
        try:
            hidden = self._hidden(ids, positions, mask)
        finally:
            self.cache.clear_plan()
        return self.lm_head(hidden[:, t - 1]).float()

    def prefill_extend_batch(self, prompts: Sequence[Sequence[int]], slots: Sequence[int],
                             prefixes: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
        """:meth:`prefill_extend` for several prompts in one forward pass (an agent's next
        turns arrive together: a long cached start and a short rest each, so one pass per
        prompt left the GPU idle); logits ``[n, V]`` after each prompt's last token.

        The rests are right-padded to the longest. Row ``i``'s queries sit at positions
        ``start_i..`` and read their own slot through a 4D boolean mask (a tensor, never a
        dict: see :meth:`_hidden`); a padded query repeats the row's last position, so it
        stays inside the rotary table and attends only to keys that exist. Its output is
        dropped, and the cache plan never writes it."""

        if len(prompts) == 1:
            return self.prefill_extend(list(prompts[0]), slots[0], prefixes[0])
        starts = [self.cache.write_prefix(slot, blocks)
                  for slot, blocks in zip(slots, prefixes, strict=True)]
        lengths = [len(p) - s for p, s in zip(prompts, starts, strict=True)]
        n, t = len(prompts), max(lengths)
        ids = torch.zeros(n, t, dtype=torch.long)
        for i, (p, s) in enumerate(zip(prompts, starts, strict=True)):
            ids[i, : len(p) - s] = torch.tensor(p[s:], dtype=torch.long)
        ids = ids.to(self.device, non_blocking=True)
        start = torch.tensor(starts, dtype=torch.long, device=self.device)
        last = torch.tensor([m - 1 for m in lengths], dtype=torch.long, device=self.device)
        steps = torch.arange(t, device=self.device)
        positions = start[:, None] + torch.minimum(steps[None, :], last[:, None])  # [n, t]
        keys = torch.arange(max(s + m for s, m in zip(starts, lengths, strict=True)),
                            device=self.device)
        mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # [n, 1, t, L]
        self.cache.plan_extend_batch(slots, starts, lengths)
        self.prefill_forwards += 1
        try:
            hidden = self._hidden(ids, positions, mask)
        finally:
            self.cache.clear_plan()
        h = hidden[torch.arange(n, device=self.device), last]
        return self.lm_head(h).float()

    def _decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                        attn_len: int) -> torch.Tensor:
        if self.decode_kernel == "triton":  # each row's length, read by the split-K kernel
            mask = (positions + 1).to(torch.int32)[:, None, None, None]
        else:
            # Additive (0 / -inf, the model's dtype), built once a step: SDPA turns a boolean
            # mask into this form in every layer, one more kernel each (docs/benchmarks.md).
            allowed = self._arange[:attn_len][None, :] <= positions[:, None]
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device
                               ).masked_fill_(~allowed, float("-inf"))[:, None, None, :]
        self.cache.plan_decode(positions, attn_len)
        try:
            hidden = self._hidden(input_ids, positions[:, None], mask, decode=True)
        finally:
            self.cache.clear_plan()
        return self.lm_head(hidden[:, -1]).float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, max_pos: int,
               lora_key: Hashable) -> torch.Tensor:
        """One decode step for rows ``0..B-1``: ``tokens``/``positions`` are ``[B]`` on device.

        ``max_pos`` (known on the host) sizes the attention window without a device sync.
        """

        rows = tokens.shape[0]
        attn_len = (self.cache.capacity if self.decode_kernel == "triton"
                    else min(self.length_bucket(max_pos + 1), self.cache.capacity))
        if not self.use_graphs:
            return self._decode_forward(tokens[:, None], positions, attn_len)
        bucket = self.row_bucket(rows)
        key = (bucket, attn_len, lora_key)
        graph = self._graphs.get(key)
        if graph is None:
            self._capture(tokens, positions, attn_len, lora_key, bucket)
            graph = self._graphs[key]
        else:
            graph.load(tokens, positions)
        return graph.replay()[:rows]

    def _capture(self, tokens: torch.Tensor, positions: torch.Tensor, attn_len: int,
                 lora_key: Hashable, bucket: int) -> None:
        """Capture the graph of ``bucket`` rows or, with ``capture_all``, of every bucket the
        cache's slots hold, largest first (smaller ones reuse its pool memory), as vLLM
        captures its batch sizes at startup: a bucket first met mid-rollout otherwise costs
        its capture and the compiles of its shapes (Triton, inductor) there.

        Each graph warms up on this step's own inputs: a smaller bucket writes its rows' KV
        as the step will, a larger one pads into free slots at position 0 (``load``)."""

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        sizes = [bucket]
        if self.capture_all:
            sizes = sorted({b for b in ROW_BUCKETS if b <= self.cache.rows} | {bucket},
                           reverse=True)
        t0, before = time.perf_counter(), self.graph_captures
        for size in sizes:
            key = (size, attn_len, lora_key)
            if key in self._graphs:
                continue
            graph = _DecodeGraph(self, size, attn_len)
            graph.load(tokens[:size], positions[:size])
            graph.capture()
            self._graphs[key] = graph
            self.graph_captures += 1
        if len(sizes) > 1:
            log.info("decode graphs captured", extra={
                "graphs": self.graph_captures - before, "rows": sizes,
                "seconds": round(time.perf_counter() - t0, 3)})

    # sleep mode ------------------------------------------------------------------------
    def offload(self) -> None:
        self.release()
        if self.device.type == "cuda":
            for group in self.merged:  # the parameters move one by one: keep no GPU copy
                group.release()
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def reload(self) -> None:
        if self.device.type == "cuda":
            self.model.to(self.device)
            for group in self.merged:
                group.merge()


class _DecodeGraph:
    """A captured decode step for one (rows bucket, attention length, LoRA graph key)."""

    def __init__(self, runner: ModelRunner, rows: int, attn_len: int) -> None:
        self.runner, self.rows, self.attn_len = runner, rows, attn_len
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=runner.device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=runner.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None

    def load(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        n = tokens.shape[0]
        self.tokens[:n, 0].copy_(tokens)
        self.positions[:n].copy_(positions)
        if n < self.rows:  # padding rows write into free slots at position 0
            self.tokens[n:].zero_()
            self.positions[n:].zero_()

    def capture(self) -> None:
        """Warm up on the real inputs (the writes are the step's own) then capture."""

        runner = self.runner
        stream = torch.cuda.Stream(device=runner.device)
        stream.wait_stream(torch.cuda.current_stream(runner.device))
        with torch.cuda.stream(stream):
            runner._decode_forward(self.tokens, self.positions, self.attn_len)
        torch.cuda.current_stream(runner.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=runner._pool):
            self.logits = runner._decode_forward(self.tokens, self.positions, self.attn_len)
        self.graph = graph

    def replay(self) -> torch.Tensor:
        assert self.graph is not None and self.logits is not None
        self.graph.replay()
        return self.logits
