"""Prometheus metrics of scenario-gen, on a registry per app (tests build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mcprl_common.metrics import new_registry

DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                      3600.0)


class GenMetrics:
    """The counters the issue asks for, plus jobs in flight."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.scenarios = Counter("mcprl_scenario_gen_scenarios",
                                 "Scenarios written to stored sets, by strategy.",
                                 ["strategy"], registry=r)
        self.llm_calls = Counter("mcprl_scenario_gen_llm_calls",
                                 "Generator LLM calls by outcome (ok, invalid, unsupported, "
                                 "error).", ["outcome"], registry=r)
        self.llm_tokens = Counter("mcprl_scenario_gen_llm_tokens",
                                  "Generator LLM tokens by type (prompt, completion).",
                                  ["type"], registry=r)
        self.failures = Counter("mcprl_scenario_gen_failures",
                                "Generations that failed, by kind.", ["kind"], registry=r)
        self.duration = Histogram("mcprl_scenario_gen_duration_seconds",
                                  "Wall time of a generation, by strategy and final status.",
                                  ["strategy", "status"], registry=r,
                                  buckets=DURATION_BUCKETS_S)
        self.jobs = Gauge("mcprl_scenario_gen_jobs", "Generations by state (queued, running).",
                          ["state"], registry=r)
        for outcome in ("ok", "invalid", "unsupported", "error"):
            self.llm_calls.labels(outcome)
        for kind in ("prompt", "completion"):
            self.llm_tokens.labels(kind)
