"""The trainer's Prometheus metrics (one registry per run, so tests can build many).

Names: ``mcprl_trainer_*``, base units, ``_total`` on counters. Gauges hold the last step's
figures; histograms and counters accumulate over the run.
"""

from __future__ import annotations

from collections import Counter as PyCounter
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from mcprl_common.metrics import LATENCY_BUCKETS_S, new_registry
from mcprl_common.wire import FinishReason

ROLLOUT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# Step metric key -> (gauge name, help)
STEP_GAUGES: dict[str, tuple[str, str]] = {
    "reward_mean": ("mcprl_trainer_reward_mean", "Mean reward of the last step's rollouts."),
    "reward_std": ("mcprl_trainer_reward_std", "Std of the last step's rewards."),
    "success_rate": ("mcprl_trainer_success_rate", "Success rate of the last step's rollouts."),
    "adv_mean": ("mcprl_trainer_advantage_mean", "Mean advantage of trained rollouts."),
    "adv_std": ("mcprl_trainer_advantage_std", "Std of advantages of trained rollouts."),
    "adv_abs_mean": ("mcprl_trainer_advantage_abs_mean", "Mean |advantage| of trained rollouts."),
    "loss": ("mcprl_trainer_loss", "Policy loss of the last update."),
    "kl": ("mcprl_trainer_kl", "KL(policy || reference) per trained token (k3), last update."),
    "clip_fraction": ("mcprl_trainer_clip_fraction", "Fraction of trained tokens clipped."),
    "grad_norm": ("mcprl_trainer_grad_norm", "Gradient L2 norm before clipping."),
    "logprob_diff_abs": ("mcprl_trainer_logprob_mismatch",
                         "Mean |trainer - sampler| log-prob per trained token."),
    "rollout_tokens_per_s": ("mcprl_trainer_rollout_tokens_per_second",
                             "Sampled tokens per second of rollout phase."),
    "train_tokens_per_s": ("mcprl_trainer_train_tokens_per_second",
                           "Tokens (forward+backward) per second of the update."),
    "mean_turns": ("mcprl_trainer_turns_mean", "Mean turns per rollout, last step."),
    "lr": ("mcprl_trainer_learning_rate", "Learning rate of the last update."),
    # What shows rollouts overlapped with the update (train.max_staleness, overlap.py):
    "rollout_wait_seconds": ("mcprl_trainer_rollout_wait_seconds",
                             "Seconds the update loop waited for the last step's rollouts "
                             "(their whole collection when synchronous)."),
    "staleness": ("mcprl_trainer_policy_staleness_steps",
                  "Updates between the policy that sampled the last step's batch and the "
                  "weights it trained (0 = on-policy)."),
    "update_idle_share": ("mcprl_trainer_update_idle_ratio",
                          "Share of the last step's wall time the update loop was not "
                          "updating (waiting for rollouts, checkpoint, publish)."),
}

