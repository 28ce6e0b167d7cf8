"""The judge's Prometheus metrics, built on the app's own registry (none at import time)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mcprl_common.metrics import LATENCY_BUCKETS_S

SCORE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class JudgeMetrics:
    """Requests, latency, upstream tokens and cost, cache hits, failures and scores."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "mcprl_judge_requests", "Score-group requests by outcome (ok, bad_request, "
            "upstream_unavailable, upstream_error, error).", ["outcome"], registry=registry)
        self.duration = Histogram(
            "mcprl_judge_request_duration_seconds", "Time to score one group.",
            registry=registry, buckets=LATENCY_BUCKETS_S)
        self.upstream_tokens = Counter(
            "mcprl_judge_upstream_tokens", "Tokens the judge model used, by type "
            "(prompt, completion).", ["type"], registry=registry)
        self.upstream_requests = Counter(
            "mcprl_judge_upstream_requests", "Calls to the judge model by result (ok, "
            "retryable status, connection error, rejected).", ["result"], registry=registry)
        self.upstream_duration = Histogram(
            "mcprl_judge_upstream_request_duration_seconds", "Latency of one judge-model call.",
            registry=registry, buckets=LATENCY_BUCKETS_S)
        self.upstream_inflight = Gauge(
            "mcprl_judge_upstream_inflight_requests", "Judge-model calls in flight now.",
            registry=registry)
        self.cache_hits = Counter(
            "mcprl_judge_cache_hits", "Groups whose judgement came from the cache.",
            registry=registry)
        self.cache_misses = Counter(
            "mcprl_judge_cache_misses", "Groups the judge model had to score.", registry=registry)
        self.failures = Counter(
            "mcprl_judge_failures", "Failed attempts by kind (upstream_unavailable, "
            "upstream_status, upstream_rejected, invalid_output, wrong_score_count, "
            "structured_output_unsupported, cache).", ["kind"], registry=registry)
        self.score = Histogram(
            "mcprl_judge_score", "Final scores handed out.", registry=registry,
            buckets=SCORE_BUCKETS)
        self.cost = Counter(
            "mcprl_judge_cost_usd", "Cost of judge-model calls in US dollars.", registry=registry)
