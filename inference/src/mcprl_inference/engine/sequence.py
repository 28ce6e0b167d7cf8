"""What the engine keeps per request and per sequence, and what it hands back."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcprl_inference.engine.sampling import SamplingParams


def settle(future: concurrent.futures.Future, result: Any = None,
           error: BaseException | None = None) -> None:
    """Resolve a future unless the client already gave up on it (cancelled)."""

    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled concurrently
        pass


class EngineError(Exception):
    """A request the engine refuses; ``kind`` maps to an HTTP status in the service."""

    def __init__(self, message: str, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.kind = kind  # bad_request | not_found | unavailable | internal


@dataclass
class SequenceOutput:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    """Raw log-prob of each sampled token (always filled; the service returns it on request)."""
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str
    stop_reason: int | str | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[SequenceOutput]
    time_to_first_token_s: float
    latency_s: float
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (vLLM's ``num_cached_tokens``)."""


class EngineObserver(Protocol):
    """Metrics hooks (the service implements them with Prometheus; the engine stays free of it)."""

    def on_step(self, running: int, waiting: int, decode_batch: int) -> None: ...

    def on_request_done(self, output: RequestOutput, adapter: str | None) -> None: ...


class NullObserver:
    def on_step(self, running: int, waiting: int, decode_batch: int) -> None:
        pass

    def on_request_done(self, output: RequestOutput, adapter: str | None) -> None:
        pass


@dataclass
class EngineStats:
    decode_steps: int = 0
    decode_tokens: int = 0
    ahead_steps: int = 0
    """Decode steps launched before the host read the step before (async scheduling)."""
    dropped_rows: int = 0
    """Rows of steps run ahead for sequences that had finished the step before: the waste."""
    max_decode_batch: int = 0
    prefill_batches: int = 0
    prefill_forwards: int = 0
    """Eager prefill forward passes (full, extend and batched extend): a prompt equal to
    another of its admission, or a cached start batched with others, adds none."""
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens served without a forward pass: prefix-cache hits and copies of an
    equal prompt of the same admission (the sum of the requests' ``cached_tokens``)."""
    generated_tokens: int = 0
    decode_time_s: float = 0.0
    prefill_time_s: float = 0.0
    decode_forward_s: float = 0.0
    """Device time of decode forwards (only with ``EngineConfig.profile`` on CUDA)."""
    sample_s: float = 0.0
    """Device time of sampling after decode forwards (same condition)."""


@dataclass
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    adapter: str | None
    need_len: int
    future: concurrent.futures.Future
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    sequences: list[SequenceState] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served by the prefix cache


@dataclass
class SequenceState:
    request: EngineRequest
    index: int
    seed: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    slot: int = -1
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    matcher: Any = None

    @property
    def total_len(self) -> int:
        return len(self.request.prompt_ids) + len(self.output_ids)
