"""Engine configuration: what the scheduler, the KV cache and the model runner need to know.

Plain dataclass (no pydantic) so the engine core imports with torch + transformers alone,
e.g. on a GPU box that has neither FastAPI nor pydantic-settings (see bench/bench_inference.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """Knobs of the engine (the service maps its settings here)."""

    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    dtype: str = "auto"
    """``auto`` (bfloat16 on CUDA, float32 on CPU), ``bfloat16``, ``float16`` or ``float32``."""
    max_batch_size: int = 64
    """Sequences decoded together at most (vLLM's ``--max-num-seqs``)."""
    max_model_len: int | None = None
    """Prompt + completion tokens at most; ``None``: the config's ``max_position_embeddings``."""
    max_prefill_tokens: int | None = None
    """Prompt tokens prefilled in one forward pass; ``None``: 16384 on CUDA, 2048 on CPU."""
    kv_cache_memory_gb: float | None = None
    """KV cache budget in GiB; ``None``: ``gpu_memory_utilization`` of the GPU, 4 GiB on CPU."""
    gpu_memory_utilization: float = 0.85
    """Share of the GPU's memory the engine may use in all (weights + KV + graphs), as vLLM's."""
    cuda_graphs: bool = True
    """Capture the decode step in CUDA graphs (CUDA only; CPU always runs eagerly)."""
    capture_all_batch_sizes: bool = True
    """With the split-K decode attention, capture the graphs of every batch bucket the KV
    cache's slots hold the first time a LoRA graph key decodes, as vLLM captures its batch
    sizes at startup; off, each bucket is captured when a step first needs it, and a rollout
    whose running batch reaches a new size pays the capture and its shapes' compiles then.
    On H100s (2026-12-07) the synchronous RL step's steps 3-6 took 5.29-5.46 s, against
    5.32-6.21 s lazily (docs/benchmarks.md)."""
    max_loras: int = 8
    """LoRA adapters loaded at once at most."""
    max_lora_rank: int = 64
    """Largest LoRA rank accepted (vLLM's ``--max-lora-rank``)."""
    lora_mode: str = "auto"
    """auto | merged | unmerged: merge the active adapter into the weights (auto: float32 only;
    see ``engine.lora``)."""
    max_logprobs: int = 20
    """Largest ``top_logprobs`` / ``logprobs`` a request may ask for (vLLM's default 20)."""
    seed: int = 0
    """Seed of the engine's RNG that draws seeds for requests that bring none."""
    decode_attention: str = "auto"
    """Decode attention kernel: ``sdpa``, ``matmul``, ``triton`` (split-K over each row's own
    length, ``engine.decode_attention``; CUDA) or ``auto`` (``triton`` on CUDA, ``sdpa``
    elsewhere)."""
    fuse: str = "auto"
    """Fused kernels, ``none`` or kinds joined by ``+``: ``norm`` (fused RMSNorm), ``rotary``
    (a ``torch.compile``d rotary embedding), ``proj`` (q/k/v and gate/up as one GEMM each,
    ``engine.merged_linears``), ``mlp`` (a compiled ``silu(gate) * up``), ``residual`` (a
    layer's residual adds in a compiled add + RMSNorm and in the down projection's GEMM),
    ``kv`` (with the split-K decode attention, a decode step's K and V written by one Triton
    kernel), ``rope`` (with ``kv`` or ``attn``: the rotary done inside that write and the
    split-K attention, no kernel of its own), ``attn`` (the split-K attention writes the K
    and V itself and merges its own chunks: one kernel a layer instead of three), ``sample``
    (the sampler's common case, no penalty, mask or filter and at most the top-1 log-prob,
    in two Triton kernels); ``auto``: all of them on CUDA (``kv``, ``rope`` and ``attn`` where
    the decode attention is the split-K one), ``none`` on CPU. On an H100 (2026-12-06, batch
    64) ``norm+rotary+proj`` made a decode step 17% shorter than ``norm`` (6.21 against
    7.44 ms; the compiled rotary runs in decode steps only, where it was faster) and passed
    the CUDA tests (graphs, LoRA, sleep and wake); on an H200 (2026-12-07) ``rope`` took
    the step from 4.23 to 3.96 ms, and on an H100 ``attn`` from 4.66 to 4.60 ms and
    ``sample`` then to 4.24."""
    async_scheduling: bool | None = None
    """Launch each decode step before the host reads the previous step's tokens (vLLM's
    ``--async-scheduling``), so the GPU is not idle while the host appends tokens and checks
    stops; a sequence that stopped costs one wasted row of the step after. ``None``: on with
    CUDA (on an H100 a batch-64 decode step took 5.28 ms against 5.52, docs/benchmarks.md),
    off on a CPU, where nothing runs asynchronously and the row is only waste."""
    scheduler_delay_factor: float = 0.0
    """While a batch decodes, new prompts wait until the oldest of them has waited this many
    times the last prefill's host time (vLLM's ``--scheduler-delay-factor``), so a burst of
    requests that trickles in over HTTP prefills in one pass instead of one pass per decode
    step. 0 (vLLM's default): admit at every step. An idle engine admits at once either way,
    and a request never waits past the running batch's end."""
    enable_prefix_caching: bool = True
    """Reuse the KV of earlier sequences for prompts that start with the same tokens (vLLM's
    ``--enable-prefix-caching``; see ``engine.prefix_cache``)."""
    prefix_cache_memory_gb: float | None = None
    """Memory of the prefix cache in GiB; ``None``: 1 GiB on CPU, 10% of the KV budget (at
    most 8 GiB) on CUDA."""
    prefix_block_size: int = 16
    """Tokens per cached block (vLLM's ``--block-size``): prefixes are reused in whole blocks."""
    profile: bool = False
    """Time the decode forward and the sampler separately with CUDA events (benchmarks)."""
