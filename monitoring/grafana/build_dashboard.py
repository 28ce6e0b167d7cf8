"""Write ``dashboards/mcp-rl.json``, the provisioned Grafana dashboard, from the table below.

    .venv/bin/python monitoring/grafana/build_dashboard.py

The JSON is committed (Grafana reads it as is); edit the panels here and rerun, so the
layout stays regular. tests/integration/test_dashboard_metrics.py checks that every metric
a query names is exported by the running services.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "dashboards" / "mcp-rl.json"
DS = {"type": "prometheus", "uid": "prometheus"}
RATE = "[$__rate_interval]"

# (title, panels); a panel is (title, unit, kind, [(expr, legend), ...], description)
Panel = tuple[str, str, str, list[tuple[str, str]], str]
ROWS: list[tuple[str, list[Panel]]] = [
    ("Training", [
        ("Step", "none", "stat", [("max(mcprl_trainer_step)", "step")],
         "Last completed GRPO step."),
        ("Reward (mean, std)", "none", "timeseries", [
            ("mcprl_trainer_reward_mean", "mean"), ("mcprl_trainer_reward_std", "std")],
         "Reward of the last step's rollouts (judge score in [0, 1])."),
        ("Success rate", "percentunit", "timeseries", [
            ("mcprl_trainer_success_rate", "train rollouts"),
            ("mcprl_trainer_eval_success_rate", "eval (val split)")],
         "Share of rollouts judged successful; eval uses the verifiable answer where known."),
        ("Loss", "none", "timeseries", [("mcprl_trainer_loss", "policy loss")],
         "GRPO policy loss of the last update."),
        ("KL to the reference", "none", "timeseries", [("mcprl_trainer_kl", "KL (k3)")],
         "KL(policy || reference: the warm start, else the base) per trained token; 0 when "
         "the KL term is off."),
        ("Clip fraction", "percentunit", "timeseries", [
            ("mcprl_trainer_clip_fraction", "clipped tokens")],
         "Share of trained tokens whose importance ratio was clipped."),
        ("Step time by phase", "s", "bars", [
            ("sum by (phase) (mcprl_trainer_phase_seconds)", "{{phase}}")],
         "Seconds of the last step spent in rollout, judge, train and publish."),
        ("Overlap: rollout wait and idle share", "none", "timeseries", [
            ("mcprl_trainer_rollout_wait_seconds", "rollout wait (s)"),
            ("mcprl_trainer_update_idle_ratio", "update idle share"),
            ("mcprl_trainer_policy_staleness_steps", "staleness (steps)")],
         "Seconds the update loop waited for the last step's rollouts, the share of the step "
         "it was not updating, and how many updates the batch's policy lagged "
         "(train.max_staleness: 0 when synchronous, 1 when overlapped)."),
        ("Throughput", "short", "timeseries", [
            ("mcprl_trainer_rollout_tokens_per_second", "rollout tokens/s"),
            ("mcprl_trainer_train_tokens_per_second", "train tokens/s")],
         "Sampled tokens per second while rolling out; trained tokens per second."),
    ]),
    ("Rollouts", [
        ("Tool calls by tool", "reqps", "timeseries", [
            (f"sum by (tool) (rate(mcprl_mcp_tool_calls_total{RATE}))", "{{tool}}")],
         "Tool calls the MCP server answers (rollouts, scenario generation)."),
        ("Tool errors by tool", "reqps", "timeseries", [
            (f'sum by (tool, outcome) (rate(mcprl_mcp_tool_calls_total{{outcome!~"ok|truncated"}}'
             f"{RATE}))", "{{tool}} {{outcome}}")],
         "Failed tool calls as the MCP server saw them (error, refused, timeout)."),
        ("Agent tool errors by kind", "short", "timeseries", [
            (f"sum by (kind) (increase(mcprl_trainer_tool_errors_total{RATE}))", "{{kind}}")],
         "Tool errors the agent made (malformed call, unknown tool, tool error ...)."),
        ("Turns per rollout", "none", "timeseries", [("mcprl_trainer_turns_mean", "mean turns")],
         "Mean model turns per rollout of the last step."),
        ("Rollout latency", "s", "timeseries", [
            (f"histogram_quantile(0.5, sum by (le) "
             f"(rate(mcprl_trainer_rollout_duration_seconds_bucket{RATE})))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) "
             f"(rate(mcprl_trainer_rollout_duration_seconds_bucket{RATE})))", "p99")],
         "Wall time of one rollout (all its turns and tool calls)."),
        ("Rollouts by finish reason", "short", "timeseries", [
            (f"sum by (finish_reason) (increase(mcprl_trainer_rollouts_total{RATE}))",
             "{{finish_reason}}")],
         "completed, max_turns, context_exhausted, no_tool_call, error."),
    ]),
    ("MCP server", [
        ("Tool calls/s", "reqps", "timeseries", [
            (f"sum by (job) (rate(mcprl_mcp_tool_calls_total{RATE}))", "{{job}}")],
         "All tool calls per second, per MCP server."),
        ("Tool call latency p99", "s", "timeseries", [
            (f"histogram_quantile(0.99, sum by (le, tool) "
             f"(rate(mcprl_mcp_tool_call_duration_seconds_bucket{RATE})))", "{{tool}}")],
         "99th percentile of tool call duration by tool."),
        ("Errors/s by outcome", "reqps", "timeseries", [
            (f'sum by (outcome) (rate(mcprl_mcp_tool_calls_total{{outcome!="ok"}}{RATE}))',
             "{{outcome}}")],
         "Calls that did not end ok: truncated, error, refused (read-only guard), timeout."),
        ("Active sessions", "none", "timeseries", [
            ("sum by (job) (mcprl_mcp_active_sessions)", "{{job}}")],
         "Open MCP sessions (Streamable HTTP + SSE)."),
        ("Rows returned/s", "short", "timeseries", [
            (f"sum(rate(mcprl_mcp_rows_returned_total{RATE}))", "rows/s")],
         "Rows run_query handed back."),
        ("Queries stopped by the time limit", "short", "timeseries", [
            (f"sum(increase(mcprl_mcp_queries_timed_out_total{RATE}))", "timed out")],
         "Runaway queries stopped at MCP_QUERY_TIMEOUT_S."),
    ]),
    ("Judge", [
        ("Requests/s by outcome", "reqps", "timeseries", [
            (f"sum by (outcome) (rate(mcprl_judge_requests_total{RATE}))", "{{outcome}}")],
         "Score-group requests."),
        ("Latency", "s", "timeseries", [
            (f"histogram_quantile(0.5, sum by (le) "
             f"(rate(mcprl_judge_request_duration_seconds_bucket{RATE})))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) "
             f"(rate(mcprl_judge_request_duration_seconds_bucket{RATE})))", "p99")],
         "Time to score one group (cache hits included)."),
        ("Upstream tokens/s", "short", "timeseries", [
            (f"sum by (type) (rate(mcprl_judge_upstream_tokens_total{RATE}))", "{{type}}")],
         "Tokens the judge model used."),
        ("Cache hit rate", "percentunit", "timeseries", [
            (f"sum(rate(mcprl_judge_cache_hits_total{RATE})) / "
             f"clamp_min(sum(rate(mcprl_judge_cache_hits_total{RATE})) + "
             f"sum(rate(mcprl_judge_cache_misses_total{RATE})), 1e-9)", "hit rate")],
         "Groups answered from the content-hash cache."),
        ("Cost", "currencyUSD", "stat", [
            ("sum(mcprl_judge_cost_usd_total)", "total"),
            ("sum(increase(mcprl_judge_cost_usd_total[1h]))", "last hour")],
         "Judge-model cost (provider-reported or JUDGE_COST_PER_*_TOKEN_USD)."),
        ("Failures by kind", "short", "timeseries", [
            (f"sum by (kind) (increase(mcprl_judge_failures_total{RATE}))", "{{kind}}")],
         "Upstream unavailable, invalid output, wrong score count ... (retried)."),
        ("Scores", "none", "timeseries", [
            (f"sum(rate(mcprl_judge_score_sum{RATE})) / "
             f"clamp_min(sum(rate(mcprl_judge_score_count{RATE})), 1e-9)", "mean"),
            (f"histogram_quantile(0.5, sum by (le) (rate(mcprl_judge_score_bucket{RATE})))",
             "median")],
         "Distribution of the scores handed out."),
    ]),
    ("Inference (vLLM metric names)", [
        ("Requests running / waiting", "none", "timeseries", [
            ("sum(vllm:num_requests_running)", "running"),
            ("sum(vllm:num_requests_waiting)", "waiting")],
         "Sequences decoding now and requests queued."),
        ("Tokens/s", "short", "timeseries", [
            (f"sum(rate(vllm:generation_tokens_total{RATE}))", "generated"),
            (f"sum(rate(vllm:prompt_tokens_total{RATE}))", "prompt")],
         "Generated and prefilled tokens per second."),
        ("Time to first token", "s", "timeseries", [
            (f"histogram_quantile(0.5, sum by (le) "
             f"(rate(vllm:time_to_first_token_seconds_bucket{RATE})))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) "
             f"(rate(vllm:time_to_first_token_seconds_bucket{RATE})))", "p99")],
         "From arrival to the first generated token."),
        ("End-to-end latency", "s", "timeseries", [
            (f"histogram_quantile(0.5, sum by (le) "
             f"(rate(vllm:e2e_request_latency_seconds_bucket{RATE})))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) "
             f"(rate(vllm:e2e_request_latency_seconds_bucket{RATE})))", "p99")],
         "From arrival to the last generated token."),
        ("Finished requests by reason", "reqps", "timeseries", [
            (f"sum by (finished_reason) (rate(vllm:request_success_total{RATE}))",
             "{{finished_reason}}")],
         "stop, length, abort ..."),
        ("KV cache usage (vLLM only)", "percentunit", "timeseries", [
            ("max(vllm:kv_cache_usage_perc)", "KV cache")],
         "vLLM's KV-cache occupancy; our CPU engine does not export it."),
        ("Engine busy: prefill vs decode (ours only)", "percentunit", "timeseries", [
            (f"sum(rate(mcprl_inference_prefill_seconds_total{RATE}))", "prefill"),
            (f"sum(rate(mcprl_inference_decode_seconds_total{RATE}))", "decode")],
         "Share of wall time our engine spends prefilling and decoding (seconds per second); "
         "the rest is idle, HTTP and scheduling."),
    ]),
    ("Services", [
        ("Targets up", "none", "stat", [("up", "{{job}}")],
         "1 when Prometheus can scrape the service."),
        ("HTTP requests/s", "reqps", "timeseries", [
            (f"sum by (service, status) (rate(mcprl_http_requests_total{RATE}))",
             "{{service}} {{status}}")],
         "Requests served by our FastAPI services, by status code."),
        ("HTTP latency p99", "s", "timeseries", [
            (f"histogram_quantile(0.99, sum by (le, service) "
             f"(rate(mcprl_http_request_duration_seconds_bucket{RATE})))", "{{service}}")],
         "99th percentile until the response started."),
    ]),
]


def _panel(pid: int, title: str, unit: str, kind: str, targets: list[tuple[str, str]],
           description: str, x: int, y: int) -> dict[str, Any]:
    panel: dict[str, Any] = {
        "id": pid,
        "title": title,
        "description": description,
        "type": "stat" if kind == "stat" else "timeseries",
        "datasource": DS,
        "gridPos": {"h": 7, "w": 8, "x": x, "y": y},
        "targets": [{"datasource": DS, "expr": expr, "legendFormat": legend,
                     "refId": chr(ord("A") + i)} for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi"}},
    }
    if kind == "bars":
        panel["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "bars", "fillOpacity": 80,
                                                      "stacking": {"mode": "normal"}}
    if kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value",
                            "graphMode": "area"}
    return panel


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid += 1
        y += 1
        for i, (title, unit, kind, targets, description) in enumerate(row_panels):
            panels.append(_panel(pid, title, unit, kind, targets, description,
                                 x=(i % 3) * 8, y=y + (i // 3) * 7))
            pid += 1
        y += ((len(row_panels) + 2) // 3) * 7
    return {
        "uid": "mcp-rl",
        "title": "mcp-rl",
        "description": "Training, rollouts, MCP server, judge and inference of an mcp-rl stack.",
        "tags": ["mcp-rl"],
        "timezone": "browser",
        "editable": False,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": panels,
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(build(), indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
