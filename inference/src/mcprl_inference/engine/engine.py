"""The engine: a scheduler thread that batches every running sequence into one decode step.

Requests arrive from any thread (the API's event loop) and wait in a FIFO queue. The engine
thread loops: admit waiting requests while KV slots and memory allow (continuous batching:
new sequences join a batch that is already decoding), prefill them together, then run one
decode step for all running sequences, sample, and retire finished ones, compacting the
slots. ``n > 1`` prefills the prompt once and copies its KV into the siblings' slots, and
so do equal prompts admitted together (the rollouts of one task, sent as n=1 requests).

LoRA: the running batch shares one adapter (or none); a request for another adapter waits at
the head of the queue until the batch drains, then the batch switches (FIFO, no starvation).
Commands that change the model (load/unload a LoRA, sleep, wake) stop admission, wait for the
running sequences to finish, run in the engine thread, and resume: every sequence is decoded
by one set of weights from start to end.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mcprl_inference.engine.config import EngineConfig
from mcprl_inference.engine.loader import eos_token_ids, resolve_device, resolve_dtype
from mcprl_inference.engine.lora import LoraError, LoraManager
from mcprl_inference.engine.model_runner import ModelRunner
from mcprl_inference.engine.prefill import PromptPrefiller
from mcprl_inference.engine.prefix_cache import PrefixCache
from mcprl_inference.engine.sampling import (
    SampleResult,
    SamplingBatch,
    SamplingParams,
    sample,
    unpack_bitmask,
)
from mcprl_inference.engine.sequence import (
    EngineError,
    EngineObserver,
    EngineRequest,
    EngineStats,
    NullObserver,
    RequestOutput,
    SequenceOutput,
    SequenceState,
    settle,
)

log = logging.getLogger(__name__)
SEED_MASK = (1 << 63) - 1  # seeds are kept to 63 bits (torch generators take int64)


@dataclass
class _Command:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


class LLMEngine:
    """Continuous-batching generation over a HF causal LM (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any | None, config: EngineConfig | None = None, *,
                 observer: EngineObserver | None = None) -> None:
        self.config = config or EngineConfig()
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.model, self.tokenizer = model, tokenizer
        self.runner = ModelRunner(model, self.device, self.dtype,
                                  cuda_graphs=self.config.cuda_graphs,
                                  capture_all_batch_sizes=self.config.capture_all_batch_sizes,
                                  decode_attention=self.config.decode_attention,
                                  fuse=self.config.fuse)
        self.lora = LoraManager(model, max_loras=self.config.max_loras,
                                max_rank=self.config.max_lora_rank,
                                mode=self.config.lora_mode,
                                on_layout_change=self.runner.drop_graphs)
        self.eos_ids = set(eos_token_ids(model, tokenizer))
        self.vocab_size = self.runner.vocab_size
        limit = self.runner.max_position
        self.max_model_len = min(self.config.max_model_len or limit, limit)
        self.max_prefill_tokens = self.config.max_prefill_tokens or (
            16384 if self.device.type == "cuda" else 2048)
        self.kv_budget_tokens = self._kv_budget_bytes() // self.runner.cache.bytes_per_token
        self.prefix_cache = PrefixCache(self.config.prefix_block_size, self._prefix_tokens())
        self.prefiller = PromptPrefiller(self.runner, self.prefix_cache, self.max_prefill_tokens)
        self.observer: EngineObserver = observer or NullObserver()
        self.stats = EngineStats()
        self._cv = threading.Condition()
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._commands: collections.deque[_Command] = collections.deque()
        self._aborted: set[str] = set()
        self._running: list[SequenceState] = []
        self._group: str | None = None
        self._sleeping = False
        self._stop = False
        self._rng = random.Random(self.config.seed)
        self._batch: SamplingBatch | None = None
        self._tokens: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._steps: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._prompt_mask: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None
        # async scheduling: the decode step launched before the host read the one before it
        self._ahead: SampleResult | None = None
        self._ahead_seqs: list[SequenceState] = []
        self._last_prefill_s = 0.0  # host time of the last prefill (scheduler_delay_factor)
        self.async_scheduling = (self.device.type == "cuda"
                                 if self.config.async_scheduling is None
                                 else self.config.async_scheduling)
        self._thread: threading.Thread | None = None
        log.info("engine ready", extra={
            "device": str(self.device), "dtype": str(self.dtype),
            "max_model_len": self.max_model_len, "kv_budget_tokens": self.kv_budget_tokens,
            "cuda_graphs": self.runner.use_graphs})

    @classmethod
    def from_pretrained(cls, path: str, config: EngineConfig | None = None, *,
                        observer: EngineObserver | None = None,
                        trust_remote_code: bool = False) -> LLMEngine:
        from mcprl_inference.engine.loader import load_model, load_tokenizer

        config = config or EngineConfig()
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model = load_model(path, device, dtype, trust_remote_code)
        tokenizer = load_tokenizer(path, trust_remote_code)
        return cls(model, tokenizer, config, observer=observer)

    def _kv_budget_bytes(self) -> int:
        gib = self.config.kv_cache_memory_gb
        if gib is not None:
            return int(gib * 2**30)
        if self.device.type != "cuda":
            return 4 * 2**30
        total = torch.cuda.get_device_properties(self.device).total_memory
        used = torch.cuda.memory_allocated(self.device)
        cfg = self.model.config.get_text_config()
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        workspace = (2**30 + self.max_prefill_tokens * (4 * cfg.hidden_size + 3 * getattr(
            cfg, "intermediate_size", 4 * cfg.hidden_size)) * itemsize
            + self.config.max_batch_size * self.vocab_size * 4 * 8)
        return max(int(self.config.gpu_memory_utilization * total) - used - workspace, 2**28)

    def _prefix_tokens(self) -> int:
        if not self.config.enable_prefix_caching:
            return 0
        gib = self.config.prefix_cache_memory_gb
        if gib is not None:
            budget = int(gib * 2**30)
        elif self.device.type == "cuda":
            budget = min(self.kv_budget_tokens * self.runner.cache.bytes_per_token // 10,
                         8 * 2**30)
        else:
            budget = 2**30
        return budget // self.runner.cache.bytes_per_token

    # lifecycle -------------------------------------------------------------------------
    def start(self) -> LLMEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mcprl-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._fail_waiting(EngineError("the engine is shutting down", "unavailable"))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_sleeping(self) -> bool:
        return self._sleeping

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    # requests --------------------------------------------------------------------------
    def check(self, prompt_len: int, params: SamplingParams) -> int:
        """Validate a request against the model's limits; returns its ``max_tokens``.

        Raises :class:`EngineError` with the message a client needs (vLLM's wording where
        vLLM has one).
        """

        if prompt_len == 0:
            raise EngineError("The prompt is empty; it needs at least one token.")
        if params.n < 1:
            raise EngineError("n must be at least 1.")
        if params.n > self.config.max_batch_size:
            raise EngineError(f"n={params.n} is larger than the engine's max_batch_size "
                              f"({self.config.max_batch_size}).")
        if prompt_len >= self.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"your request has {prompt_len} input tokens. Please reduce the length of the "
                "input messages.")
        max_tokens = params.max_tokens
        if max_tokens < 1:
            raise EngineError("max_tokens must be at least 1.")
        if prompt_len + max_tokens > self.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                "completion.")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise EngineError(f"Requested logprobs of {params.logprobs}, which is greater than "
                              f"max allowed: {self.config.max_logprobs}")
        rows = self.runner.alloc_rows(params.n)
        if rows * self.runner.length_bucket(prompt_len + max_tokens) > self.kv_budget_tokens:
            raise EngineError(f"the request needs {params.n} x {prompt_len + max_tokens} KV-cache "
                              f"tokens, more than this engine's cache holds "
                              f"({self.kv_budget_tokens}); lower max_tokens or n.")
        return max_tokens

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams,
                    adapter: str | None = None, request_id: str | None = None
                    ) -> concurrent.futures.Future:
        """Queue a request; the future resolves to a :class:`RequestOutput` (or an EngineError)."""

        prompt = [int(t) for t in prompt_ids]
        self.check(len(prompt), params)
        bad = [t for t in prompt if t < 0 or t >= self.vocab_size]
        if bad:
            raise EngineError(f"Token id {bad[0]} is out of vocabulary (vocab size "
                              f"{self.vocab_size}).")
        if self._sleeping:
            raise EngineError("The engine is sleeping; call POST /wake_up first.", "unavailable")
        if adapter is not None and adapter not in self.lora.adapters:
            raise EngineError(f"The model `{adapter}` does not exist.", "not_found")
        future: concurrent.futures.Future = concurrent.futures.Future()
        req = EngineRequest(request_id or uuid.uuid4().hex, prompt, params, adapter,
                       need_len=min(len(prompt) + params.max_tokens, self.max_model_len),
                       future=future)
        for i in range(params.n):
            if params.seed is not None:
                seed = (params.seed + i * 0x9E3779B97F4A7C15) & SEED_MASK
            else:
                seed = self._rng.getrandbits(63)
            req.sequences.append(SequenceState(req, i, seed, top_logprobs=(
                [] if params.logprobs is not None else None)))
        with self._cv:
            if self._stop:
                raise EngineError("the engine is shutting down", "unavailable")
            self._waiting.append(req)
            self._cv.notify_all()
        return future

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._aborted.add(request_id)
            self._cv.notify_all()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 adapter: str | None = None, timeout_s: float | None = None
                 ) -> list[RequestOutput]:
        """Blocking helper (benchmarks, scripts): submit all, wait for all."""

        futures = [self.add_request(p, params, adapter) for p in prompts]
        return [f.result(timeout_s) for f in futures]

    # commands (run in the engine thread once the running batch drained) ---------------
    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._commands.append(_Command(fn, future))
            self._cv.notify_all()
        return future

    def load_lora(self, name: str, path: str) -> concurrent.futures.Future:
        return self.call(lambda: self.lora.load(name, path))

    def unload_lora(self, name: str) -> concurrent.futures.Future:
        return self.call(lambda: self.lora.unload(name))

    def sleep(self, level: int = 1) -> concurrent.futures.Future:
        def _sleep() -> None:
            if not self._sleeping:
                self.prefix_cache.clear()
                self.runner.offload()
                self.lora.move_pristine(next(self.runner.model.parameters()).device)
                self._counts = self._prompt_mask = None
                self._sleeping = True
                self._fail_waiting(EngineError(
                    "The engine went to sleep; call POST /wake_up first.", "unavailable"))
                log.info("engine sleeping", extra={"level": level})

        return self.call(_sleep)

    def wake_up(self) -> concurrent.futures.Future:
        def _wake() -> None:
            if self._sleeping:
                self.runner.reload()
                self.lora.move_pristine(next(self.runner.model.parameters()).device)
                self._sleeping = False
                log.info("engine awake")

        return self.call(_wake)

    # the loop --------------------------------------------------------------------------
    def _has_work(self) -> bool:
        return bool(self._commands or self._running or self._aborted
                    or (self._waiting and not self._sleeping))

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._stop and not self._has_work():
                        self._cv.wait()
                    if self._stop:
                        break
                try:
                    self._step()
                except Exception as exc:  # keep serving: fail what was in flight, reset state
                    log.exception("engine step failed")
                    self._fail_running(EngineError(f"engine error: {type(exc).__name__}: {exc}",
                                                   "internal"))
        self._fail_running(EngineError("the engine is shutting down", "unavailable"))

    def _step(self) -> None:
        admit = self._admission_due()
        if self._ahead is not None and (self._aborted or self._commands or (
                admit and self._waiting and len(self._running) < self.config.max_batch_size)):
            self._drain()  # what follows may change the batch: nothing may be in flight
        self._process_aborts()
        if self._commands:
            if not self._running:
                self._run_commands()
        elif self._sleeping:
            self._fail_waiting(EngineError("The engine is sleeping; call POST /wake_up first.",
                                           "unavailable"))
        elif admit:
            self._admit()
        decode_batch = len(self._running)
        if self._running:
            self._decode()
        self.observer.on_step(len(self._running), len(self._waiting), decode_batch)

    def _admission_due(self) -> bool:
        """Whether waiting prompts may join now. An idle engine admits at once; a decoding
        one, with ``scheduler_delay_factor`` > 0, once the oldest waiting request has waited
        that many times the last prefill's host time (vLLM's delay): requests that trickle
        in over HTTP then prefill in one pass, not one pass per decode step each."""

        factor = self.config.scheduler_delay_factor
        if not factor or not self._running:
            return True
        with self._cv:
            if not self._waiting:
                return True
            oldest = self._waiting[0].arrival
        return time.perf_counter() - oldest >= factor * self._last_prefill_s

    def _run_commands(self) -> None:
        while True:
            with self._cv:
                if not self._commands:
                    return
                cmd = self._commands.popleft()
            try:
                result = cmd.fn()
            except Exception as exc:
                settle(cmd.future, error=exc)
            else:
                settle(cmd.future, result)

    def _process_aborts(self) -> None:
        if not self._aborted:
            return
        with self._cv:
            aborted, self._aborted = self._aborted, set()
            self._waiting = collections.deque(r for r in self._waiting
                                              if r.request_id not in aborted)
        hit = False
        for seq in self._running:
            if seq.request.request_id in aborted and seq.finish_reason is None:
                seq.finish_reason, hit = "abort", True
        if hit:
            self._retire()

    def _fail_waiting(self, error: EngineError) -> None:
        with self._cv:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for req in waiting:
            settle(req.future, error=error)

    def _fail_running(self, error: EngineError) -> None:
        requests = {id(s.request): s.request for s in self._running}
        self._running = []
        self._group = None
        self._batch = None
        self._ahead, self._ahead_seqs = None, []
        for req in requests.values():
            settle(req.future, error=error)

    # admission + prefill ---------------------------------------------------------------
    def _fits(self, rows: int, length: int) -> bool:
        r = self.runner
        return r.alloc_rows(rows) * r.length_bucket(length) <= self.kv_budget_tokens

    def _admit(self) -> None:
        admitted: list[EngineRequest] = []
        rows = len(self._running)
        reserved = max((s.request.need_len for s in self._running), default=0)
        tokens = 0
        group = self._group
        admitted_prompts: set[tuple[int, ...]] = set()
        with self._cv:
            while self._waiting:
                req = self._waiting[0]
                if req.adapter is not None and req.adapter not in self.lora.adapters:
                    self._waiting.popleft()
                    settle(req.future, error=EngineError(
                        f"The model `{req.adapter}` does not exist.", "not_found"))
                    continue
                if (rows or admitted) and req.adapter != group:
                    break
                if req.adapter is not None and not self._make_resident(req):
                    self._waiting.popleft()
                    continue
                new_rows, new_len = rows + req.params.n, max(reserved, req.need_len)
                if new_rows > self.config.max_batch_size or not self._fits(new_rows, new_len):
                    break
                # admission keeps one adapter per batch
                work = self.prefiller.work(req.prompt_ids, self.lora.key(req.adapter),
                                           admitted_prompts)
                if admitted and tokens + work > self.max_prefill_tokens:
                    break
                self._waiting.popleft()
                admitted.append(req)
                admitted_prompts.add(tuple(req.prompt_ids))
                group = req.adapter
                rows, reserved, tokens = new_rows, new_len, tokens + work
        if admitted:
            self._group = group
            try:
                self._prefill(admitted, rows, reserved)
            except Exception as exc:
                # Popped from the queue but maybe not yet running (the cache's growth can run
                # out of memory beside a trainer): fail them here, or their callers would wait
                # until their own timeouts. The loop then fails the running batch.
                error = EngineError(f"engine error: {type(exc).__name__}: {exc}", "internal")
                for req in admitted:
                    settle(req.future, error=error)
                raise

    def _make_resident(self, req: EngineRequest) -> bool:
        """Its adapter in memory (loaded again if ``max_loras`` evicted it); False, with the
        request failed, when that is no longer possible (its folder is gone)."""

        try:
            self.lora.ensure_resident(req.adapter)
        except LoraError as exc:
            settle(req.future, error=EngineError(
                f"The model `{req.adapter}` could not be loaded again: {exc}", "not_found"))
            return False
        return True

    def _prefill(self, requests: list[EngineRequest], rows: int, reserved: int) -> None:
        t0 = time.perf_counter()
        self.runner.ensure_capacity(rows, reserved, max_length=self.max_model_len,
                                    budget_tokens=self.kv_budget_tokens)
        self.lora.activate(self._group)
        base = len(self._running)
        slot = base
        first_slots: list[int] = []
        new_seqs: list[SequenceState] = []
        for req in requests:
            first_slots.append(slot)
            for seq in req.sequences:
                seq.slot = slot
                slot += 1
                new_seqs.append(seq)
        self._running.extend(new_seqs)  # before the forward: a failure fails them too
        forwards = self.runner.prefill_forwards
        logits = self.prefiller.logits(requests, first_slots, self.lora.key(self._group))
        self.stats.prefill_forwards += self.runner.prefill_forwards - forwards
        expand: list[int] = []
        for i, req in enumerate(requests):
            for seq in req.sequences[1:]:
                self.runner.cache.move(seq.slot, req.sequences[0].slot, len(req.prompt_ids))
            expand.extend([i] * len(req.sequences))
        if len(expand) != len(requests):
            logits = logits[torch.tensor(expand, device=logits.device)]
        params = [s.request.params for s in new_seqs]
        batch = SamplingBatch.build(params, [s.seed for s in new_seqs], self.device)
        if batch.any_penalty or self._counts is not None:
            self._ensure_penalty_state()
            assert self._counts is not None and self._prompt_mask is not None
            for seq in new_seqs:
                self._counts[seq.slot].zero_()
                self._prompt_mask[seq.slot].zero_()
                ids = torch.tensor(seq.request.prompt_ids, device=self.device)
                self._prompt_mask[seq.slot, ids] = True
        steps = torch.zeros(len(new_seqs), dtype=torch.long, device=self.device)
        slots = torch.arange(base, base + len(new_seqs), device=self.device)
        result = self._sample(logits, batch, steps, new_seqs, slots)
        self.stats.prefill_batches += 1
        self.stats.prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self.stats.cached_prompt_tokens += sum(r.cached_tokens for r in requests)
        self._last_prefill_s = time.perf_counter() - t0
        self.stats.prefill_time_s += self._last_prefill_s
        now = time.perf_counter()
        for req in requests:
            req.first_token = now
        self._take(new_seqs, result.host)
        self._batch = None  # composition changed
        self._retire()

    def _ensure_penalty_state(self) -> None:
        rows = max(self.runner.cache.rows, 1)
        if self._counts is None or self._counts.shape[0] < rows:
            counts = torch.zeros(rows, self.vocab_size, dtype=torch.int32, device=self.device)
            mask = torch.zeros(rows, self.vocab_size, dtype=torch.bool, device=self.device)
            if self._counts is not None and self._prompt_mask is not None:
                counts[: self._counts.shape[0]] = self._counts
                mask[: self._prompt_mask.shape[0]] = self._prompt_mask
            self._counts, self._prompt_mask = counts, mask

    def _sample(self, logits: torch.Tensor, batch: SamplingBatch, steps: torch.Tensor,
                seqs: list[SequenceState], slots: torch.Tensor) -> Any:
        allowed = allowed_rows = None
        constrained = [i for i, s in enumerate(seqs) if s.request.params.grammar is not None]
        if constrained:
            allowed, allowed_rows = self._grammar_masks(seqs, constrained)
        counts = prompt_mask = None
        if batch.any_penalty and self._counts is not None and self._prompt_mask is not None:
            counts, prompt_mask = self._counts[slots], self._prompt_mask[slots]
        result = sample(logits, batch, steps, allowed, allowed_rows, counts, prompt_mask,
                        fused=self.runner.fused_sampling)
        if self._counts is not None:
            self._counts[slots, result.tokens] += 1
        return result

    def _grammar_masks(self, seqs: list[SequenceState], rows: list[int]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for j, i in enumerate(rows):
            seq = seqs[i]
            if seq.matcher is None:
                seq.matcher = xgr.GrammarMatcher(seq.request.params.grammar)
            seq.matcher.fill_next_token_bitmask(bitmask, j)
        allowed = unpack_bitmask(bitmask.to(self.device), self.vocab_size)
        return allowed, torch.tensor(rows, dtype=torch.long, device=self.device)

    # decode ----------------------------------------------------------------------------
    def _decode(self) -> None:
        """One decode step for the running batch; with async scheduling, the step after it is
        launched before this one's tokens are read, and kept in flight while the batch stays
        as it is (no sequence finished, nothing waiting to join or leave)."""

        t0 = time.perf_counter()
        seqs = self._running
        if self._batch is None or self._tokens is None:
            self._batch = SamplingBatch.build([s.request.params for s in seqs],
                                              [s.seed for s in seqs], self.device)
            self._tokens = torch.tensor([s.output_ids[-1] for s in seqs], device=self.device)
            self._positions = torch.tensor([s.total_len - 1 for s in seqs], device=self.device)
            self._steps = torch.tensor([len(s.output_ids) for s in seqs], device=self.device)
            self._slots = torch.arange(len(seqs), device=self.device)
        if self._ahead is not None:  # launched by the last step for this same batch
            current, self._ahead, self._ahead_seqs = self._ahead, None, []
        else:
            current = self._launch(seqs, pending=0)
        if self._may_run_ahead(seqs):
            self._ahead, self._ahead_seqs = self._launch(seqs, pending=1), list(seqs)
            self.stats.ahead_steps += 1
        self._take(seqs, current.host)
        self._count_step(len(seqs), t0)
        if self._ahead is not None and any(s.finish_reason is not None for s in seqs):
            self._drain()
        self._retire()

    def _launch(self, seqs: list[SequenceState], pending: int) -> SampleResult:
        """Queue a decode step and its sampling on the device (the host reads nothing).
        ``pending``: tokens sampled but not yet taken into ``seqs``."""

        assert self._positions is not None and self._steps is not None
        assert self._tokens is not None and self._batch is not None
        max_pos = max(s.total_len for s in seqs) - 1 + pending
        self.lora.activate(self._group)
        events = self._events() if self.config.profile else None
        if events:
            events[0].record()
        logits = self.runner.decode(self._tokens, self._positions, max_pos,
                                    self.lora.graph_key())
        if events:
            events[1].record()
        result = self._sample(logits, self._batch, self._steps, seqs, self._slots)
        if events:
            events[2].record()
            events[2].synchronize()
            self.stats.decode_forward_s += events[0].elapsed_time(events[1]) / 1000
            self.stats.sample_s += events[1].elapsed_time(events[2]) / 1000
        self._tokens = result.tokens
        self._positions += 1
        self._steps += 1
        return result

    def _may_run_ahead(self, seqs: list[SequenceState]) -> bool:
        """Whether the next step can be launched before this one's tokens are read: not
        under a grammar (its mask needs the token), not while profiling (which syncs), and
        not when every sequence ends with this step by length."""

        if not self.async_scheduling or self.config.profile:
            return False
        if any(s.request.params.grammar is not None for s in seqs):
            return False
        return any(len(s.output_ids) + 1 < s.request.params.max_tokens
                   and s.total_len + 1 < self.max_model_len for s in seqs)

    def _drain(self) -> None:
        """Take the step in flight: its tokens for the sequences still running; a sequence
        that finished in the step before has its row dropped (its slot's extra KV position
        is past its end and never read)."""

        ahead, seqs = self._ahead, self._ahead_seqs
        self._ahead, self._ahead_seqs = None, []
        if ahead is None:
            return
        t0 = time.perf_counter()
        rows = [(s, row) for s, row in zip(seqs, ahead.host, strict=True)
                if s.finish_reason is None]
        self.stats.dropped_rows += len(seqs) - len(rows)
        self._take([s for s, _ in rows], [row for _, row in rows])
        self._count_step(len(rows), t0)
        self._retire()

    def _count_step(self, rows: int, t0: float) -> None:
        self.stats.decode_steps += 1
        self.stats.decode_tokens += rows
        self.stats.max_decode_batch = max(self.stats.max_decode_batch, rows)
        self.stats.decode_time_s += time.perf_counter() - t0

    def _events(self) -> list[Any] | None:
        if self.device.type != "cuda":
            return None
        return [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    def _take(self, seqs: list[SequenceState], host: list[list[float]]) -> None:
        """Append each row's sampled token and decide whether its sequence is done."""

        for seq, row in zip(seqs, host, strict=True):
            params = seq.request.params
            token = int(row[0])
            seq.output_ids.append(token)
            seq.logprobs.append(row[1])
            if seq.top_logprobs is not None:
                k = params.logprobs or 0
                seq.top_logprobs.append([(int(row[2 + 2 * j]), row[3 + 2 * j]) for j in range(k)])
            self.stats.generated_tokens += 1
            if seq.matcher is not None and not seq.matcher.is_terminated():
                seq.matcher.accept_token(token)
            if token in params.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", token
            elif (token in self.eos_ids and not params.ignore_eos) or (
                    seq.matcher is not None and seq.matcher.is_terminated()):
                seq.finish_reason = "stop"
            elif params.stop and (hit := self._stop_string(seq)) is not None:
                seq.finish_reason, seq.stop_reason = "stop", hit
            elif len(seq.output_ids) >= params.max_tokens or seq.total_len >= self.max_model_len:
                seq.finish_reason = "length"

    def _stop_string(self, seq: SequenceState) -> str | None:
        if self.tokenizer is None:
            return None
        stops = seq.request.params.stop
        window = max(len(s) for s in stops) + 8
        skip = bool(seq.request.params.extra.get("skip_special_tokens", True))
        tail = self.tokenizer.decode(seq.output_ids[-window:], skip_special_tokens=skip)
        found = [(tail.find(s), s) for s in stops if s and s in tail]
        return min(found)[1] if found else None

    def _retire(self) -> None:
        """Drop finished sequences, compact the slots, resolve finished requests."""

        finished = [s for s in self._running if s.finish_reason is not None]
        if not finished:
            return
        self.prefiller.remember(finished, self.lora.key(self._group))
        alive = [s for s in self._running if s.finish_reason is None]
        n = len(alive)
        holes = sorted(s.slot for s in finished if s.slot < n)
        movers = sorted((s for s in alive if s.slot >= n), key=lambda s: s.slot)
        for hole, seq in zip(holes, movers, strict=True):
            self.runner.cache.move(hole, seq.slot, seq.total_len)
            if self._counts is not None and self._prompt_mask is not None:
                self._counts[hole] = self._counts[seq.slot]
                self._prompt_mask[hole] = self._prompt_mask[seq.slot]
            seq.slot = hole
        self._running = sorted(alive, key=lambda s: s.slot)
        self._batch = None
        if not self._running:
            self._group = None
        done: dict[int, EngineRequest] = {}
        for seq in finished:
            req = seq.request
            if all(s.finish_reason is not None for s in req.sequences):
                done[id(req)] = req
        now = time.perf_counter()
        for req in done.values():
            if req.future.done():
                continue
            outputs = [SequenceOutput(s.index, s.output_ids, s.logprobs, s.top_logprobs,
                                      s.finish_reason or "stop", s.stop_reason)
                       for s in req.sequences]
            out = RequestOutput(req.request_id, req.prompt_ids, outputs,
                                (req.first_token or now) - req.arrival, now - req.arrival,
                                req.cached_tokens)
            if any(s.finish_reason == "abort" for s in req.sequences):
                req.future.cancel()
                continue
            self.observer.on_request_done(out, req.adapter)
            settle(req.future, out)