ADAPTER_SOURCES = ("publish_dir", "checkpoint")  # where an engine loaded an adapter from
STEP_PHASES = ("rollout", "judge", "train", "checkpoint", "publish")
# The kinds of an agent's tool error (mcp_tools.ToolResult.error_kind, and malformed calls).
TOOL_ERROR_KINDS = ("tool_error", "unknown_tool", "bad_arguments", "timeout", "protocol",
                    "malformed")


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or new_registry()
        r = self.registry
        self.step = Gauge("mcprl_trainer_step", "Last completed training step.", registry=r)
        self.total_steps = Gauge("mcprl_trainer_steps_planned", "Steps the run plans.",
                                 registry=r)
        self.gauges = {key: Gauge(name, doc, registry=r) for key, (name, doc) in
                       STEP_GAUGES.items()}
        self.eval_success = Gauge("mcprl_trainer_eval_success_rate",
                                  "Success rate of the last eval (val split).", registry=r)
        self.eval_reward = Gauge("mcprl_trainer_eval_reward_mean",
                                 "Mean reward of the last eval.", registry=r)
        self.phase_seconds = Gauge("mcprl_trainer_phase_seconds",
                                   "Seconds of the last step's phases.", ["phase"], registry=r)
        for phase in STEP_PHASES:  # exported from the first scrape, as the unlabelled gauges:
            self.phase_seconds.labels(phase)  # a run that ends between scrapes still has them
        self.rollout_latency = Histogram("mcprl_trainer_rollout_duration_seconds",
                                         "Wall time of one rollout.", registry=r,
                                         buckets=ROLLOUT_BUCKETS_S)
        self.turn_latency = Histogram("mcprl_trainer_turn_sample_duration_seconds",
                                      "Engine time of one sampled turn.", registry=r,
                                      buckets=LATENCY_BUCKETS_S)
        self.rollouts = Counter("mcprl_trainer_rollouts", "Rollouts finished, by finish reason.",
                                ["finish_reason"], registry=r)
        for reason in get_args(FinishReason):  # 0 from the first scrape: a short run that
            self.rollouts.labels(reason)  # ends between scrapes still has a rate of them
        self.tool_errors = Counter("mcprl_trainer_tool_errors",
                                   "Tool errors the agent made, by kind.", ["kind"], registry=r)
        for kind in TOOL_ERROR_KINDS:  # 0 from the first scrape, so rates exist at 0 errors
            self.tool_errors.labels(kind)
        self.groups_skipped = Counter("mcprl_trainer_groups_skipped",
                                      "Groups not trained on, by reason.", ["reason"], registry=r)
        self.rollouts_retried = Counter(
            "mcprl_trainer_rollouts_retried", "Rollouts cut by a failing service and started "
            "again from scratch (never trained on half-made), by service.", ["service"],
            registry=r)
        self.rollouts_dropped = Counter(
            "mcprl_trainer_rollouts_dropped", "Rollouts given up after the retry window (their "
            "group is not trained on), by service.", ["service"], registry=r)
        self.service_retries = Counter(
            "mcprl_trainer_service_retries", "Judge calls, adapter loads and scenario fetches "
            "retried while a service was down, by service.", ["service"], registry=r)
        self.adapter_republished = Counter(
            "mcprl_trainer_adapter_republished", "Adapters loaded again into an engine that had "
            "lost them (it restarted).", registry=r)
        self.adapter_loads = Counter(
            "mcprl_trainer_adapter_loads", "Adapters loaded into an engine replica, by the "
            "copy it read: publish_dir (the tmpfs folder, trainer and engine on one host) or "
            "checkpoint (the run's checkpoint folder).", ["source"], registry=r)
        for source in ADAPTER_SOURCES:  # 0 from the first scrape: which path is in use shows
            self.adapter_loads.labels(source)
        self.adapter_load_fallbacks = Counter(
            "mcprl_trainer_adapter_load_fallbacks", "Loads from the publish dir that an engine "
            "replica answered 404 to (it cannot see the folder), done from the checkpoint "
            "instead.", registry=r)
        self.stale_batches = Counter(
            "mcprl_trainer_stale_batches", "Step batches older than train.max_staleness "
            "updates, dropped and collected again (never trained on).", registry=r)
        self.tokens = Counter("mcprl_trainer_tokens", "Tokens processed, by kind.", ["kind"],
                              registry=r)
        self.checkpoint_write = Histogram(
            "mcprl_trainer_checkpoint_write_duration_seconds", "Wall time of one checkpoint's "
            "background write (optimizer, RNG, state.json; background_checkpoints), off the "
            "step's critical path.", registry=r, buckets=LATENCY_BUCKETS_S)
        self.gpu_memory = Gauge("mcprl_trainer_gpu_memory_bytes",
                                "Peak GPU memory allocated by the trainer in the last step.",
                                registry=r)

    def watch_engines(self, pool) -> None:
        """Per engine replica: up or left out, open requests, requests sent."""

        self.registry.register(_EngineCollector(pool))

    def observe_rollout(self, seconds: float, finish_reason: str, tool_errors: PyCounter,
                        turn_seconds: list[float]) -> None:
        self.rollout_latency.observe(seconds)
        self.rollouts.labels(finish_reason).inc()
        for kind, n in tool_errors.items():
            self.tool_errors.labels(kind).inc(n)
        for s in turn_seconds:
            self.turn_latency.observe(s)

    def observe_recovery(self, event: str, service: str) -> None:
        """One retry or drop reported by the rollout loop (see ``GroupRunner``)."""

        if event == "rollout_retried":
            self.rollouts_retried.labels(service).inc()
        elif event == "rollout_dropped":
            self.rollouts_dropped.labels(service).inc()
        else:
            self.service_retries.labels(service).inc()

    def observe_step(self, step: int, metrics: dict[str, float]) -> None:
        self.step.set(step)
        for key, gauge in self.gauges.items():
            if key in metrics:
                gauge.set(metrics[key])
        for phase in STEP_PHASES:
            key = f"{phase}_seconds"
            if key in metrics:
                self.phase_seconds.labels(phase).set(metrics[key])
        self.groups_skipped.labels("zero_variance").inc(metrics.get("groups_zero_variance", 0))
        self.groups_skipped.labels("failed").inc(metrics.get("groups_failed", 0))
        self.stale_batches.inc(metrics.get("stale_batches_dropped", 0))
        self.tokens.labels("sampled").inc(metrics.get("sampled_tokens", 0))
        self.tokens.labels("trained").inc(metrics.get("train_tokens", 0))
        if "gpu_memory_bytes" in metrics:
            self.gpu_memory.set(metrics["gpu_memory_bytes"])

    def observe_checkpoint_write(self, step: int, seconds: float) -> None:
        """Called from the checkpoint writer's thread when a write is on disk."""

        self.checkpoint_write.observe(seconds)

    def observe_eval(self, success_rate: float, mean_reward: float) -> None:
        self.eval_success.set(success_rate)
        self.eval_reward.set(mean_reward)


class _EngineCollector:
    """Reads an :class:`~mcprl_trainer.engines.EnginePool` at scrape time."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily("mcprl_trainer_engine_replica_up", "1 while the engine replica "
                               "takes rollouts, 0 while it is left out after a failure.",
                               labels=["replica"])
        open_ = GaugeMetricFamily("mcprl_trainer_engine_open_requests",
                                  "Completion requests in flight, per engine replica.",
                                  labels=["replica"])
        sent = CounterMetricFamily("mcprl_trainer_engine_requests", "Completion requests sent, "
                                   "per engine replica.", labels=["replica"])
        for r in self.pool.replicas:
            up.add_metric([r.url], 1.0 if self.pool.is_up(r) else 0.0)
            open_.add_metric([r.url], float(r.open_requests))
            sent.add_metric([r.url], float(r.requests))
        yield from (up, open_, sent)
