"""Engine metrics under vLLM's names (``vllm:*``, label ``model_name``) plus ``mcprl_inference_*``.

The same Grafana dashboard then reads this engine and upstream vLLM. Built on the app's own
registry (mcprl_common.metrics.new_registry) so tests can run many apps in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from mcprl_inference.engine import RequestOutput

# vLLM's buckets for these histograms (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class EngineMetrics:
    """Implements the engine's observer hooks with Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name, self.registry = model_name, registry
        label = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Sequences decoding now.", label,
                             registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                             label, registry=registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", label,
                                     registry=registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", label,
                                         registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time from arrival to the first generated token.", label,
                              buckets=TTFT_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Time from arrival to the last generated token.", label,
                             buckets=E2E_BUCKETS, registry=registry)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=registry)
        self.batch = Histogram("mcprl_inference_decode_batch_size",
                               "Sequences decoded together in one step.", label,
                               buckets=BATCH_BUCKETS, registry=registry)
        self.batch_max = Gauge("mcprl_inference_decode_batch_size_max",
                               "Largest decode batch since start.", label, registry=registry)
        self.lora_loads = Counter("mcprl_inference_lora_loads", "LoRA adapters loaded.", label,
                                  registry=registry)
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", label,
            registry=registry)
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.", label,
            registry=registry)
        self.sleeping = Gauge("mcprl_inference_sleeping", "1 while the engine sleeps.", label,
                              registry=registry)
        self._max_batch = 0
        for metric in (self.running, self.waiting, self.prompt_tokens, self.generation_tokens,
                       self.batch_max, self.lora_loads, self.sleeping, self.batch, self.ttft,
                       self.e2e, self.prefix_queries, self.prefix_hits):
            metric.labels(model_name)

    def watch_lora(self, lora: Any) -> None:
        """Export the LoRA manager's residency (read at scrape time, nothing to keep in sync)."""

        self.registry.register(_LoraCollector(lora, self.model_name))

    def watch_engine(self, engine: Any) -> None:
        """Export the engine's own counters (``EngineStats``, CUDA-graph captures), read at
        scrape time: the scheduler thread keeps counting without touching Prometheus."""

        self.registry.register(_EngineStatsCollector(engine, self.model_name))

    def on_step(self, running: int, waiting: int, decode_batch: int) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)
        if decode_batch:
            self.batch.labels(self.model_name).observe(decode_batch)
            if decode_batch > self._max_batch:
                self._max_batch = decode_batch
                self.batch_max.labels(self.model_name).set(decode_batch)

    def on_request_done(self, output: RequestOutput, adapter: str | None) -> None:
        self.prompt_tokens.labels(self.model_name).inc(len(output.prompt_token_ids))
        self.prefix_queries.labels(self.model_name).inc(len(output.prompt_token_ids))
        self.prefix_hits.labels(self.model_name).inc(output.cached_tokens)
        self.generation_tokens.labels(self.model_name).inc(
            sum(len(o.token_ids) for o in output.outputs))
        self.ttft.labels(self.model_name).observe(output.time_to_first_token_s)
        self.e2e.labels(self.model_name).observe(output.latency_s)
        for o in output.outputs:
            self.success.labels(self.model_name, o.finish_reason).inc()


class _LoraCollector:
    """``max_loras`` residency of a :class:`~mcprl_inference.engine.lora.LoraManager`."""

    def __init__(self, lora: Any, model_name: str) -> None:
        self.lora, self.model_name = lora, model_name

    def collect(self):
        for name, doc, value in (
                ("mcprl_inference_lora_evictions", "Resident LoRA adapters evicted (LRU) to "
                 "make room under max_loras.", self.lora.evictions),
                ("mcprl_inference_lora_reloads", "Evicted LoRA adapters loaded again for a "
                 "request.", self.lora.reloads)):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
        for name, doc, value in (
                ("mcprl_inference_lora_registered", "LoRA adapters servable (listed).",
                 len(self.lora.adapters)),
                ("mcprl_inference_lora_resident", "LoRA adapters in memory (at most max_loras).",
                 self.lora.resident_count)):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family


class _EngineStatsCollector:
    """Where an :class:`~mcprl_inference.engine.LLMEngine`'s time goes, as counters.

    Prefill and decode seconds are host wall time of the scheduler's prefill batches and decode
    steps; whatever else a client waits for (HTTP, queueing, tokenising) is outside them. The
    device times (decode forward, sampling) are counted only with ``INFERENCE_PROFILE`` on
    CUDA and stay 0 otherwise; they are exported always so a dashboard or a benchmark need not
    care whether the engine profiles.
    """

    COUNTERS = (
        ("mcprl_inference_prefill_seconds", "Host wall time of prefill batches.",
         lambda e: e.stats.prefill_time_s),
        ("mcprl_inference_prefill_batches", "Prefill batches (requests admitted together).",
         lambda e: e.stats.prefill_batches),
        ("mcprl_inference_prefill_forwards", "Prefill forward passes: a batch runs its cold "
         "prompts in one, its cached starts' rests in one or more, and none for a prompt "
         "equal to another of the batch.", lambda e: e.stats.prefill_forwards),
        ("mcprl_inference_decode_seconds", "Host wall time of decode steps.",
         lambda e: e.stats.decode_time_s),
        ("mcprl_inference_decode_steps", "Decode steps (one token for every running sequence).",
         lambda e: e.stats.decode_steps),
        ("mcprl_inference_decode_tokens", "Tokens generated by decode steps.",
         lambda e: e.stats.decode_tokens),
        ("mcprl_inference_decode_ahead_steps", "Decode steps launched before the host read "
         "the step before (INFERENCE_ASYNC_SCHEDULING).", lambda e: e.stats.ahead_steps),
        ("mcprl_inference_decode_dropped_rows", "Rows of steps run ahead for sequences that "
         "had finished the step before (async scheduling's waste).",
         lambda e: e.stats.dropped_rows),
        ("mcprl_inference_cuda_graph_captures", "Decode steps captured in a CUDA graph (one "
         "per shape; a capture during serving costs a step's latency).",
         lambda e: e.runner.graph_captures),
        ("mcprl_inference_decode_forward_seconds", "Device time of decode forward passes "
         "(INFERENCE_PROFILE on CUDA only, else 0).", lambda e: e.stats.decode_forward_s),
        ("mcprl_inference_sample_seconds", "Device time of sampling after decode forwards "
         "(INFERENCE_PROFILE on CUDA only, else 0).", lambda e: e.stats.sample_s),
    )

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, doc, read in self.COUNTERS:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(read(self.engine)))
            yield family
